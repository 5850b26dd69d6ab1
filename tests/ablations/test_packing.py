"""Cells packed onto a GPU (ablations/packing.py): the calibration step's memory against its closed form, the refusal
and the fraction it suggests, the dry run's lines, and the refusal before anything is recorded on a real Ray whose
head declares a GPU that this machine does not have (what CI can show of the placement; benchmarks/packing.py's
smoke run, in tests/test_benchmarks.py, trains a packed study on such a cluster)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow import MlflowClient

from ablations.cluster import DoesNotFit
from ablations.packing import (
    Calibration,
    GpuMemory,
    cells_per_gpu,
    check_memory,
    packing_lines,
    step_memory_mb,
)
from record.spec import Resources, SpecError, load_study
from record.spec.run import resolve_run
from tests.conftest import ROOT
from tests.ray_nodes import ray_cluster

TINY = {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64}
REVERSE = {"name": "reverse", "train_size": 200, "max_len": 8}


def study_file(tmp_path: Path, resources: dict, name: str = "packed") -> Path:
    data = {
        "name": name,
        "base": {"task": REVERSE, "model": TINY, "training": {"max_steps": 5, "batch_size": 8}},
        "design": {"grid": {"model.norm": ["pre", "post"]}},
        "seeds": 1,
        "resources": {"cpus": 1, **resources},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_cells_per_gpu_is_the_whole_number_of_fractions_a_gpu_holds():
    assert cells_per_gpu(Resources(gpus=0.125)) == 8
    assert cells_per_gpu(Resources(gpus=1 / 3)) == 3  # 1 / (1/3) is 2.9999... in floating point
    assert cells_per_gpu(Resources(gpus=0.3)) == 3
    assert cells_per_gpu(Resources(gpus=1)) is None and cells_per_gpu(Resources()) is None


@settings(max_examples=300, deadline=None)
@given(
    cell=st.floats(1, 50_000),
    memory=st.floats(100, 200_000),
    per_gpu=st.integers(1, 64),
)
def test_a_refusal_suggests_a_fraction_that_fits_and_packs_as_many_as_fit(cell, memory, per_gpu):
    """Refused exactly when the cells at once need more than a GPU holds; the fraction it suggests then passes the
    same check and packs floor(memory / cell) cells, the most that fit."""
    r = Resources(gpus=1 / per_gpu)
    calibration = Calibration(step_mb=cell, context_mb=0.0, device="cpu", variant="v")
    gpu = GpuMemory(memory, "declared")
    n = cells_per_gpu(r) or 1
    try:
        check_memory(r, calibration, gpu)
    except DoesNotFit as err:
        assert n * cell > memory
        fit = math.floor(memory / cell)
        if fit == 0:
            assert "not even one fits" in str(err)
            return
        assert f"at most {fit} fit" in str(err)
        suggested = float(str(err).split("set resources.gpus to ")[1].split(" ")[0])
        assert (cells_per_gpu(Resources(gpus=suggested)) or 1) == fit
        check_memory(Resources(gpus=suggested), calibration, gpu)  # fits
    else:
        assert n * cell <= memory


def test_gpu_memory_without_a_gpu_is_refused_naming_the_key(tmp_path):
    with pytest.raises(SpecError, match="gpu_memory_gb") as err:
        load_study(study_file(tmp_path, {"gpu_memory_gb": 80}))
    assert "resources.gpus is 0" in str(err.value)


def test_a_calibration_step_holds_at_least_the_parameters_their_gradients_and_adams_two_moments(tmp_path):
    """AdamW keeps two moments per parameter: parameters, gradients and moments are 4 x 4 bytes per parameter (fp32),
    a floor the step's tensor bytes must reach; activations come on top and grow with the batch and the length."""
    import torch

    from models.transformer import Transformer

    run = resolve_run(
        {
            "task": {**REVERSE, "max_len": 8},
            "model": {**TINY, "d_model": 64, "d_ff": 256},
            "training": {"batch_size": 8},
        }
    )
    n = Transformer(run.model).num_parameters()
    small = step_memory_mb(run, torch.device("cpu"))
    assert small * 2**20 >= 16 * n
    bigger = resolve_run(
        {
            "task": {**REVERSE, "max_len": 8},
            "model": {**TINY, "d_model": 64, "d_ff": 256},
            "training": {"batch_size": 64},
        }
    )
    longer = resolve_run(
        {
            "task": {**REVERSE, "max_len": 32},
            "model": {**TINY, "d_model": 64, "d_ff": 256},
            "training": {"batch_size": 8},
        }
    )
    assert step_memory_mb(bigger, torch.device("cpu")) > small
    assert step_memory_mb(longer, torch.device("cpu")) > small  # the longest examples make the batch


def test_the_dry_run_says_cells_per_gpu_and_memory_and_refuses_what_does_not_fit(tmp_path, capsys):
    from ablate.main import main

    def dry_run(resources: dict) -> tuple[int, str, str]:
        path = study_file(tmp_path, resources)
        code = main(["sweep", str(path), "--dry-run", "--tracking-uri", f"sqlite:///{tmp_path}/none.db"])
        said = capsys.readouterr()
        return code, said.out, said.err

    code, out, err = dry_run({"gpus": 0.25, "gpu_memory_gb": 64})
    assert code == 0, out + err
    assert "packing: 4 cell(s) at once per GPU (resources.gpus 0.25)" in out
    assert "of a GPU's 64.00 GiB (declared (resources.gpu_memory_gb)): fits" in out
    code, out, err = dry_run({"gpus": 0.25, "gpu_memory_gb": 1.5})  # 4 x about 810 MiB
    assert code == 1 and "does not fit" in out
    assert "at most 1 fit: set resources.gpus to 1 (1/1) or more" in err, err
    assert not (tmp_path / "none.db").exists()  # a dry run writes nothing


@pytest.mark.slow
def test_a_submission_whose_cells_would_not_fit_on_the_clusters_gpu_is_refused_before_anything_is_recorded(tmp_path):
    """On a Ray whose head declares one GPU (this machine has none): the placement counts it, the check refuses
    four cells at once that a declared 1.5 GiB cannot hold, and the MLflow store holds no run of the study."""
    store = f"sqlite:///{tmp_path}/mlflow.db"
    path = study_file(tmp_path, {"gpus": 0.25, "gpu_memory_gb": 1.5})
    with ray_cluster(tmp_path, nodes=1, cpus_per_node=2, dashboard=False, head_gpus=1) as cluster:
        cmd = [sys.executable, "-m", "ablate", "sweep", str(path), "--tracking-uri", store]
        out = subprocess.run(
            [*cmd, "--address", cluster.address], capture_output=True, text=True, cwd=ROOT, timeout=600
        )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "4 cell(s) at once on a GPU (resources.gpus 0.25) need 4 x" in out.stderr
    assert "at most 1 fit" in out.stderr
    experiment = MlflowClient(store).get_experiment_by_name("packed")
    assert experiment is None or not MlflowClient(store).search_runs([experiment.experiment_id])


def test_packing_lines_say_when_the_memory_is_read_on_the_cluster():
    calibration = Calibration(step_mb=9.0, context_mb=800.0, device="cpu", variant="norm=pre")
    lines = packing_lines(Resources(gpus=0.0625), calibration, None)
    assert lines[0].startswith("packing: 16 cell(s) at once per GPU (resources.gpus 0.0625); one cell needs 809 MiB")
    assert "read on the cluster when the sweep starts" in lines[1]
    assert "12.64 GiB" in lines[1]  # 16 x 809 MiB
