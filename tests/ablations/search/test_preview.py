"""``ablate search SPEC --dry-run``: the space, the trials and what the Optuna storage already holds, read back
through Optuna's own API; nothing started, nothing written (files, tables and databases compared before and
after)."""

from __future__ import annotations

import hashlib
import os
import socket
import sqlite3
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from ablate.main import main
from tests.conftest import fresh_postgres_database, postgres_reachable

SEARCH = {
    "name": "srch",
    "base": {
        "task": {"name": "reverse", "train_size": 300, "max_len": 5},
        "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
    },
    "space": {
        "training.lr": {"type": "float", "low": 1.0e-5, "high": 3.0e-2, "log": True},
        "model.n_heads": {"type": "int", "low": 1, "high": 4, "when": {"model.norm": "pre"}},
        "model.norm": {"type": "categorical", "choices": ["pre", "post"]},
    },
    "n_trials": 6,
    "sampler": "random",
    "budget": {"steps": 40},
}


def dry_run(tmp_path: Path, capsys, *extra: str, spec: dict | None = None) -> tuple[int, str, str]:
    path = tmp_path / "srch.yaml"
    path.write_text(yaml.safe_dump(spec or SEARCH, sort_keys=False))
    code = main(["search", str(path), "--dry-run", *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def everything_in(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def test_a_dry_run_says_the_space_the_trials_and_the_metrics_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ABLATE_OPTUNA_STORAGE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    code, out, err = dry_run(tmp_path, capsys, "--n-trials", "8")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "search 'srch': random sampler, median pruner; 8 trials, 1 at a time"  # --n-trials counts
    assert lines[1] == "each trial: 1 CPU; budget {'steps': 40}; objective final/val_loss (minimize)"
    assert lines[2:6] == [
        "space:",
        "  training.lr    float from 1e-05 to 0.03, log scale",
        "  model.norm     categorical, one of ['pre', 'post']",  # a condition before what it conditions
        "  model.n_heads  int from 1 to 4; only when model.norm == 'pre'",
    ]
    logged = lines[6].removeprefix("the runs log: ").split(", ")
    assert "final/val_loss" in logged and logged[-1] == "cost/*"
    assert logged.index("test/error_at_2") < logged.index("test/error_at_6")  # numbers in their order
    assert logged.index("test_long/error_at_9") < logged.index("test_long/error_at_10")
    assert f"Optuna storage sqlite:///{tmp_path}/.ablate/optuna.db: not there yet" in out
    assert "every trial of 8 to ask" in out
    assert f"MLflow: experiment 'srch' in sqlite:///{tmp_path}/.ablate/mlflow.db (no store yet" in out
    assert sorted(os.listdir(tmp_path)) == ["srch.yaml"]  # no .ablate, no database, no Ray


def test_a_dry_run_reads_what_the_storage_holds_and_leaves_it_as_it_was(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="srch", storage=url)
    study.set_user_attr("objectives", [["final/val_loss", "minimize"]])
    study.tell(study.ask(), 1.0)
    study.tell(study.ask(), state=TrialState.PRUNED)
    study.tell(study.ask(), state=TrialState.FAIL)
    lost = study.ask()  # left RUNNING by a search process of this machine that no longer exists
    lost.set_user_attr("ablate:host", socket.gethostname())
    lost.set_user_attr("ablate:pid", 2**22 + 1)  # above Linux's largest pid: no such process
    before = everything_in(tmp_path)
    code, out, err = dry_run(tmp_path, capsys, "--storage", url, "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}")
    assert code == 0, err
    # Optuna's own account, as the search counts it: 4 asked, each counts; the lost one is failed and asked
    # again when the search starts, and its retry counts instead
    states = sorted(t.state.name.lower() for t in optuna.load_study(study_name="srch", storage=url).trials)
    assert states == ["complete", "fail", "pruned", "running"]
    assert (
        f"Optuna storage {url}: study 'srch' holds 1 complete, 1 fail, 1 pruned, 1 running; 3 of 6 to ask "
        "(1 left running by a process that stopped or whose heartbeat did: failed, and asked again)"
    ) in out
    assert "(no store yet: the search creates it)" in out
    assert everything_in(tmp_path) == {**before, "srch.yaml": everything_in(tmp_path)["srch.yaml"]}


def test_a_dry_run_names_what_would_stop_the_search(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="srch", storage=url, direction="maximize")
    study.set_user_attr("objectives", [["test/exact_match", "maximize"]])
    code, out, err = dry_run(tmp_path, capsys, "--storage", url)
    assert code == 1
    assert err.strip() == (
        f"error: the Optuna study 'srch' in {url} was created with objectives [['test/exact_match', 'maximize']]; "
        "this spec has [('final/val_loss', 'minimize')]: give the search another name"
    )
    # every one of them at once, as the search's other checks (a trial the local Ray could never hold): it said one
    code, out, err = dry_run(
        tmp_path, capsys, "--storage", url, "--cpus", "1", spec={**SEARCH, "resources": {"cpus": 2}}
    )
    lines = err.splitlines()
    assert code == 1 and len(lines) == 2, err
    assert lines[0].startswith("error: the Optuna study 'srch' in ") and lines[1].startswith(
        "error: each trial needs 2 CPUs (resources.cpus), but the local Ray has 1"
    ), err
    not_a_database = tmp_path / "notes.txt"
    not_a_database.write_text("not a database\n" * 100)
    code, _, err = dry_run(tmp_path, capsys, "--storage", f"sqlite:///{not_a_database}")
    assert code == 1 and err.strip().endswith(
        "cannot be opened (file is not a database): check it, or name the right one (--storage, ABLATE_OPTUNA_STORAGE)"
    ), err  # the search itself said it with a traceback (a DatabaseError is no OperationalError)
    assert not_a_database.read_text() == "not a database\n" * 100


def test_a_database_without_optunas_tables_is_left_without_them(tmp_path, capsys):
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as conn:  # a database of something else: the search would add Optuna's tables
        conn.execute("create table notes (body text)")
    code, out, err = dry_run(tmp_path, capsys, "--storage", f"sqlite:///{db}")
    assert code == 0, err
    assert "no Optuna tables yet (the search makes them); every trial of 6 to ask" in out
    with sqlite3.connect(db) as conn:
        assert [r[0] for r in conn.execute("select name from sqlite_master")] == ["notes"]


def test_a_journal_storage_is_read_too(tmp_path, capsys):
    from optuna.storages.journal import JournalFileBackend

    journal = tmp_path / "srch.log"
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(journal)))
    study = optuna.create_study(study_name="srch", storage=storage)
    study.tell(study.ask(), 0.5)
    with journal.open("a") as f:  # a line another process is writing: not judged
        f.write('{"op_code": ')
    size = journal.stat().st_size
    code, out, err = dry_run(tmp_path, capsys, "--storage", f"journal:{journal}")
    assert code == 0, err
    assert f"Optuna storage journal:{journal}: study 'srch' holds 1 complete; 5 of 6 to ask" in out
    assert journal.stat().st_size == size


@pytest.mark.skipif(not postgres_reachable(), reason="no PostgreSQL reachable on 127.0.0.1:5432")
def test_a_new_postgresql_database_gets_no_tables_from_a_dry_run(tmp_path, capsys):
    import sqlalchemy

    with fresh_postgres_database("ablate_preview") as url:
        code, out, err = dry_run(tmp_path, capsys, "--storage", url)
        assert code == 0, err
        assert "no Optuna tables yet (the search makes them)" in out
        engine = sqlalchemy.create_engine(url)
        try:
            assert sqlalchemy.inspect(engine).get_table_names() == []
        finally:
            engine.dispose()


@pytest.mark.parametrize(
    "argv",
    [
        ["search", "s.yaml", "--n-trials", "0"],
        ["search", "s.yaml", "--cpus", "-1"],
        ["sweep", "s.yaml", "--max-concurrent", "0"],
        ["sweep", "s.yaml", "--cpus", "two"],
        ["report", "abl", "--submission", "0"],
        ["demo", "--steps", "0"],
    ],
)
def test_counts_below_one_are_refused_by_name(argv, capsys):
    from ablate.main import build_parser

    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    assert f"argument {argv[-2]}: {argv[-1]!r}: give a whole number from 1 up" in capsys.readouterr().err


def test_several_objectives_are_named_as_such(tmp_path, capsys):
    spec = {**SEARCH, "sampler": "nsga2", "objectives": [
        {"metric": "test/exact_match", "direction": "maximize"}, {"metric": "cost/tokens_per_s", "direction": "maximize"}
    ]}  # fmt: skip
    code, out, err = dry_run(tmp_path, capsys, "--storage", f"journal:{tmp_path / 'j.log'}", spec=spec)
    assert code == 0, err
    assert "; objectives test/exact_match (maximize), cost/tokens_per_s (maximize)" in out.splitlines()[1]
    assert not (tmp_path / "j.log").exists()


def test_lost_trials_are_counted_as_the_search_will_count_them(tmp_path, capsys):
    """A trial whose heartbeat stopped (its process was on another machine) is failed and asked again when the
    search starts, once: the dry run's account is what the driver then does to a copy of the same storage."""
    import shutil
    from datetime import datetime, timedelta

    from ablations.search.driver import _open_study
    from ablations.search.ledger import counted_trials
    from ablations.search.setup import open_storage
    from record.spec import load_search

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="srch", storage=open_storage(url))
    study.tell(study.ask(), 1.0)
    elsewhere = study.ask()
    elsewhere.set_user_attr("ablate:host", "another-machine")
    study._storage.record_heartbeat(elsewhere._trial_id)
    with sqlite3.connect(tmp_path / "optuna.db") as conn:  # its last heartbeat an hour ago
        conn.execute("update trial_heartbeats set heartbeat = ?", (datetime.now() - timedelta(hours=1),))
    code, out, err = dry_run(tmp_path, capsys, "--storage", url)
    assert code == 0, err
    assert "holds 1 complete, 1 running; 5 of 6 to ask (1 left running by a process that stopped or whose" in out
    shutil.copy(tmp_path / "optuna.db", tmp_path / "copy.db")
    spec = load_search(tmp_path / "srch.yaml")
    started, _ = _open_study(spec, f"sqlite:///{tmp_path / 'copy.db'}", out=lambda _: None)
    assert [t.state for t in started.trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.WAITING]
    assert spec.n_trials - counted_trials(started) == 5


def test_a_storage_spelled_another_way_is_read_and_never_made(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = dry_run(tmp_path, capsys, "--storage", "sqlite+pysqlite:///plus.db")
    assert code == 0, err
    assert "Optuna storage sqlite+pysqlite:///plus.db: not there yet" in out and not (tmp_path / "plus.db").exists()
    study = optuna.create_study(study_name="srch", storage="sqlite:///q.db")
    study.tell(study.ask(), 1.0)
    code, out, err = dry_run(tmp_path, capsys, "--storage", "sqlite:///q.db?timeout=5")
    assert code == 0, err
    assert "study 'srch' holds 1 complete; 5 of 6 to ask" in out


def test_another_programs_database_is_named_by_the_dry_run_and_refused_by_the_search_untouched(tmp_path, capsys):
    from mlflow import MlflowClient

    from ablations.search.driver import _open_study
    from record.spec import load_search

    url = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(url).search_experiments()  # an MLflow store: MLflow's Alembic revision in alembic_version
    capsys.readouterr()  # MLflow's lines about making it
    with sqlite3.connect(tmp_path / "mlflow.db") as conn:
        tables = sorted(r[0] for r in conn.execute("select name from sqlite_master where type = 'table'"))
    said = "is another program's database (it has an alembic_version table, not Optuna's): give Optuna its own"
    code, _, err = dry_run(tmp_path, capsys, "--storage", url)
    assert (code, err.strip()) == (1, f"error: the Optuna storage {url} {said}")
    with pytest.raises(ValueError, match="another program's database"):  # Optuna's own words: "pip install -U"
        _open_study(load_search(tmp_path / "srch.yaml"), url, out=lambda _: None)
    with sqlite3.connect(tmp_path / "mlflow.db") as conn:  # no Optuna tables added to it
        assert sorted(r[0] for r in conn.execute("select name from sqlite_master where type = 'table'")) == tables


def test_what_the_search_checks_before_it_starts_the_dry_run_checks(tmp_path, capsys):
    code, _, err = dry_run(tmp_path, capsys, "--address", "10.1.2.3:6379", "--storage", f"sqlite:///{tmp_path}/o.db")
    assert (
        code == 1
        and "the Ray cluster at 10.1.2.3:6379 cannot write to sqlite:///" in err
        and "which only this machine reaches" in err
    )
    code, _, err = dry_run(tmp_path, capsys, "--cpus", "1", spec={**SEARCH, "resources": {"cpus": 2}})
    assert code == 1 and "each trial needs 2 CPUs (resources.cpus), but the local Ray has 1" in err
    journal = tmp_path / "other.log"
    journal.write_text('{"x": 1}\n')  # JSON lines, but not Optuna's journal
    code, _, err = dry_run(tmp_path, capsys, "--storage", f"journal:{journal}")
    assert code == 1 and err.strip().endswith("cannot be read: 'op_code' (KeyError)"), err
    journal.write_text("not JSON\n")  # Optuna reads past it (a line being written); the search's first write would not
    code, _, err = dry_run(tmp_path, capsys, "--storage", f"journal:{journal}")
    assert code == 1 and err.strip().endswith("is not an Optuna journal: its line 1 is not JSON"), err
    from ablations.search.driver import _open_study
    from record.spec import load_search

    with pytest.raises(ValueError, match="is not an Optuna journal: its line 1 is not JSON"):  # the search too
        _open_study(load_search(tmp_path / "srch.yaml"), f"journal:{journal}", out=lambda _: None)
    assert journal.read_text() == "not JSON\n"  # before it wrote a line after it
