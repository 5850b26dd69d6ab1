"""Where trials can run: GPU slots counted per node, and impossible placements refused, with the numbers, before
anything starts. The nodes are described as Ray's ``ray.nodes()`` describes them."""

from __future__ import annotations

import socket

import pytest

from ablations.cluster import DoesNotFit
from ablations.sweep.placement import check_placement, trial_slots
from record.spec import Resources, SpecError, load_study

HERE = socket.gethostname()


def node(cpus: float, gpus: float = 0, host: str = HERE) -> dict:
    return {"Alive": True, "NodeManagerHostname": host, "Resources": {"CPU": cpus, "GPU": gpus}}


LOCAL = {"the MLflow store": "sqlite:////tmp/x/mlflow.db", "the claims store": "sqlite:////tmp/x/claims.db"}


@pytest.mark.parametrize(
    ("resources", "nodes", "slots"),
    [
        (Resources(cpus=1), [node(8)], 8),
        (Resources(cpus=2, gpus=0.25), [node(16, 2)], 8),  # fractional GPUs: floor(2 / 0.25)
        (Resources(cpus=4, gpus=0.25), [node(16, 2)], 4),  # ... unless the CPUs run out first
        (Resources(cpus=1, gpus=1), [node(8, 2), node(8, 1)], 3),  # counted per node, then summed
        (Resources(cpus=2, gpus=2, workers=2), [node(8, 2), node(8, 2)], 2),  # a DDP trial needs all its workers
    ],
)
def test_slots_count_gpus_as_well_as_cpus(resources, nodes, slots):
    assert trial_slots(resources, nodes=nodes) == slots


def test_more_gpus_than_any_node_has_is_refused_with_the_numbers():
    with pytest.raises(DoesNotFit, match=r"each trial needs 2 GPU.*GPUs per node: 1, 1"):
        check_placement(Resources(gpus=2), {}, nodes=[node(8, 1), node(8, 1)])
    with pytest.raises(DoesNotFit, match=r"each of its 2 workers needs 2 GPU"):
        check_placement(Resources(cpus=2, gpus=4, workers=2), {}, nodes=[node(8, 1)])
    check_placement(Resources(gpus=1), {}, nodes=[node(8, 1)])  # fits


def test_stores_only_this_machine_reaches_are_refused_on_a_cluster_of_several_machines():
    check_placement(Resources(), LOCAL, nodes=[node(2), node(2)])  # two nodes, one machine: files are shared
    with pytest.raises(DoesNotFit, match=r"spans 2 machines.*the MLflow store.*the claims store"):
        check_placement(Resources(), LOCAL, nodes=[node(2), node(2, host="other-machine")])
    with pytest.raises(DoesNotFit, match=r"Ray Train's storage /home/me/.ablate/ray_results"):
        check_placement(
            Resources(cpus=2, workers=2),
            {"Ray Train's storage": "/home/me/.ablate/ray_results"},
            nodes=[node(2), node(2, host="other-machine")],
        )
    shared = {"the MLflow store": "http://mlflow:5000", "the claims store": "postgresql://ablate@db/claims"}
    check_placement(Resources(), shared, nodes=[node(2), node(2, host="other-machine")])
    # a tunnel's end (`ssh -L 5000:...` then --tracking-uri http://127.0.0.1:5000): on a worker, 127.0.0.1 is the
    # worker, and its trials would find no MLflow there
    tunnel = {"the MLflow store": "http://127.0.0.1:5000", "the claims store": "postgresql://ablate:pw@localhost/c"}
    with pytest.raises(DoesNotFit) as info:
        check_placement(Resources(), tunnel, nodes=[node(2, host="head"), node(2, host="other-machine")])
    said = str(info.value)
    loopback = "(a loopback address reaches this machine only (a tunnel's end): name it as every node reaches it)"
    assert f"the MLflow store http://127.0.0.1:5000 {loopback}" in said and "pw" not in said
    assert f"the claims store postgresql://ablate:***@localhost/c {loopback}" in said
    socket_only = {"the claims store": "postgresql://ablate@/claims?host=/var/run/postgresql"}  # a Unix socket
    with pytest.raises(DoesNotFit, match="the claims store postgresql://ablate@/claims"):
        check_placement(Resources(), socket_only, nodes=[node(2, host="head"), node(2, host="other-machine")])
    check_placement(Resources(), {"the claims store": "postgresql://ablate@/claims?host=db.internal"},
                    nodes=[node(2, host="head"), node(2, host="other-machine")])  # fmt: skip
    for hosted in ("databricks", "databricks-uc", "databricks://profile"):  # MLflow's hosted services: no "://" needed
        check_placement(Resources(), {"the MLflow store": hosted}, nodes=[node(2, host="head"), node(2, host="other")])


def test_data_parallel_ranks_never_share_a_gpu_unless_asked(tmp_path):
    with pytest.raises(ValueError, match="ranks would share a GPU"):
        Resources(cpus=2, gpus=1, workers=2)
    assert Resources(cpus=2, gpus=1, workers=2, share_gpus=True).per_worker_gpus == 0.5
    assert Resources(cpus=2, gpus=2, workers=2).per_worker_gpus == 1
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: s\nbase: {task: {name: copy}}\ndesign: {grid: {model.norm: [pre]}}\n"
        "resources: {cpus: 2, gpus: 1, workers: 2}\n"
    )
    with pytest.raises(SpecError, match=r"s.yaml:4: resources.gpus: .*ranks would share a GPU"):
        load_study(path)


def test_a_data_parallel_trial_is_refused_when_the_cluster_cannot_place_all_its_workers_at_once():
    """Its workers start together, on any nodes: four workers of one GPU each on two nodes of one GPU would wait for
    ever. The refusal names what each worker needs and what each node holds."""
    two_gpus = [node(8, 1), node(8, 1, host="other")]
    with pytest.raises(DoesNotFit) as info:
        check_placement(Resources(cpus=8, gpus=4, workers=4), {}, nodes=two_gpus)
    said = str(info.value)
    assert "4 data-parallel workers each need 2 CPU, 1 GPU" in said and "holds 2 such worker(s)" in said
    assert "per node: 8 CPU, 1 GPU: 1; 8 CPU, 1 GPU: 1" in said and "lower resources.workers to 2" in said
    check_placement(Resources(cpus=4, gpus=2, workers=2), {}, nodes=two_gpus)  # one worker on each node
    with pytest.raises(DoesNotFit, match=r"3 data-parallel workers each need 2 CPU .*holds 2 such"):
        check_placement(Resources(cpus=6, workers=3), {}, nodes=[node(4)])


def test_workers_communicate_through_nccl_on_gpus_of_their_own_and_gloo_otherwise():
    """Ray Train, left to choose, takes NCCL whenever GPUs are asked for, and NCCL refuses two ranks on one GPU."""
    from ablations.parallel import backend

    assert backend(Resources(cpus=2, gpus=2, workers=2)) == "nccl"
    assert backend(Resources(cpus=4, gpus=4, workers=2)) == "nccl"
    assert backend(Resources(cpus=2, workers=2)) == "gloo"
    assert backend(Resources(cpus=2, gpus=1, workers=2, share_gpus=True)) == "gloo"
