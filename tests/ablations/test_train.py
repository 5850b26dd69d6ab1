"""One training run, end to end, with a real MLflow store read back through MLflow's client."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import yaml
from mlflow import MlflowClient

from ablations.train import Tracking, train
from record.spec import resolve_run
from tests.conftest import mlflow_server
from tests.models.devices import cuda

SMALL = {"d_model": 32, "n_heads": 2, "n_layers": 2, "d_ff": 64}
FAST = {"lr": 3e-3, "warmup_steps": 30, "val_every": 100, "batch_size": 32}


def run_config(task: dict, steps: int, model: dict | None = None, **training):
    return resolve_run(
        {
            "task": task,
            "model": {**SMALL, **(model or {})},
            "training": {**FAST, "max_steps": steps, **training},
            "resources": {"threads": 1},
        }
    )


def _arch() -> str:
    import platform

    return platform.machine()


def only_run(uri: str, experiment: str):
    c = MlflowClient(uri)
    runs = c.search_runs([c.get_experiment_by_name(experiment).experiment_id])
    assert len(runs) == 1
    return c, runs[0]


# --- learning, one short run per arch and task ------------------------------------------------------


@pytest.mark.slow
def test_the_run_summary_lists_target_positions_in_numeric_order(capsys, tmp_path):
    from ablations.tracking import RunResult
    from ablations.ui import print_summary

    metrics = {f"test/error_at_{k}": k / 10 for k in (10, 2, 1, 9)} | {"final/val_loss": 0.5}
    uri = f"sqlite:///{tmp_path}/m.db"
    print_summary(
        RunResult(run_id="0" * 32, status="finished", detail="", metrics=metrics, tracking_uri=uri, experiment="x")
    )
    shown = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert shown == ["final/val_loss", "test/error_at_1", "test/error_at_2", "test/error_at_9", "test/error_at_10"]


def test_encoder_decoder_learns_to_copy(store):
    run = run_config({"name": "copy", "train_size": 5000, "max_len": 8}, 300, {"n_layers": 1})
    result = train(run, Tracking(store, "learn"))
    # chance of guessing a whole sequence of 1-8 symbols from 10 is below 10%; one symbol is 10%
    assert result.status == "finished"
    assert result.metrics["test/exact_match"] > 0.5
    assert result.metrics["test/token_acc"] > 0.8


@pytest.mark.slow
@pytest.mark.parametrize("name", ["reverse", "sort"])
def test_encoder_decoder_learns_reverse_and_sort(store, name):
    run = run_config({"name": name, "train_size": 5000, "max_len": 6}, 300)
    result = train(run, Tracking(store, "learn"))
    assert result.metrics["test/token_acc"] > 0.5  # chance: 0.1 per symbol


@pytest.mark.slow
def test_decoder_language_model_beats_the_unigram_entropy(store):
    run = run_config({"name": "text", "block_size": 64}, 200)
    result = train(run, Tracking(store, "learn"))
    unigram = run.task.unigram_entropy("validation")
    assert result.metrics["final/val_loss"] < unigram - 0.3, (result.metrics["final/val_loss"], unigram)


@pytest.mark.slow
def test_encoder_classifier_beats_the_majority_class_on_listops(store):
    run = run_config({"name": "listops", "train_size": 5000, "min_len": 10, "max_len": 38, "max_depth": 3}, 400)
    result = train(run, Tracking(store, "learn"))
    labels = [r["label"] for r in run.task.build("test").to_list()]
    majority = Counter(labels).most_common(1)[0][1] / len(labels)
    assert result.metrics["test/accuracy"] > majority + 0.1, (result.metrics["test/accuracy"], majority)


@pytest.mark.slow
def test_decoder_learns_recall_and_retrieval(store):
    recall = run_config({"name": "recall", "train_size": 5000, "pairs": 4, "queries": 2, "keys": 8, "values": 8}, 400)
    r = train(recall, Tracking(store, "learn"))
    assert r.metrics["test/token_acc"] > 2 * (1 / 8)  # answers: values drawn from 8
    retrieval = run_config({"name": "retrieval", "train_size": 5000, "length": 16, "distance": 5, "symbols": 8}, 300)
    r = train(retrieval, Tracking(store, "learn"))
    assert r.metrics["test/exact_match"] > 0.9


# --- what MLflow holds ----------------------------------------------------------------------------


def assert_run_recorded(uri: str, experiment: str, run, result) -> None:
    c, rec = only_run(uri, experiment)
    assert rec.info.run_id == result.run_id and rec.info.status == "FINISHED"
    # params: the flattened resolved configuration, nothing operational
    assert rec.data.params == {k: str(v) for k, v in run.params().items()}
    # a field left out shows what it means, as the model and the loop read it (MLflow showed 'None')
    assert rec.data.params["model.head_dim"] == str(run.model.head_size)
    assert rec.data.params["training.eval_batch_size"] == str(run.training.batch_size)
    tags = rec.data.tags
    assert tags["status_detail"] == "finished" and tags["seed"] == "0" and tags["task"] == "copy"
    import torch

    assert tags["device"] == (torch.cuda.get_device_name() if torch.cuda.is_available() else f"cpu ({_arch()})")
    assert tags["config_hash"] == run.config_hash()
    assert tags["scoring.classes"] == str(run.task.output_classes(run.model))  # what comparing reads of the task
    assert len(tags["git_sha"]) == 40 and tags["code_version"].startswith(tags["git_sha"][:12])
    # per-step metrics: training every log_every steps, validation every val_every steps
    train_loss = c.get_metric_history(result.run_id, "train/loss")
    assert [m.step for m in train_loss] == list(range(0, 120, 10))
    assert [m.step for m in c.get_metric_history(result.run_id, "val/loss")] == [50, 100, 120]
    # summary metrics
    for key in (
        "best/val_loss",
        "final/val_exact_match",
        "test/exact_match",
        "test_long/exact_match",
        "cost/tokens_per_s",
        "cost/peak_memory_mb",
        "cost/n_params",
        "cost/wall_time_s",
        "cost/flops_per_token",
        "cost/achieved_flops_per_s",
    ):
        assert key in rec.data.metrics, key
    assert rec.data.metrics["cost/n_params"] > 1000
    # artifacts: the resolved configuration
    local = c.download_artifacts(result.run_id, "config.yaml")
    with open(local) as f:
        assert yaml.safe_load(f) == yaml.safe_load(yaml.safe_dump(run.to_dict()))
    # dataset lineage
    inputs = {d.dataset.name: d for d in rec.inputs.dataset_inputs}
    assert set(inputs) == {"copy/train", "copy/validation", "copy/test", "copy/test_long"}
    assert len({d.dataset.digest for d in inputs.values()}) == 4


def short_copy():
    return run_config({"name": "copy", "train_size": 500, "max_len": 5}, 120, {"n_layers": 1}, val_every=50)


def test_everything_is_read_back_through_the_mlflow_client(store):
    run = short_copy()
    result = train(run, Tracking(store, "readback"))
    assert_run_recorded(store, "readback", run, result)


@pytest.mark.slow
def test_the_same_against_an_mlflow_server(tmp_path):
    with mlflow_server(tmp_path) as uri:
        run = short_copy()
        result = train(run, Tracking(uri, "served"))
        assert_run_recorded(uri, "served", run, result)


def test_checkpoint_is_an_artifact_when_asked(store):
    run = resolve_run(
        {
            **short_copy().to_dict(),
            "tracking": {"checkpoint": True},
            "training": {**short_copy().training.to_dict(), "max_steps": 5},
        }
    )
    result = train(run, Tracking(store, "ckpt"))
    c = MlflowClient(store)
    assert [a.path for a in c.list_artifacts(result.run_id, "checkpoint")] == ["checkpoint/model.pt"]


# --- results that are not successes ----------------------------------------------------------------


def test_a_diverged_run_is_a_result(store, tmp_path, monkeypatch):
    """Post-LN without warm-up at a huge learning rate diverges: recorded as diverged, exit code 0."""
    from ablate.main import main

    path = tmp_path / "diverge.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "diverge",
                "task": {"name": "text", "block_size": 32},
                "model": {**SMALL, "norm": "post"},
                "training": {"max_steps": 120, "lr": 3.0, "schedule": "constant", "grad_clip": None, "batch_size": 16},
                "resources": {"threads": 1},
            }
        )
    )
    assert main(["run", str(path), "--tracking-uri", store, "--no-progress"]) == 0
    c, rec = only_run(store, "diverge")
    assert rec.info.status == "FINISHED"
    assert rec.data.tags["status_detail"].startswith("diverged: ")
    assert 50 <= rec.data.metrics["diverged_step"] < 120
    assert len(c.get_metric_history(rec.info.run_id, "train/loss")) < 12  # it stopped early


def test_a_run_whose_outputs_end_non_finite_is_diverged_not_left_without_a_value(store):
    """The divergence guard watches the training loss. A model whose evaluation after training is not finite (here
    its weights overflow after the last step) finished with its losses dropped from the summary, and the report
    counted the cell as having no outcome yet (a 6/6 success count over 8 seeds): it is recorded as diverged."""
    import lightning.pytorch as L
    import torch

    class Overflow(L.Callback):
        def on_train_end(self, trainer, module):
            with torch.no_grad():
                for p in module.parameters():
                    p.fill_(float("inf"))

    def prepare(trainer):
        trainer.callbacks.append(Overflow())
        return trainer

    result = train(short_copy(), Tracking(store, "overflow"), prepare=prepare)
    assert result.status == "diverged" and result.detail.startswith("non-finite ") and "test/loss" in result.detail
    _, rec = only_run(store, "overflow")
    assert rec.data.tags["status_detail"] == f"diverged: {result.detail}"
    assert rec.data.metrics["diverged_step"] == 120 and "test/loss" not in rec.data.metrics


def test_a_non_finite_metric_of_any_name_makes_a_run_diverged(store):
    """Only a loss's name was checked: a finished run whose exact match came out nan was dropped from the summary
    and read as a cell without an outcome. Here only test/exact_match is non-finite; the losses are finite."""
    import lightning.pytorch as L

    class NanExactMatch(L.Callback):
        def on_train_end(self, trainer, module):
            evaluate = module.evaluate

            def patched(*args, **kwargs):
                out = evaluate(*args, **kwargs)
                return {k: float("nan") if k == "test/exact_match" else v for k, v in out.items()}

            module.evaluate = patched

    def prepare(trainer):
        trainer.callbacks.append(NanExactMatch())
        return trainer

    result = train(short_copy(), Tracking(store, "nan-match"), prepare=prepare)
    assert result.status == "diverged" and result.detail == "non-finite test/exact_match after training"


def test_hooks_run_outside_the_timed_steps_and_the_final_validation_scores_the_validations_batches(store, monkeypatch):
    """The metrics were handed to MLflow and to the hooks (Ray Tune's reports, a pruner) at the end of each step,
    before the module stopped its clock: a 50 ms hook made a 2.5 ms step 23 ms (a review measured). And the final validation scored the
    whole split where every validation before it scored val_batches: final/val_* and best/val_* were of other
    examples (a reviewer's findings)."""
    from models.lightning import LitTransformer

    evaluated = []
    evaluate = LitTransformer.evaluate
    monkeypatch.setattr(
        LitTransformer, "evaluate", lambda self, *a, **kw: evaluated.append((a[1], kw)) or evaluate(self, *a, **kw)
    )
    trainers, running = [], []

    def prepare(trainer):
        trainers.append(trainer)
        return trainer

    def hook(step, metrics):
        running.append(trainers[0].lightning_module._t0 is not None)  # the module's step clock

    run = run_config(
        {"name": "copy", "train_size": 300, "max_len": 5}, 25, {"n_layers": 1}, val_every=10, val_batches=1
    )
    train(run, Tracking(store, "timed"), hooks=[hook], prepare=prepare)
    assert running and not any(running)
    assert [kw.get("max_batches") for prefix, kw in evaluated if prefix == "val"] == [1]


def test_an_exception_is_recorded_as_failed_with_its_traceback(store):
    def explode(step, metrics):
        if step >= 20:
            raise RuntimeError("injected failure")

    with pytest.raises(RuntimeError, match="injected failure"):
        train(short_copy(), Tracking(store, "failing"), hooks=[explode])
    c, rec = only_run(store, "failing")
    assert rec.info.status == "FAILED"
    assert rec.data.tags["status_detail"] == "failed: RuntimeError: injected failure"
    with open(c.download_artifacts(rec.info.run_id, "traceback.txt")) as f:
        assert "RuntimeError: injected failure" in f.read()


def test_bad_data_source_fails_before_anything_is_logged(store, tmp_path):
    from models.tasks import DataUnavailable

    tiny = tmp_path / "tiny.txt"
    tiny.write_text("x" * 1000)
    run = run_config({"name": "text", "source": str(tiny), "block_size": 512}, 10)
    with pytest.raises(DataUnavailable, match="fewer than one block"):
        train(run, Tracking(store, "nothing"))
    assert MlflowClient(store).get_experiment_by_name("nothing") is None


@pytest.mark.slow
def test_same_configuration_and_seed_give_identical_metrics(tmp_path):
    histories = []
    for i in range(2):
        uri = f"sqlite:///{tmp_path / f'{i}.db'}"
        result = train(short_copy(), Tracking(uri, "det"))
        c = MlflowClient(uri)
        histories.append(
            {
                key: [(m.step, m.value) for m in c.get_metric_history(result.run_id, key)]
                for key in ("train/loss", "train/token_acc", "val/loss", "val/exact_match", "test/loss")
            }
        )
    assert histories[0] == histories[1]
    other = run_config({"name": "copy", "train_size": 500, "max_len": 5}, 120, {"n_layers": 1}, val_every=50)
    other = resolve_run({**other.to_dict(), "seed": 1})
    result = train(other, Tracking(f"sqlite:///{tmp_path / 'seed1.db'}", "det"))
    c = MlflowClient(f"sqlite:///{tmp_path / 'seed1.db'}")
    assert [(m.step, m.value) for m in c.get_metric_history(result.run_id, "train/loss")] != histories[0]["train/loss"]


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "detail"), [("SIGINT", "interrupted (Ctrl-C)"), ("SIGTERM", "interrupted (SIGTERM)")])
def test_ctrl_c_and_sigterm_stop_a_run_as_killed(tmp_path, store, sig, detail):
    """Lightning turns Ctrl-C into sys.exit(1) (and ignores later ones) and SIGTERM into a SystemExit: `ablate run`
    still stops at once, exits 130 and records the run as killed, not failed."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump({"task": {"name": "copy"}, "model": SMALL, "training": {**FAST, "max_steps": 100_000}})
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate", "run", str(path), "--tracking-uri", store, "--no-progress"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait until it trains: its run has metrics
            runs = MlflowClient(store).search_runs([e.experiment_id for e in MlflowClient(store).search_experiments()])
            if runs and runs[0].data.metrics:
                break
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.3)
        proc.send_signal(getattr(signal, sig))
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    run = MlflowClient(store).get_run(runs[0].info.run_id)
    assert run.info.status == "KILLED" and run.data.tags["status_detail"] == f"killed: {detail}"


# --- how a run trains: precision, compile and fused AdamW, recorded, refused where the device cannot run them ------


def speed_run(precision: str, compile: bool, fused: bool, steps: int = 4):
    return run_config(
        {"name": "copy", "train_size": 64, "max_len": 5},
        steps,
        {"n_layers": 1},
        batch_size=8,
        val_every=100,
        val_batches=1,
        decode_batches=1,
        precision=precision,
        compile=compile,
        fused_adamw=fused,
    )


def assert_trained_and_recorded(store: str, experiment: str, run, result, device: str) -> None:
    c, rec = only_run(store, experiment)
    assert result.status == "finished" and rec.data.tags["device"] == device
    t = run.training
    params = rec.data.params
    assert (params["training.precision"], params["training.compile"], params["training.fused_adamw"]) == (
        t.precision,
        str(t.compile),
        str(t.fused_adamw),
    )
    assert rec.data.metrics["cost/steps"] == t.max_steps
    assert all(math.isfinite(rec.data.metrics[k]) for k in ("final/val_loss", "test/loss"))


def test_a_run_in_bf16_with_fused_adamw_on_a_cpu_is_recorded_with_its_settings_and_device(store):
    """bf16 autocast and fused AdamW run on a CPU (torch 2.13; compile too, in benchmarks/gpu.py's smoke run through
    `ablate run`'s code path): the params say how the run trained, the ``device`` tag where."""
    run = speed_run("bf16-mixed", False, True)
    result = train(run, Tracking(store, "bf16-cpu"))
    assert_trained_and_recorded(store, "bf16-cpu", run, result, f"cpu ({_arch()})")


def test_settings_a_device_or_a_dtype_cannot_run_are_refused_naming_the_key_and_the_fix(store, tmp_path, monkeypatch):
    """Before anything starts: a precision Lightning does not know (its old spellings named by their full names),
    an AdamW eps that float16 rounds to 0 under precision 16-true (torch's own AdamW then gives NaN on the first
    step: the reference below), and compile on a CPU where torch.compile finds no C++ compiler."""
    import torch

    from models.config import ConfigError
    from models.lightning import check_device
    from models.training import FLOAT16_TINY, TrainingConfig

    with pytest.raises(ConfigError, match="precision='bf16' is not a valid choice") as info:
        TrainingConfig(precision="bf16")
    assert info.value.field == "precision" and "'bf16-mixed'" in info.value.fix
    with pytest.raises(ConfigError, match="eps=1e-09 is 0 in float16") as info:
        TrainingConfig(precision="16-true")
    assert info.value.field == "eps" and "1e-7" in info.value.fix and "fused_adamw" in info.value.related
    TrainingConfig(precision="16-true", eps=1e-7)
    TrainingConfig(precision="16-true", fused_adamw=True)  # the fused kernel computes in float32
    assert float(torch.tensor(1e-9, dtype=torch.float16)) == 0 < float(torch.tensor(FLOAT16_TINY, dtype=torch.float16))
    for eps, finite in ((1e-9, False), (1e-7, True)):  # the reference: torch's AdamW on float16 parameters
        p = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))
        p.grad = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float16)
        torch.optim.AdamW([p], eps=eps, foreach=True).step()
        assert bool(p.isfinite().all()) is finite

    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(ConfigError, match="compile=true on a CPU needs a C..? compiler") as info:
        check_device(TrainingConfig(compile=True), "cpu")
    assert info.value.field == "training.compile" and "training.compile: false" in info.value.fix
    check_device(TrainingConfig(compile=False), "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="needs a C"):
            train(speed_run("32-true", True, False), Tracking(store, "refused"))
        assert MlflowClient(store).get_experiment_by_name("refused") is None  # nothing started


@cuda
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed"])
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_cuda_every_combination_of_precision_compile_and_fused_adamw_trains_and_is_recorded(
    store, precision, compile, fused
):
    """On CUDA each combination trains through `ablate run`'s code path and is recorded; its validation loss is that
    of the same precision without compile and fused AdamW (other kernels, the same training), within rounding."""
    import torch

    reference = train(speed_run(precision, False, False), Tracking(store, "reference"))
    run = speed_run(precision, compile, fused)
    result = train(run, Tracking(store, "combination"))
    assert_trained_and_recorded(store, "combination", run, result, torch.cuda.get_device_name())
    tolerance = 1e-3 if precision == "32-true" else 3e-2
    assert result.metrics["final/val_loss"] == pytest.approx(reference.metrics["final/val_loss"], rel=tolerance)
