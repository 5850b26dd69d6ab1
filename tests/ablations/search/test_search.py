"""Optuna searches with real storages (SQLite, journal file, PostgreSQL when reachable), real Ray, real MLflow."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow import MlflowClient
from optuna.trial import TrialState

from ablations.search import open_storage, run_search
from record.spec import SpecError, load_search, resolve_run
from record.vocabulary import KIND_SEARCH, KIND_TRIAL, client
from tests import reliability
from tests.conftest import ROOT, postgres_reachable

TINY = {
    "task": {"name": "reverse", "train_size": 300, "max_len": 5},
    "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
    "training": {"val_every": 10, "batch_size": 16, "eval_batch_size": 64, "warmup_steps": 0},
}
# Validating every 100 steps: the tests that must catch a trial mid-training run hundreds of steps, and each
# validation (evaluation, MLflow, Optuna's storage) costs about 0.13 CPU-seconds here: 13 s per 1,000 steps at 10.
SPARSE = {**TINY, "training": {**TINY["training"], "val_every": 100}}
SPACE = {"training.lr": {"type": "float", "low": 1.0e-5, "high": 3.0e-2, "log": True}}


def write_spec(tmp_path: Path, name: str = "srch", **spec) -> Path:
    data = {
        "name": name,
        "base": TINY,
        "space": SPACE,
        "n_trials": 4,
        "concurrency": 2,
        "budget": {"steps": 40},
        "sampler": "random",
        **spec,
    }
    data = {k: v for k, v in data.items() if v is not None}  # None: the key's default
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_trials_that_did_not_end_by_themselves_are_asked_again_and_counted_once(tmp_path):
    """n_trials counts failures (a search whose trials all fail ends), but a trial lost to a dead process, to
    Ctrl-C or to a stale heartbeat is asked again, and only its retry counts."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    from ablations.search.ledger import counted_trials, fail_and_ask_again

    study = optuna.create_study(study_name="c", storage=open_storage(f"sqlite:///{tmp_path / 'o.db'}"))
    x = {"x": FloatDistribution(0, 1)}
    study.add_trial(create_trial(params={"x": 0.1}, distributions=x, value=1.0))  # 0: complete
    study.add_trial(create_trial(state=TrialState.FAIL, params={"x": 0.2}, distributions=x))  # 1: failed by itself
    lost = study.ask(x)  # 2: running
    assert counted_trials(study) == 3
    fail_and_ask_again(study, lost.number, lost.params)  # 2 failed, 3 waiting with the same parameters
    assert counted_trials(study) == 2
    retry = study.ask(x)  # define-by-run: the enqueued value comes back when the parameter is asked
    assert retry.params == lost.params and retry.user_attrs["retry_of"] == lost.number
    assert counted_trials(study) == 3
    # Optuna's heartbeat callback: trial 4 went stale, trial 5 is its retry
    study.add_trial(create_trial(state=TrialState.FAIL, params={"x": 0.4}, distributions=x))
    study.add_trial(
        create_trial(
            params={"x": 0.4}, distributions=x, value=1.0, system_attrs={"failed_trial": 4, "retry_history": [4]}
        )
    )
    assert counted_trials(study) == 4


@pytest.mark.parametrize(("pruner", "stops"), [("median", True), ("none", False)])
def test_a_trial_prunes_with_the_searchs_own_pruner(tmp_path, pruner, stops):
    """The storage keeps no pruner: a trial's process must build the search's (Optuna's default median pruner
    waits for 5 finished trials; this search's waits for 2)."""
    from ablations.search import make_pruner
    from ablations.search.trial import TrialTask, pruning_hooks
    from ablations.train import StopTraining
    from record.spec import Resources

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="p", storage=open_storage(url), pruner=make_pruner(pruner))
    for _ in range(2):  # two finished trials whose loss at step 10 was 1.0
        t = study.ask()
        t.report(1.0, 10)
        study.tell(t, 1.0)
    trial = study.ask()
    task = TrialTask(
        spec_name="p",
        storage=url,
        number=trial.number,
        params={},
        run_data={},
        uri="",
        experiment="",
        parent_run_id="",
        objectives=[("final/val_loss", "minimize")],
        prune_on="val/loss",
        pruner=pruner,
        code={},
        resources=Resources(),
        ray_storage=str(tmp_path),
    )
    (hook,) = pruning_hooks(task, last_step=20)
    hook(5, {"train/loss": 9.0})  # not the metric it prunes on: ignored
    if stops:
        with pytest.raises(StopTraining, match="median pruner at val/loss=3"):
            hook(10, {"val/loss": 3.0})
    else:
        hook(10, {"val/loss": 3.0})
    hook(20, {"val/loss": 3.0})  # the last step: reported, never pruned (a finished result is not thrown away)
    assert optuna.load_study(study_name="p", storage=url).trials[2].intermediate_values == {10: 3.0, 20: 3.0}


def database_away(name: str, away: bool) -> None:
    """A PostgreSQL database of 127.0.0.1:5432 refusing every connection, its open ones cut (what its clients see
    of a restart), or back."""
    import psycopg

    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres", autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS {str(not away).lower()}")
        if away:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))


def test_a_trial_that_starts_while_postgresql_restarts_waits_for_it_and_trains(tmp_path, store):
    """Found by benchmarks/soak.py: a search trial failed with no MLflow run when PostgreSQL restarted as it started
    (the trial's process opens the Optuna storage before anything else, and that error reached the driver as a
    dead task). It now waits for the storage, as its reports do, and trains."""
    import threading

    import ablations.train  # noqa: F401  (imported now: the trial reaches its storage at once, while it is away)
    from ablations.search.trial import TrialTask, run_trial
    from tests.conftest import fresh_postgres_database

    spec = load_search(write_spec(tmp_path, pruner="none", budget={"steps": 20}))
    with fresh_postgres_database("ablate_start") as url:
        name = url.rsplit("/", 1)[1]
        study = optuna.create_study(study_name="srch", storage=open_storage(url))
        trial = study.ask()
        params = spec.suggest(trial)
        task = TrialTask(
            spec_name="srch", storage=url, number=trial.number, params=params, run_data=spec.run_data(params),
            uri=store, experiment="srch", parent_run_id="", objectives=spec.objectives, prune_on=spec.prune_on,
            pruner="none", code={}, resources=spec.resources, ray_storage=str(tmp_path),
        )  # fmt: skip
        database_away(name, True)
        back = threading.Timer(3.0, database_away, args=(name, False))
        back.start()
        try:
            result = run_trial(task)
        finally:
            back.join()
        assert result["status"] == "finished", result
        assert MlflowClient(store).get_run(result["run_id"]).info.status == "FINISHED"


def test_a_trial_s_result_counts_only_when_the_storage_says_it_still_runs(monkeypatch):
    """Found by benchmarks/soak.py (a duplicated trial): a trial's fence read a restarting PostgreSQL as "still
    running", so the result of a trial that a resumed search had already failed and asked again stood beside its
    retry's. The fence now waits for the storage, and a storage that cannot say fences the result out."""
    import threading

    from ablations.search import trial as trial_module
    from ablations.search.setup import trial_id
    from ablations.search.trial import TAKEN_OVER, UNFENCED, taken_from_it
    from tests.conftest import fresh_postgres_database

    with fresh_postgres_database("ablate_fence") as url:
        name, storage = url.rsplit("/", 1)[1], open_storage(url)
        study = optuna.create_study(study_name="f", storage=storage)
        taken, running = study.ask().number, study.ask().number
        optuna.load_study(study_name="f", storage=url).tell(taken, state=TrialState.FAIL)  # another process
        ids = {n: trial_id(storage, "f", n) for n in (taken, running)}
        assert taken_from_it(storage, ids[running]) is None
        database_away(name, True)
        back = threading.Timer(3.0, database_away, args=(name, False))
        back.start()
        try:
            assert taken_from_it(storage, ids[taken]) == TAKEN_OVER  # waited for the storage, then read it
        finally:
            back.join()
        monkeypatch.setattr(trial_module, "STORAGE_PATIENCE", 1.0)
        database_away(name, True)
        try:
            assert taken_from_it(storage, ids[running]).startswith(UNFENCED)  # cannot say: not a result
        finally:
            database_away(name, False)


def test_a_trial_reports_through_a_postgresql_restart_and_fails_only_when_it_stays_away(tmp_path, monkeypatch):
    """Found by benchmarks/soak.py: PostgreSQL restarted while a trial reported its validation loss, and the trial
    was recorded failed (StorageInternalError) though nothing was wrong with it. Its database refusing every
    connection for two seconds (all cut, none let in: what clients see of a restart) now costs the report a wait;
    a database that stays away longer than ``STORAGE_PATIENCE`` still fails the trial with the storage's error."""
    import threading

    from optuna.exceptions import StorageInternalError

    from ablations.search import make_pruner
    from ablations.search import trial as trial_module
    from ablations.search.trial import TrialTask, pruning_hooks
    from record.spec import Resources
    from tests.conftest import fresh_postgres_database

    with fresh_postgres_database("ablate_restart") as url:
        name = url.rsplit("/", 1)[1]
        study = optuna.create_study(study_name="r", storage=open_storage(url), pruner=make_pruner("median"))
        trial = study.ask()
        task = TrialTask(
            spec_name="r", storage=url, number=trial.number, params={}, run_data={}, uri="", experiment="",
            parent_run_id="", objectives=[("final/val_loss", "minimize")], prune_on="val/loss", pruner="median",
            code={}, resources=Resources(), ray_storage=str(tmp_path),
        )  # fmt: skip
        (hook,) = pruning_hooks(task, open_storage(url), last_step=30)
        hook(10, {"val/loss": 3.0})  # its connections are open and pooled

        database_away(name, True)
        back = threading.Timer(2.0, database_away, args=(name, False))
        back.start()
        try:
            hook(20, {"val/loss": 2.0})  # waits for the database, then reports
        finally:
            back.join()
        values = optuna.load_study(study_name="r", storage=url).trials[0].intermediate_values
        assert values == {10: 3.0, 20: 2.0}

        monkeypatch.setattr(trial_module, "STORAGE_PATIENCE", 1.0)
        database_away(name, True)
        try:
            with pytest.raises(StorageInternalError):
                hook(30, {"val/loss": 1.0})  # away for longer than its patience: the trial fails, and says why
        finally:
            database_away(name, False)


@pytest.mark.slow
def test_search_on_ray_with_pruning_tracked_in_mlflow(tmp_path, store, local_ray):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    spec = load_search(
        write_spec(
            tmp_path,
            n_trials=8,
            pruner="median",
            sampler="random",
            seed=3,
            budget={"steps": 60},
            space={"training.lr": {"type": "float", "low": 1.0e-6, "high": 3.0e-2, "log": True}},
        )
    )
    lines: list[str] = []
    result = run_search(spec, tracking_uri=store, storage=storage, num_cpus=2, out=lines.append)
    log = "\n".join(lines)
    study = optuna.load_study(study_name="srch", storage=storage)
    states = [t.state for t in study.trials]
    assert sum(s in (TrialState.COMPLETE, TrialState.PRUNED) for s in states) == 8, log
    pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert pruned, "no trial was pruned\n" + log
    assert result.best and result.best[0]["number"] == study.best_trial.number
    assert any("pruned" in line for line in lines)

    c = MlflowClient(store)
    exp = c.get_experiment_by_name("srch")
    parent = c.get_run(result.parent_run_id)
    assert parent.data.tags["kind"] == KIND_SEARCH and parent.info.status == "FINISHED"
    assert parent.data.metrics["best/final/val_loss"] == pytest.approx(study.best_value)
    assert parent.data.tags["best_trial"] == str(study.best_trial.number)
    assert {"best.json", "optuna_plots.html", "srch.yaml"} <= {a.path for a in c.list_artifacts(parent.info.run_id)}
    page = Path(c.download_artifacts(parent.info.run_id, "optuna_plots.html", str(tmp_path))).read_text()
    for title in ("optimisation history", "parallel coordinates", "PED-ANOVA", "fANOVA", "intermediate values"):
        assert f"<h2>{title}" in page or f"({title})</h2>" in page, title
    children = c.search_runs([exp.experiment_id], f"tags.kind = '{KIND_TRIAL}'")
    assert len(children) == len(study.trials)
    by_trial = {int(r.data.tags["trial"]): r for r in children}
    for t in study.trials:
        run = by_trial[t.number]
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["optuna_state"] == t.state.name
        assert float(run.data.params["training.lr"]) == pytest.approx(t.params["training.lr"])
    for t in pruned:  # stopped early, recorded as pruned in both
        run = by_trial[t.number]
        assert run.data.tags["status_detail"].startswith("pruned")
        assert run.data.metrics["stopped_step"] < 60
        assert max(t.intermediate_values) < 60
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert all(by_trial[t.number].data.metrics["final/val_loss"] == pytest.approx(t.value) for t in complete)


@pytest.mark.slow
def test_data_parallel_trials_report_from_rank_0_and_every_rank_stops_when_pruned(tmp_path, store):
    """Two DDP workers per trial: one MLflow run per trial, each validation reported to Optuna once, and a trial
    the pruner stops at its second validation ends on every rank there (rank 1 went on past the first one, and
    must not train on alone or wait at a collective forever: the CLI runs with a time limit, so a hang fails the
    test). The median pruner judges against a trial recorded before the search (worse than any trial at step 10,
    better at step 20): one trial trains instead of two. A finished DDP trial's final evaluation on rank 0 alone
    is tested in tests/ablations/sweep/test_sweep.py (the same trial code)."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    spec_path = write_spec(
        tmp_path,
        n_trials=2,
        concurrency=1,
        pruner="median",
        pruner_warmup={"trials": 1},
        resources={"cpus": 2, "workers": 2},
        budget={"steps": 25},
    )
    study = optuna.create_study(study_name="srch", storage=open_storage(storage))
    lr = {"training.lr": FloatDistribution(SPACE["training.lr"]["low"], SPACE["training.lr"]["high"], log=True)}
    study.add_trial(  # trial 0: finished before this search started
        create_trial(params={"training.lr": 1e-3}, distributions=lr, value=0.0, intermediate_values={10: 1e6, 20: 0.0})
    )
    study.enqueue_trial({"training.lr": 3.0e-3})
    out = run_cli_search(tmp_path, spec_path, storage, store)  # the CLI, with a time limit
    study = optuna.load_study(study_name="srch", storage=storage)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.PRUNED], out.stdout
    reported = study.trials[1].intermediate_values
    assert sorted(reported) == [10, 20]  # each validation once, the second one pruned it

    c = MlflowClient(store)
    runs = {int(r.data.tags["trial"]): r for r in runs_of_kind(store, "srch", KIND_TRIAL)}
    assert sorted(runs) == [1]  # one run for the trial trained: rank 1 logged nothing
    run = runs[1]
    assert run.data.tags["workers"] == "2"
    # the hash tagged is of what was trained, two ranks' global batch included: not that of one worker's run
    trained = resolve_run({**load_search(spec_path).run_data({"training.lr": 3.0e-3}), "name": "srch"}, "trial 1")
    assert run.data.tags["config_hash"] == trained.config_hash(workers=2) != trained.config_hash()
    assert run.data.tags["status_detail"].startswith("pruned") and run.data.metrics["stopped_step"] == 20
    history = c.get_metric_history(run.info.run_id, "val/loss")
    assert [m.step for m in history] == [10, 20]  # each point once: no other rank logged, no step after 20
    assert [reported[m.step] for m in history] == pytest.approx([m.value for m in history])  # rank 0 reported them


@pytest.mark.slow
def test_a_search_whose_trials_all_fail_ends_and_says_why(tmp_path, store, local_ray):
    """Every trial raises (its data vanished after the checks): the search ends after n_trials, each a FAIL with the
    reason (in its output and in Optuna's storage), instead of asking forever. (A typo in the objective no longer gets this far: tests/record/spec.)"""
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    corpus = tmp_path / "vanishing.txt"
    corpus.write_text(" ".join(["the", "of", "and", "to", "in"] * 400))
    base = {**TINY, "task": {"name": "text", "source": str(corpus), "block_size": 16}}
    spec = load_search(write_spec(tmp_path, base=base, n_trials=2, pruner="none", budget={"steps": 10}))
    corpus.unlink()
    lines: list[str] = []
    result = run_search(spec, tracking_uri=store, storage=storage, num_cpus=2, out=lines.append)
    study = optuna.load_study(study_name="srch", storage=storage)
    assert [t.state for t in study.trials] == [TrialState.FAIL] * 2  # n_trials counts failures: no endless asking
    assert result.best == [] and result.counts == {"FAIL": 2}
    assert sum("vanishing.txt" in line for line in lines) >= 2, lines
    from ablations.search.ledger import FAILURE_ATTR  # the reason in the store too, not only in the output

    assert all("vanishing.txt" in t.user_attrs.get(FAILURE_ATTR, "") for t in study.trials), lines + [
        t.user_attrs for t in study.trials
    ]


def test_a_trial_that_failed_before_its_run_began_keeps_its_reason_in_the_storage(tmp_path):
    """The soak counted trials "failed before its run started" with no reason anywhere but a driver's output (a
    trial whose process could not begin its MLflow run has no run to say why): the reason is a user attribute."""
    from ablations.search.ledger import FAILURE_ATTR, tell

    url = f"sqlite:///{tmp_path / 'o.db'}"
    study = optuna.create_study(study_name="s", storage=open_storage(url))
    number = study.ask().number
    reason = "MlflowException: API request to endpoint /api/2.0/mlflow/runs/create failed"
    assert tell(study, number, {"status": "failed", "reason": reason, "values": None, "run_id": ""}) == "FAIL"
    (trial,) = optuna.load_study(study_name="s", storage=url).trials
    assert trial.state == TrialState.FAIL and trial.user_attrs[FAILURE_ATTR] == reason


@pytest.mark.slow
def test_journal_storage_resuming_and_two_objectives(tmp_path, store, local_ray):
    storage = f"journal:{tmp_path / 'journal.log'}"
    objectives = [
        {"metric": "final/val_loss", "direction": "minimize"},
        {"metric": "cost/tokens_per_s", "direction": "maximize"},
    ]
    spec = load_search(write_spec(tmp_path, n_trials=2, sampler=None, pruner=None, objectives=objectives))
    assert (spec.sampler, spec.pruner) == ("nsga2", "none")  # the defaults for several objectives
    run_search(spec, tracking_uri=store, storage=storage, num_cpus=2, out=lambda _: None)
    spec.n_trials = 4  # the same command again with a larger total: two more
    result = run_search(spec, tracking_uri=store, storage=storage, num_cpus=2, out=lambda _: None)
    study = optuna.load_study(study_name="srch", storage=open_storage(storage))
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 4
    assert study.metric_names == ["final/val_loss", "cost/tokens_per_s"]  # optuna-dashboard's axis labels
    assert len(runs_of_kind(store, "srch", KIND_SEARCH)) == 2  # one parent run per process
    # the Pareto front: every trial no other trial beats in both objectives
    front = {t.number for t in study.trials if not any(dominates(o.values, t.values) for o in study.trials)}
    assert {b["number"] for b in result.best} == front
    assert all(set(b["values"]) == {"final/val_loss", "cost/tokens_per_s"} for b in result.best)
    c = MlflowClient(store)
    page = Path(c.download_artifacts(result.parent_run_id, "optuna_plots.html", str(tmp_path))).read_text()
    assert "<h2>Pareto front</h2>" in page and "<h2>history of cost/tokens_per_s</h2>" in page


def dominates(a: list[float], b: list[float]) -> bool:
    """a is no worse than b in both (loss down, speed up) and better in one."""
    no_worse = a[0] <= b[0] and a[1] >= b[1]
    return no_worse and (a[0] < b[0] or a[1] > b[1])


def runs_of_kind(uri: str, experiment: str, kind: str) -> list:
    c = client(uri)  # polled beside an `ablate` process creating the store: under its lock
    exp = c.get_experiment_by_name(experiment)
    return c.search_runs([exp.experiment_id], f"tags.kind = '{kind}'") if exp else []


def trial_runs(store: str) -> list:
    return runs_of_kind(store, "srch", KIND_TRIAL)


def cli(spec: Path, storage: str, store: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ablate",
        "search",
        str(spec),
        "--storage",
        storage,
        "--tracking-uri",
        store,
        "--cpus",
        "2",
        *extra,
    ]


def start_and_wait_for_a_trial(tmp_path: Path, spec_path: Path, storage: str, store: str, log_name: str = "first.log"):
    """``ablate search`` in its own process group; returns it and its first trial once that trial is training: it has
    reported a validation to Optuna. (Waiting for the trial's MLflow run instead missed whole trials while the suite
    loaded both cores: the run can appear seconds after training started.) Polled through one storage once the study
    exists: a new one per poll (a new engine, its schema checked) cost 0.06 CPU-seconds, against 0.01."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log_path = tmp_path / log_name
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cli(spec_path, storage, store),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
            start_new_session=True,
        )
    deadline, last, opened = time.monotonic() + 240, None, None
    while time.monotonic() < deadline:
        time.sleep(0.5)
        assert proc.poll() is None, log_path.read_text()
        try:  # KeyError until the study exists; SQLite may be busy
            study = optuna.load_study(study_name="srch", storage=opened or storage)
            opened = opened or optuna.storages.RDBStorage(storage)  # the schema is there: the command made it
        except Exception as err:
            last = err
            continue
        training = [t for t in study.trials if t.state == TrialState.RUNNING and t.intermediate_values]
        if training:
            return proc, training[0]
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"no trial started (last error: {last!r}):\n" + log_path.read_text())


def run_cli_search(tmp_path: Path, spec_path: Path, storage: str, store: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        cli(spec_path, storage, store), capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out


@pytest.mark.parametrize("objectives", [1, 2])
def test_a_trial_that_another_process_ended_stops_as_killed_and_is_not_told(tmp_path, store, objectives):
    """A search started again takes a trial whose driver died for lost: it fails it and asks it again. The lost
    trial's process may still be training (it can outlive its killed driver; on a node of a cluster, for longer):
    it must record neither a failure nor a result beside its retry. It stops at its next report (one
    objective) or after training (several objectives report nothing), and its MLflow run ends killed; its driver,
    if alive, leaves the trial as the other process left it. (The suite found it on a fast machine: such a process
    wrote "failed: UpdateFinishedTrialError" over the run the second command had ended as killed.)"""
    from ablations.search.ledger import tell
    from ablations.search.trial import TAKEN_OVER, TrialTask, run_trial

    metrics = [("final/val_loss", "minimize"), ("test/exact_match", "maximize")][:objectives]
    spec = load_search(
        write_spec(
            tmp_path,
            objectives=[{"metric": m, "direction": d} for m, d in metrics],
            pruner="none",
            budget={"steps": 30},
        )
    )
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="srch", storage=open_storage(url), directions=[d for _, d in metrics])
    trial = study.ask()
    params = spec.suggest(trial)
    study.tell(trial.number, state=TrialState.FAIL)  # what the search started again does to a lost trial
    task = TrialTask(
        spec_name="srch", storage=url, number=trial.number, params=params, run_data=spec.run_data(params), uri=store,
        experiment="srch", parent_run_id="", objectives=spec.objectives, prune_on=spec.prune_on, pruner="none",
        code={}, resources=spec.resources, ray_storage=str(tmp_path),
    )  # fmt: skip
    result = run_trial(task)
    assert result["status"] == "killed" and result["reason"].startswith(TAKEN_OVER), result
    run = MlflowClient(store).get_run(result["run_id"])
    assert run.info.status == "KILLED" and run.data.tags["status_detail"].startswith(f"killed: {TAKEN_OVER}")
    if objectives == 1:  # stopped at its first report (validation every 10 steps)
        assert run.data.metrics["stopped_step"] == 10
    else:  # nothing reported: trained to the end, then ended killed
        assert run.data.metrics["cost/steps"] == 30 and "stopped_step" not in run.data.metrics
    assert tell(study, trial.number, result, spec) == "ended by another process"
    assert optuna.load_study(study_name="srch", storage=url).trials[0].state == TrialState.FAIL


@pytest.mark.slow
def test_ctrl_c_then_a_kill_each_lose_the_running_trial_and_the_same_command_asks_it_again(tmp_path, store):
    """One search interrupted twice, then finished by the same command: Ctrl-C fails the running trial and queues it
    again; SIGKILL (the driver dies, nobody ends anything) leaves the trial running, and the next command fails it and
    asks it again. (Two tests once, each paying a command, a Ray and a trained trial of its own: one search serves.)"""
    from ablations.search.trial import TAKEN_OVER

    # 1,000 steps: the trial must still be training when the signal lands (the first validation is at step 100).
    # One trial: the same command again must ask exactly the lost one again, and nothing more (a failed trial does
    # not count towards n_trials, and no new one is asked instead).
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    spec_path = write_spec(tmp_path, n_trials=1, concurrency=1, pruner="none", budget={"steps": 1000}, base=SPARSE)

    # Ctrl-C: the trial fails, its run ends killed, and it is queued again
    proc, interrupted = start_and_wait_for_a_trial(tmp_path, spec_path, storage, store)
    try:
        masks = [line for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines() if line.startswith("Sig")]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, "\n".join([(tmp_path / "first.log").read_text(), *masks])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    study = optuna.load_study(study_name="srch", storage=storage)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.WAITING]  # failed, and queued again
    assert study.trials[1].user_attrs["retry_of"] == interrupted.number == 0
    assert runs_of_kind(store, "srch", KIND_SEARCH)[0].info.status == "KILLED"
    (run,) = trial_runs(store)  # its MLflow run is not left RUNNING either
    assert (run.info.status, run.data.tags["status_detail"]) == (
        "KILLED",
        "killed: the search stopped before the trial finished",
    )

    # the same command asks the interrupted trial again; SIGKILLed while that trial trains
    proc, lost = start_and_wait_for_a_trial(tmp_path, spec_path, storage, store, "second.log")
    assert lost.number == 1 and lost.params == interrupted.params  # the interrupted trial, asked again
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(1)
    orphan = {int(r.data.tags["trial"]): r for r in trial_runs(store)}[lost.number]
    assert orphan.info.status == "RUNNING"  # nobody could end it: its process died with the driver

    # the same command again: the lost trial is failed and asked again, and counted once
    again = run_cli_search(tmp_path, spec_path, storage, store)
    assert f"trial {lost.number} was left running" in again.stdout
    study = optuna.load_study(study_name="srch", storage=storage)
    assert study.trials[lost.number].state == TrialState.FAIL
    retried = [t for t in study.trials if t.user_attrs.get("retry_of") == lost.number]
    assert len(retried) == 1 and retried[0].params == lost.params and retried[0].state == TrialState.COMPLETE
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.FAIL, TrialState.COMPLETE]  # 1 counted
    # a trial's MLflow run is RUNNING only while its Optuna trial is: the lost one's run is ended as killed
    # (by the third command; or, where the lost trial's process outlived its driver long enough to report again,
    # by that process: test_a_trial_that_another_process_ended_stops_as_killed_and_is_not_told; or, where that process
    # finished its run before the third command took the trial, by the third command at its end)
    status = {int(r.data.tags["trial"]): (r.info.status, r.data.tags["status_detail"]) for r in trial_runs(store)}
    assert status[2] == ("FINISHED", "finished") and set(status) == {0, 1, 2}
    assert status[0] == ("KILLED", "killed: the search stopped before the trial finished")
    assert status[1][0] == "KILLED" and status[1][1].startswith(
        (
            "killed: its search process stopped before the trial finished",
            f"killed: {TAKEN_OVER}",
            "killed: finished after its search process stopped, before Optuna was told; asked again as trial 2",
        )
    ), status


def test_a_run_that_finished_after_its_search_process_died_is_not_a_result(tmp_path, store):
    """The fault soak (2026-11-28) counted a duplicated trial: a trial's process finished its run just after its
    search process was SIGKILLed, before Optuna was told; the next process failed the trial and asked it again, and
    the orphan's FINISHED run stood beside its retry's. It is ended as killed; a trial that failed by itself (not
    asked again) keeps its run."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    from ablations import tracking
    from ablations.search.runs import end_orphaned_trial_runs
    from record import vocabulary

    study = optuna.create_study(study_name="srch", storage=open_storage(f"sqlite:///{tmp_path / 'optuna.db'}"))
    lr = {"training.lr": FloatDistribution(1.0e-5, 3.0e-2, log=True)}
    for state, attrs in ((TrialState.FAIL, {}), (TrialState.COMPLETE, {"retry_of": 0}), (TrialState.FAIL, {})):
        value = 1.0 if state == TrialState.COMPLETE else None
        study.add_trial(
            create_trial(params={"training.lr": 1e-3}, distributions=lr, value=value, state=state, user_attrs=attrs)
        )
    c, exp = client(store), tracking.experiment_id(store, "srch")
    runs = {}
    for number in (0, 1, 2):
        tags = {vocabulary.TAG_KIND: KIND_TRIAL, vocabulary.TAG_STUDY: "srch", vocabulary.TAG_TRIAL: str(number)}
        runs[number] = c.create_run(exp, tags=tags).info.run_id
        vocabulary.end_run(store, runs[number], vocabulary.STATUS_FINISHED)
    assert end_orphaned_trial_runs(store, "srch", study, "srch", "unused: no run is RUNNING") == 1
    orphan = c.get_run(runs[0])
    assert orphan.info.status == "KILLED" and orphan.data.tags["status_detail"] == (
        "killed: finished after its search process stopped, before Optuna was told; asked again as trial 1"
    )
    assert [c.get_run(runs[n]).info.status for n in (1, 2)] == ["FINISHED", "FINISHED"]


def test_a_killed_search_process_leaves_no_parent_run_running(tmp_path, store):
    """A search process SIGKILLed (or crashed) cannot end its MLflow parent run, and no later process did: it stayed
    RUNNING for good (found by the fault soak, benchmarks/soak.py). The next process on the search ends it as
    killed, judged by the process its run names; a live process's run is left alone, and so is one of another
    machine (no pid says anything there)."""
    import socket

    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    from ablations import tracking
    from record import vocabulary

    spec = load_search(write_spec(tmp_path, n_trials=1))
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="srch", storage=open_storage(url))
    lr = FloatDistribution(1.0e-5, 3.0e-2, log=True)
    study.add_trial(create_trial(params={"training.lr": 1e-3}, distributions={"training.lr": lr}, value=1.0))
    dead = subprocess.Popen(["true"])
    dead.wait()
    live = subprocess.Popen(["sleep", "120"])
    c = client(store)
    exp = tracking.experiment_id(store, "srch")
    parents = {}
    here = socket.gethostname()
    for name, host, pid in (("dead", here, dead.pid), ("live", here, live.pid), ("elsewhere", "other-host", dead.pid)):
        tags = {vocabulary.TAG_KIND: KIND_SEARCH, vocabulary.TAG_STUDY: "srch", vocabulary.TAG_STATUS: "running"}
        tags |= {vocabulary.TAG_DRIVER_HOST: host, vocabulary.TAG_DRIVER_PID: str(pid)}
        parents[name] = c.create_run(exp, tags=tags).info.run_id
    try:
        run_search(spec, tracking_uri=store, storage=url, out=lambda _: None)  # every trial is held: no Ray
    finally:
        live.kill()
        live.wait()
    ended = c.get_run(parents["dead"])
    assert ended.info.status == "KILLED"
    assert ended.data.tags["status_detail"] == "killed: its search process stopped before the search ended"
    assert [c.get_run(parents[k]).info.status for k in ("live", "elsewhere")] == ["RUNNING", "RUNNING"]


@pytest.mark.slow
def test_two_search_processes_share_one_study(tmp_path, store):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    spec_path = write_spec(tmp_path, n_trials=4, concurrency=1, pruner="none", sampler="tpe")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    optuna.create_study(study_name="srch", storage=open_storage(storage))  # both processes then load it
    procs = [
        subprocess.Popen(
            cli(spec_path, storage, store, "--cpus", "1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n\n".join(outs)
    study = optuna.load_study(study_name="srch", storage=storage)
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert 4 <= len(complete) <= 5, [t.state for t in study.trials]  # both may ask the last trial at once
    drivers = {t.user_attrs["ablate:pid"] for t in study.trials}
    assert drivers == {p.pid for p in procs}  # both processes worked on it
    assert len(runs_of_kind(store, "srch", KIND_SEARCH)) == 2
    assert len(runs_of_kind(store, "srch", KIND_TRIAL)) == len(study.trials)


POSTGRES_TEST = "postgresql://postgres@127.0.0.1:5432/test"  # the database this machine's PostgreSQL has


@pytest.mark.slow
@pytest.mark.skipif(not postgres_reachable(), reason="no PostgreSQL reachable on 127.0.0.1:5432")
def test_postgresql_storage(tmp_path, store, local_ray):
    url = POSTGRES_TEST
    name = f"srch_{uuid.uuid4().hex[:8]}"
    spec = load_search(write_spec(tmp_path, name, n_trials=2, pruner="none"))
    try:
        result = run_search(spec, tracking_uri=store, storage=url, num_cpus=2, out=lambda _: None)
        study = optuna.load_study(study_name=name, storage=url)
        assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
        assert result.best[0]["number"] == study.best_trial.number
    finally:
        optuna.delete_study(study_name=name, storage=url)


def _dry_run(study, store: str) -> str:
    from ablations.sweep.preview import dry_run

    lines: list[str] = []
    dry_run(study, tracking_uri=store, claims_url=None, reuse_any_code=False, out=lines.append)
    return "\n".join(lines)


def test_a_trial_of_several_seeds_is_told_the_mean_of_its_runs(tmp_path, store, local_ray):
    """seeds_per_trial: each trial trains the base's seed and the next ones, each its own MLflow run, and Optuna is
    told their mean (a learning rate chosen on one seed's noise is what a tuned panel must not rest on)."""
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    spec = load_search(
        write_spec(tmp_path, base={**TINY, "seed": 5}, n_trials=2, seeds_per_trial=3, budget={"steps": 30})
    )
    assert spec.pruner == "none"  # its default with several seeds: a pruner judges one run's curve
    run_search(spec, tracking_uri=store, storage=storage, num_cpus=2, out=lambda line: None)
    study = optuna.load_study(study_name="srch", storage=storage)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    c = MlflowClient(store)
    runs = c.search_runs([c.get_experiment_by_name("srch").experiment_id], f"tags.kind = '{KIND_TRIAL}'")
    for t in study.trials:
        mine = [r for r in runs if r.data.tags["trial"] == str(t.number)]
        assert sorted(int(r.data.params["seed"]) for r in mine) == [5, 6, 7]
        assert all(float(r.data.params["training.lr"]) == pytest.approx(t.params["training.lr"]) for r in mine)
        losses = [r.data.metrics["final/val_loss"] for r in mine]
        assert len(set(losses)) == 3  # three seeds, three results
        assert t.value == pytest.approx(sum(losses) / 3, rel=1e-9)
        assert {r.data.tags["optuna_state"] for r in mine} == {"COMPLETE"}


def test_a_trial_of_several_seeds_regenerates_data_that_follows_the_seed():
    """A tuned study with ``vary_data`` sets the task's data_seed to the tuning seed: each of the trial's seeds then
    gets its own data, as a cell of that seed would; data given a seed of its own keeps it."""
    from ablations.search.trial import TrialTask, seed_runs

    def runs(task: dict) -> list[tuple[int, int]]:
        t = TrialTask.__new__(TrialTask)
        t.run_data, t.seeds_per_trial = {"seed": 4, "task": task}, 3
        return [(r["seed"], r["task"]["data_seed"]) for r in seed_runs(t)]

    assert runs({"name": "reverse", "data_seed": 4}) == [(4, 4), (5, 5), (6, 6)]
    assert runs({"name": "reverse", "data_seed": 0}) == [(4, 0), (5, 0), (6, 0)]


def test_a_pruner_is_refused_beside_several_seeds_per_trial(tmp_path):
    with pytest.raises(SpecError) as err:
        load_search(write_spec(tmp_path, seeds_per_trial=3, pruner="median"))
    assert err.value.key == "pruner" and "set pruner: none" in str(err.value), str(err.value)


def tuned_study_here(tmp_path: Path, monkeypatch, concurrency: int = 1, **extra) -> tuple[Path, str]:
    """A tuned study of Pre- against Post-LN (three random trials of the learning rate per variant) in
    ``tmp_path``, the working folder, with its Optuna storage there: the file and the storage's URL."""
    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    monkeypatch.setenv("ABLATE_OPTUNA_STORAGE", storage)
    tune = {"space": SPACE, "n_trials": 3, "sampler": "random", "pruner": "none", "concurrency": concurrency}
    study = {"name": "tuned", "base": TINY, "design": {"grid": {"model.norm": ["pre", "post"]}}, **extra}
    path = tmp_path / "tuned.yaml"
    path.write_text(yaml.safe_dump({**study, "metric": "test/exact_match", "direction": "maximize", "tune": tune}))
    return path, storage


def test_a_tuned_study_given_more_seeds_tunes_again_on_its_new_tuning_seed(tmp_path, monkeypatch):
    """The tuning seed is one above the study's largest: given more seeds, the old tuning seed may be a cell's. The
    searches were named without it, so the old ones were found complete and their values, chosen on what is now a
    cell's seed, were judged on it (a reviewer's finding): each tuning seed has its own searches."""
    from ablations.search.tuned import tuning_seed, variant_searches
    from record.spec import load_study

    path, _ = tuned_study_here(tmp_path, monkeypatch, seeds=2)
    two = load_study(path)
    names = {spec.name for _, spec in variant_searches(two)}
    assert tuning_seed(two) == 2 and names == {"tuned.tune.norm_pre.seed2", "tuned.tune.norm_post.seed2"}
    three = load_study(path, seeds=[0, 1, 2])
    assert tuning_seed(three) == 3 and not names & {spec.name for _, spec in variant_searches(three)}
    assert {spec.base["seed"] for _, spec in variant_searches(three)} == {3}


def test_a_tuned_study_of_several_seeds_per_trial_tunes_on_seeds_no_cell_uses(tmp_path, monkeypatch):
    """``tune.seeds_per_trial: 3``: each search trains the tuning seed and the two after it, all above every
    cell's seed; the searches are named for the three (a one-seed search of the same study is another study)."""
    from ablations.search.tuned import tuned_on, variant_searches
    from record.spec import load_study

    path, _ = tuned_study_here(tmp_path, monkeypatch, seeds=2)
    data = yaml.safe_load(path.read_text())
    data["tune"]["seeds_per_trial"] = 3
    path.write_text(yaml.safe_dump(data))
    study = load_study(path)
    searches = [spec for _, spec in variant_searches(study)]
    assert {s.name for s in searches} == {"tuned.tune.norm_pre.seeds2-4", "tuned.tune.norm_post.seeds2-4"}
    assert {(s.base["seed"], s.seeds_per_trial) for s in searches} == {(2, 3)}
    assert not set(range(2, 5)) & set(study.seeds)
    assert tuned_on(study) == "seeds 2-4, the mean of 3 per trial"


def test_the_dry_run_of_a_tuned_study_says_what_would_stop_a_variants_search(tmp_path, store, monkeypatch, capsys):
    """A variant's search whose study was created with other objectives: the dry run said only the storage's line
    (the problem was dropped) and exited 0, where the search's own dry run exits 1."""
    from ablate.main import main

    path, storage = tuned_study_here(tmp_path, monkeypatch)
    other = optuna.create_study(study_name="tuned.tune.norm_pre.seed1", storage=storage)
    other.set_user_attr("objectives", [["test/loss", "minimize"]])  # another search's, of the same name
    assert main(["sweep", str(path), "--dry-run", "--tracking-uri", store]) == 1
    out, err = capsys.readouterr()
    said = "the Optuna study 'tuned.tune.norm_pre.seed1' in " + storage + " was created with objectives"
    assert f"  it would stop: {said}" in out, out  # under the variant's search, beside what its storage holds
    assert f"error: variant 'norm=pre''s search: {said}" in err, err
    assert "norm_post" not in err


@pytest.mark.slow
def test_a_tuned_ablation_tunes_each_variant_then_runs_its_best_over_the_seeds(tmp_path, store, monkeypatch, local_ray):
    from ablations.sweep import run_study
    from record.spec import load_study

    path, storage = tuned_study_here(tmp_path, monkeypatch, seeds=2, budget={"steps": 30}, concurrency=2)
    study = load_study(path)
    lines: list[str] = []
    dry = _dry_run(study, store)  # before: the searches ask every trial; the cells' ids wait for their values
    assert "4 cells, trained once every search has ended" in dry and "best for" not in dry, dry
    assert not (tmp_path / "optuna.db").exists()
    # the cells one at a time (one Tune actor imports torch and Lightning once); the searches two trials at once
    result = run_study(study, tracking_uri=store, num_cpus=2, max_concurrent=1, out=lines.append)
    assert result.complete and result.counts["finished"] == 4, "\n".join(lines)
    best = {}
    for variant in ("norm=pre", "norm=post"):  # one search per variant, with the same budget
        s = optuna.load_study(study_name=f"tuned.tune.{variant.replace('=', '_')}.seed2", storage=storage)
        assert sum(t.state == TrialState.COMPLETE for t in s.trials) == 3
        best[variant] = s.best_params["training.lr"]
    c = MlflowClient(store)
    cells = c.search_runs([c.get_experiment_by_name("tuned").experiment_id], "tags.kind = 'cell'")
    assert len(cells) == 4
    for run in cells:  # every cell trained at its variant's best learning rate
        lr = best[run.data.tags["variant"]]
        assert float(run.data.params["training.lr"]) == pytest.approx(lr)
        assert not any(k.startswith(("axis.", "tuned.")) for k in run.data.tags)  # its settings: in design.json
    tuning = c.get_experiment_by_name("tuned.tuning")  # the searches' runs, apart from the cells
    # tuned on a seed none of the cells uses (the value chosen on a seed is not judged on it)
    assert {r.data.params["seed"] for r in c.search_runs([tuning.experiment_id], "tags.kind = 'trial'")} == {"2"}
    assert {r.data.params["seed"] for r in cells} == {"0", "1"}
    parent = c.search_runs([c.get_experiment_by_name("tuned").experiment_id], "tags.kind = 'study'")[0]
    design = json.loads(Path(c.download_artifacts(parent.info.run_id, "design.json", str(tmp_path))).read_text())
    recorded = {v["name"]: v["settings"] for v in design["variants"]}  # a cell's settings, recorded once
    assert {v: float(recorded[v]["tuned:training.lr"]) for v in best} == pytest.approx(best)
    for variant, lr in best.items():  # each chosen value's place in its (log) range, and whether at its edge
        where = design["tuning"]["variants"][variant]["training.lr"]
        expected = (math.log(lr) - math.log(1e-5)) / (math.log(3e-2) - math.log(1e-5))
        assert where["position"] == pytest.approx(expected, abs=1e-3)
        assert where["edge"] == ("low" if expected <= 0.05 else "high" if expected >= 0.95 else None)
    from dashboards.render import to_markdown
    from dashboards.table import build
    from record.runs import load_runs

    table = build(load_runs(store, "tuned"))  # the ablation table says what each variant's search chose
    assert {r["variant"]: r["tuned"] for r in table.as_records()} == {v: f"lr={lr:.3g}" for v, lr in best.items()}
    assert "| variant | changed | tuned | success" in to_markdown(table)
    # the dry run says what the sweep then does: the searches have ended, each variant's best, every cell done (it
    # said "0 done, 4 to train": it planned the cells without their tuned values)
    dry = _dry_run(load_study(path), store)
    assert "4 cells, 4 done in MLflow, 0 to train" in dry, dry
    for variant, lr in best.items():
        assert f"best for {variant!r} (tuned on seed 2): training.lr={lr:.4g}" in dry, dry
    # the same command again: the searches are complete, the cells are the same: nothing trains
    searches = c.search_runs([tuning.experiment_id], "tags.kind = 'search'")
    again = run_study(load_study(path), tracking_uri=store, num_cpus=2, out=lines.append)
    assert again.parent_run_id is None
    # ... and the searches ask nothing: no Ray started for them, no parent run added (each added one before)
    assert sum("its storage holds all 3 trials; nothing to ask" in line for line in lines) == 2, "\n".join(lines)
    assert len(c.search_runs([tuning.experiment_id], "tags.kind = 'search'")) == len(searches) == 2
    assert len(c.search_runs([c.get_experiment_by_name("tuned").experiment_id], "tags.kind = 'cell'")) == 4


# --- faults and honest samplers (bookkeeping) ---------------------------------------------------------------


@pytest.mark.slow
def test_a_trial_whose_process_dies_on_every_attempt_is_failed_and_the_driver_survives(
    tmp_path, store, monkeypatch, local_ray
):
    """The trial's worker is SIGKILLed (as an out-of-memory kill would); Ray runs it again once; killed again, the
    trial is failed with the reason, its runs are ended (none left RUNNING), and the search goes on to the end."""
    from ablations.search import driver

    monkeypatch.setattr(driver, "SYSTEM_RETRIES", 1)
    spec = load_search(
        write_spec(tmp_path, n_trials=1, concurrency=1, pruner="none", budget={"steps": 5000}, sampler="random")
    )
    killer, killed = reliability.kill_while_training(store, "srch", f"tags.kind = '{KIND_TRIAL}'", times=2, timeout=300)
    lines: list[str] = []
    result = run_search(
        spec, tracking_uri=store, storage=f"sqlite:///{tmp_path / 'o.db'}", num_cpus=2, out=lines.append
    )
    killer.join(timeout=5)
    assert len(killed) == 2, "\n".join(lines)
    assert result.counts == {"FAIL": 1}, "\n".join(lines)
    runs = sorted(runs_of_kind(store, "srch", KIND_TRIAL), key=lambda r: r.info.start_time)
    assert [r.info.status for r in runs] == ["KILLED", "FAILED"]
    assert "run again" in runs[0].data.tags["status_detail"]
    assert "died on every attempt (2)" in runs[1].data.tags["status_detail"]
    assert any("died on every attempt" in line for line in lines)
    reliability.record(
        "a search trial whose worker is SIGKILLed on every attempt",
        "2 SIGKILLs (the attempt and its retry)",
        {"cells": 1, "lost": sum(r.info.status == "RUNNING" for r in runs), "duplicated": 0, "failed": 1},
    )


def test_samplers_are_honest(tmp_path):
    """The process that creates a study samples with the spec's seed; one that joins or resumes it with its own
    (two samplers with one seed propose the same trials); a small budget fits TPE's random startup, and a budget
    within it is called a random search; a diverged trial is told as the worst value seen, so TPE learns from it."""
    from ablations.search.driver import _open_study, describe_sampler
    from ablations.search.ledger import tell
    from ablations.search.setup import make_sampler

    url = f"sqlite:///{tmp_path / 'o.db'}"
    spec = load_search(write_spec(tmp_path, n_trials=8, sampler="tpe", seed=7))
    first, seed_1 = _open_study(spec, url, lambda line: None)
    _, seed_2 = _open_study(spec, url, lambda line: None)
    _, seed_3 = _open_study(spec, url, lambda line: None)
    assert seed_1 == 7 and len({seed_1, seed_2, seed_3}) == 3
    assert spec.startup_trials == 2 and "the first 2 trials random" in describe_sampler(spec)
    small = load_search(write_spec(tmp_path, n_trials=3, sampler="tpe", startup_trials=5))
    assert small.random_only and "this is a random search" in describe_sampler(small)
    # NSGA-II's population is fitted to the budget too: with Optuna's 50, 16 trials were its random first generation
    pareto = load_search(write_spec(tmp_path, n_trials=16, sampler="nsga2", pruner="none"))
    assert pareto.startup_trials == 4 and not pareto.random_only and "generations of 4" in describe_sampler(pareto)
    generations = optuna.create_study(sampler=make_sampler(pareto))
    for _ in range(8):
        t = generations.ask()
        generations.tell(t, t.suggest_float("x", 0, 1))
    assert [t.system_attrs["NSGAIISampler:generation"] for t in generations.trials] == [0] * 4 + [1] * 4
    one = load_search(write_spec(tmp_path, n_trials=16, sampler="nsga2", pruner="none", startup_trials=20))
    assert one.random_only and "this is a random search" in describe_sampler(one)
    two = [{"metric": "final/val_loss"}, {"metric": "cost/tokens_per_s"}]  # nsga2 by default: a population of 1
    with pytest.raises(SpecError, match="startup_trials: is NSGA-II's population"):
        load_search(write_spec(tmp_path, objectives=two, pruner="none", sampler=None, startup_trials=1))
    # a diverged trial is told as the worst value any completed trial reached
    for value in (0.5, 2.5):
        trial = first.ask()
        tell(first, trial.number, {"status": "finished", "values": [value]}, spec)
    diverged = first.ask()
    assert tell(first, diverged.number, {"status": "diverged", "values": [None]}, spec).startswith("COMPLETE")
    assert first.trials[diverged.number].value == math.nextafter(2.5, math.inf)  # just worse than the worst
    failing = load_search(write_spec(tmp_path, name="f", diverged="fail"))
    late = first.ask()
    assert tell(first, late.number, {"status": "diverged", "values": [None]}, failing) == "FAIL"


def test_the_highest_value_a_stepped_range_can_propose_is_its_high_edge():
    """A step that does not divide the range leaves its high end out of reach: 0-200 in steps of 75 proposes 0, 75
    and 150, and a search that chose 150 chose the largest value it could (the optimum may lie beyond)."""
    from ablations.search.tuned import position
    from record.spec.space import Param

    stepped = Param(type="int", low=0, high=200, step=75)
    assert (position(stepped, 150)["edge"], position(stepped, 75)["edge"], position(stepped, 0)["edge"]) == (
        "high",
        None,
        "low",
    )
    assert position(Param(type="float", low=0.0, high=0.5, step=0.15), 0.45)["edge"] == "high"
    assert position(Param(type="float", low=1e-4, high=1e-2, log=True), 1e-3)["edge"] is None
    assert position(Param(type="int", low=1, high=100), 99)["edge"] == "high"  # within 5% of the end, as before


def test_two_processes_asking_the_last_trial_at_once_run_it_once(tmp_path):
    """Counting the trials and asking one are two steps: two processes that both counted n - 1 both asked, and the
    search ran n + 1 trials (a reviewer's two processes: 7 of 6, once in 6 runs). The later-numbered one is the
    surplus: failed with a mark, not counted, and both processes agree which."""
    from ablations.search.driver import _open_study
    from ablations.search.ledger import SURPLUS_ATTR, counted_trials, surplus, tell

    spec = load_search(write_spec(tmp_path, n_trials=3, pruner="none"))
    url = f"sqlite:///{tmp_path / 'o.db'}"
    a, _ = _open_study(spec, url, lambda line: None)
    b, _ = _open_study(spec, url, lambda line: None)  # another process on the same storage
    for _ in range(2):
        t = a.ask()
        tell(a, t.number, {"status": "finished", "values": [1.0]}, spec)
    assert counted_trials(a) == counted_trials(b) == 2  # both may ask one more
    mine, theirs = a.ask(), b.ask()
    assert [surplus(s, t.number, 3) for s in (a, b) for t in (mine, theirs)] == [False, True, False, True]
    theirs.set_user_attr(SURPLUS_ATTR, True)
    b.tell(theirs, state=optuna.trial.TrialState.FAIL)
    assert counted_trials(a) == 3 and not surplus(a, mine.number, 3)


@pytest.mark.parametrize("direction", ["minimize", "maximize"])
def test_a_diverged_trial_is_never_the_best(tmp_path, direction):
    """With one completed trial, a diverged one told its value tied with it: Optuna's best_trials held both, the
    diverged first (the lower number), and a tuned study ran its cells at the parameters that diverged."""
    from ablations.search.driver import _open_study
    from ablations.search.ledger import tell
    from ablations.search.results import best_trials

    metric = "final/val_loss" if direction == "minimize" else "final/val_token_acc"
    spec = load_search(write_spec(tmp_path, name=direction, metric=metric, n_trials=4, pruner="none"))
    study, _ = _open_study(spec, f"sqlite:///{tmp_path / 'o.db'}", lambda line: None)
    diverging, finishing = study.ask(), study.ask()  # the first diverges after the second finished
    tell(study, finishing.number, {"status": "finished", "values": [0.7]}, spec)
    assert tell(study, diverging.number, {"status": "diverged", "values": [None]}, spec).startswith("COMPLETE")
    assert [b["number"] for b in best_trials(study, spec)] == [finishing.number]


@pytest.mark.parametrize("name", ["successive_halving", "hyperband", "wilcoxon"])
def test_every_pruner_waits_for_the_warm_up_trials_and_steps(name):
    """The README: pruners judge no trial before pruner_warmup {trials, steps}. Optuna's successive halving,
    Hyperband and Wilcoxon have no such warm-up of their own: successive halving pruned the second of eight trials
    with none completed, Wilcoxon a trial at step 4 of a warm-up of 10. After the warm-up they prune."""
    from ablations.search import make_pruner

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(pruner=make_pruner(name, 2, 10), sampler=optuna.samplers.RandomSampler(seed=0))
    early = []
    for i in range(8):  # nothing completed yet: eight trials at once, ever worse, at and past the warm-up step
        t = study.ask()
        for step in range(1, 41):
            t.report(float(i) + step, step)
        early.append(t.should_prune())
    assert not any(early)
    for _ in range(2):  # the warm-up trials complete with a low loss at every step
        t = study.ask()
        for step in range(1, 41):
            t.report(0.01, step)
        study.tell(t, 0.01)
    late = study.ask()
    judged = {}
    for step in range(1, 41):  # far worse than the completed trials at every step
        late.report(100.0 + step, step)
        judged[step] = late.should_prune()
    assert not any(v for step, v in judged.items() if step < 10), judged
    assert any(judged.values()) or name == "hyperband", judged  # Hyperband compares within a bracket: maybe not


def test_the_pruner_waits_for_the_warm_up_stated_in_the_file(tmp_path):
    """pruner_warmup: {trials, steps}: no trial is judged before `steps` (default: the first validation)."""
    from ablations.search import make_pruner
    from ablations.search.trial import TrialTask, pruning_hooks
    from ablations.train import StopTraining
    from record.spec import Resources

    spec = load_search(write_spec(tmp_path, pruner="median", pruner_warmup={"trials": 1, "steps": 20}))
    assert (spec.warmup_trials, spec.warmup_steps) == (1, 20)
    assert load_search(write_spec(tmp_path, name="d", pruner="median")).warmup_steps == TINY["training"]["val_every"]
    url = f"sqlite:///{tmp_path / 'p.db'}"
    study = optuna.create_study(study_name="p", storage=open_storage(url), pruner=make_pruner("median", 1, 20))
    done = study.ask()
    for step in (10, 20, 30):
        done.report(1.0, step)
    study.tell(done, 1.0)
    trial = study.ask()
    task = TrialTask(
        spec_name="p", storage=url, number=trial.number, params={}, run_data={}, uri="", experiment="",
        parent_run_id="", objectives=[("final/val_loss", "minimize")], prune_on="val/loss", pruner="median",
        code={}, resources=Resources(), ray_storage=str(tmp_path), warmup_trials=1, warmup_steps=20,
    )  # fmt: skip
    (hook,) = pruning_hooks(task, last_step=100)
    hook(10, {"val/loss": 9.0})  # far worse, but inside the warm-up: not judged
    with pytest.raises(StopTraining):
        hook(20, {"val/loss": 9.0})


def test_a_progress_line_never_shows_a_trial_longer_than_the_search(tmp_path):
    # "[12s] trial 0 complete in 13s": the search's time was truncated and the trial's rounded
    from ablations.search.driver import progress_line

    spec = load_search(write_spec(tmp_path))
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'o.db'}", study_name=spec.name)
    trial = study.ask()
    study.tell(trial, 0.5)
    result = {"values": [0.5], "status": "FINISHED"}
    line = progress_line(study, spec, 0, "COMPLETE", result, 12.6, 0, time.monotonic() - 12.7)
    assert line.startswith("[13s] trial 0 complete final/val_loss=0.5 in 13s;"), line
