"""A researcher's own components, tasks and warnings (models/plugins.py, docs/plugins.md): loaded by the three
spellings before anything is validated, entering the identity of exactly the cells that use them, recorded with each
run, carried to every node of a cluster, and a worker that cannot load one stopping the submission with one message,
never a result of a variant."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from models import plugins
from models.config import ConfigError, ModelConfig
from record import vocabulary
from record.spec import SpecError, load_run, load_study
from tests.conftest import ROOT
from tests.ray_nodes import ray_cluster

EXAMPLE = ROOT / "examples" / "neg-distance-plugin"
SCORE = """
from models.attention import SCORES, Score


@SCORES.register("{name}")
class Score_{name}(Score):
    dot_like = False

    def scores(self, q, k, heads=slice(None)):
        return {expression}
"""
TINY = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32}
REVERSE = {"name": "reverse", "max_len": 5, "train_size": 200, "val_size": 32, "test_size": 32}


@pytest.fixture(autouse=True)
def _forget_plugins():
    """Each test loads its own plugins; what they registered is taken back after it."""
    before = dict(plugins.LOADED)
    yield
    for module, plugin in list(plugins.LOADED.items()):
        if module in before:
            continue
        for kind, names in plugin.registered.items():
            for name in names:
                plugins.registries()[kind].unregister(name)
        plugins.LOADED.pop(module)
        sys.modules.pop(module, None)
    plugins.FAILED.clear()


def score_file(folder: Path, name: str, expression: str = "-(q[..., :, None, :] - k[..., None, :, :]).pow(2).sum(-1)"):
    path = folder / f"{name}.py"
    path.write_text(SCORE.format(name=name, expression=expression))
    return path


def study_file(folder: Path, plugin: str, scores=("dot", "ndist_a"), steps: int = 4, name: str = "plugged") -> Path:
    data = {
        "name": name,
        "plugins": [plugin],
        "base": {"task": REVERSE, "model": TINY, "training": {"batch_size": 16, "val_every": steps}},
        "design": {"grid": {"model.score": list(scores)}},
        "seeds": 2,
        "budget": {"steps": steps},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# --- loading -----------------------------------------------------------------------------------------------------


def test_a_plugin_file_named_by_a_run_file_is_loaded_before_the_run_is_checked(tmp_path):
    (tmp_path / "ideas").mkdir()
    score_file(tmp_path / "ideas", "ndist_a")
    run = tmp_path / "run.yaml"
    run.write_text(
        yaml.safe_dump({"plugins": ["ideas/ndist_a.py"], "task": REVERSE, "model": {**TINY, "score": "ndist_a"}})
    )
    resolved = load_run(run)
    plugin = plugins.LOADED["ndist_a"]
    assert resolved.model.score == "ndist_a" and plugin.registered == {"score": ["ndist_a"]}
    assert plugin.path == str((tmp_path / "ideas" / "ndist_a.py").resolve())  # relative to the file that names it
    assert resolved.plugins == {"ndist_a": plugin.digest}


def test_a_package_folder_is_a_plugin_and_its_every_file_is_in_its_digest(tmp_path):
    pkg = tmp_path / "my_ideas"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from my_ideas import scores  # noqa\n")
    (pkg / "scores.py").write_text(SCORE.format(name="ndist_pkg", expression="q @ k.transpose(-1, -2)"))
    (plugin,) = plugins.load([str(pkg)])
    assert plugin.module == "my_ideas" and set(plugin.files) == {"__init__.py", "scores.py"}
    assert plugin.registered == {"score": ["ndist_pkg"]}
    before = plugin.digest
    (pkg / "scores.py").write_text((pkg / "scores.py").read_text() + "\n# an edit\n")
    assert plugins._digest(plugins.source_files(sys.modules["my_ideas"])) != before


def test_refusals_name_the_plugin_and_the_fix(tmp_path):
    with pytest.raises(
        plugins.PluginError, match=r"plugin 'missing.py': no such file or folder .*relative to the file"
    ):
        plugins.load(["missing.py"], tmp_path, what="a.yaml")
    with pytest.raises(plugins.PluginError, match=r"plugin 'no_such_module_here' is not an installed module here"):
        plugins.load(["no_such_module_here"])
    (tmp_path / "broken.py").write_text("raise RuntimeError('the idea is not written yet')\n")
    with pytest.raises(
        plugins.PluginError, match=r"plugin 'broken.py' failed to import: RuntimeError: the idea is not"
    ):
        plugins.load(["broken.py"], tmp_path)
    (tmp_path / "json.py").write_text("")
    with pytest.raises(plugins.PluginError, match=r"would be imported as 'json', a module already loaded"):
        plugins.load(["json.py"], tmp_path)


def test_an_unknown_name_says_how_to_load_a_plugin_and_which_plugin_failed(tmp_path):
    (tmp_path / "almost.py").write_text("import numpy\nraise ValueError('a typo in the plugin')\n")
    with pytest.raises(plugins.PluginError):
        plugins.load(["almost.py"], tmp_path)
    with pytest.raises(ConfigError) as err:
        ModelConfig(score="almost_score")
    message = str(err.value)
    assert "valid: 'dot'" in message and "`plugins:`" in message and "--plugin" in message
    assert "almost.py (ValueError: a typo in the plugin)" in message
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({"task": {"name": "echo_task_of_mine"}}))
    with pytest.raises(SpecError, match=r"a task of your own is loaded by naming its module"):
        load_run(run)


def test_a_plugin_imported_while_the_config_loads_finds_no_half_made_module(tmp_path):
    """A registry hook that imports a plugin as soon as models.registry loads (what users tried) used to hit a
    circular import: models.patterns read models.config, half made at that point."""
    score_file(tmp_path, "ndist_hook")
    hook = tmp_path / "sitecustomize.py"
    hook.write_text(
        "import importlib.abc, importlib.machinery, sys\n"
        "class Hook(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name != 'models.registry':\n"
        "            return None\n"
        "        sys.meta_path.remove(self)\n"
        "        spec = importlib.machinery.PathFinder.find_spec(name, path)\n"
        "        run = spec.loader.exec_module\n"
        "        def exec_module(module):\n"
        "            run(module)\n"
        "            import ndist_hook  # noqa\n"
        "        spec.loader.exec_module = exec_module\n"
        "        return spec\n"
        "sys.meta_path.insert(0, Hook())\n"
    )
    code = "from models.config import ModelConfig; print(ModelConfig(score='ndist_hook').score)"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ndist_hook", out.stderr[-2000:]


# --- identity -------------------------------------------------------------------------------------------------------


def test_an_edited_plugin_moves_exactly_the_cells_that_use_it(tmp_path):
    score_file(tmp_path, "ndist_a")
    path = study_file(tmp_path, "ndist_a.py")
    first = {(c.variant, c.seed): c.cell_id for c in load_study(path).cells}
    (tmp_path / "ndist_a.py").write_text((tmp_path / "ndist_a.py").read_text().replace(".pow(2)", ".abs()"))
    plugins.LOADED.clear()  # a new command: the edited file is read again
    sys.modules.pop("ndist_a", None)
    from models.registry import SCORES

    SCORES.unregister("ndist_a")
    second = {(c.variant, c.seed): c.cell_id for c in load_study(path).cells}
    moved = {k for k in first if first[k] != second[k]}
    assert moved == {("score=ndist_a", 0), ("score=ndist_a", 1)}  # the dot cells keep their ids and results


# --- on Ray -----------------------------------------------------------------------------------------------------------


def ablate(*args: str, cwd: Path, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ABLATE_", "RAY_ADDRESS"))}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), (env or {}).pop("PYTHONPATH", None)]))
    cmd = [sys.executable, "-m", "ablate", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**environ, **(env or {})})


def cell_runs(store: str, study: str) -> list:
    c = MlflowClient(store)
    exp = c.get_experiment_by_name(study)
    return [] if exp is None else c.search_runs([exp.experiment_id], f"tags.kind = '{vocabulary.KIND_CELL}'")


@pytest.mark.slow
def test_a_plugin_file_only_the_driver_has_trains_on_every_node_of_a_cluster(tmp_path):
    """Two loopback nodes; the plugin sits in a folder no node's Python path holds. The driver loads it, it travels in
    Ray's runtime environment, and every worker imports Ray's copy (recorded with each run) and trains its cells."""
    ideas = tmp_path / "ideas"
    ideas.mkdir()
    score_file(ideas, "ndist_a")
    path = study_file(tmp_path, "ideas/ndist_a.py")
    store = f"sqlite:///{tmp_path}/mlflow.db"
    with ray_cluster(tmp_path, nodes=2, cpus_per_node=1, dashboard=False) as cluster:
        out = ablate("sweep", str(path), "--tracking-uri", store, "--address", cluster.address, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    runs = cell_runs(store, "plugged")
    assert sorted(vocabulary.cell_state(r) for r in runs) == ["finished"] * 4
    client = MlflowClient(store)
    for run in runs:
        if run.data.params.get("model.score") != "ndist_a":
            assert not any(k.startswith(vocabulary.TAG_PLUGIN_PREFIX) for k in run.data.tags)
            continue
        digest = run.data.tags[f"{vocabulary.TAG_PLUGIN_PREFIX}ndist_a"]
        local = client.download_artifacts(run.info.run_id, vocabulary.PLUGINS_ARTIFACT, str(tmp_path / run.info.run_id))
        (manifest,) = json.loads(Path(local).read_text())
        assert manifest["digest"] == digest and list(manifest["files"]) == ["ndist_a.py"]
        assert "runtime_resources" in manifest["imported_from"], manifest  # Ray's copy, not the driver's file
    assert len({r.data.tags[vocabulary.TAG_RAY_NODE] for r in runs}) == 2  # both nodes trained (two trials at once)


@pytest.mark.slow
def test_a_plugin_that_does_not_load_on_a_node_stops_the_submission_and_records_no_cell(tmp_path):
    """A failure no variant causes (here: the plugin reads a variable only the driver's environment has) is said once,
    naming the node and the fix, before any trial; the store holds no cell of the study."""
    (tmp_path / "picky.py").write_text(
        "import os\n"
        "if os.environ.get('ONLY_ON_THE_DRIVER') != '1':\n"
        "    raise ImportError('this node lacks what the plugin needs')\n"
        + SCORE.format(name="ndist_a", expression="q @ k.transpose(-1, -2)")
    )
    path = study_file(tmp_path, "picky.py")
    store = f"sqlite:///{tmp_path}/mlflow.db"
    with ray_cluster(tmp_path, nodes=1, cpus_per_node=2, dashboard=False) as cluster:
        out = ablate(
            "sweep", str(path), "--tracking-uri", store, "--address", cluster.address, cwd=tmp_path,
            env={"ONLY_ON_THE_DRIVER": "1"},
        )  # fmt: skip
    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "cannot load the plugins" in errors[0] and "this node lacks" in errors[0], out.stderr
    assert "fix that node's environment" in errors[0]
    assert cell_runs(store, "plugged") == []


@pytest.mark.slow
def test_the_example_package_installed_by_its_entry_point_runs_a_study_and_warns_in_the_report(tmp_path):
    """examples/neg-distance-plugin installed as a package (pip, into a folder of its own): no `plugins:` key and no
    --plugin, its entry point loads it in the driver and in every worker; its warning speaks in the report."""
    site = tmp_path / "site"
    pip = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "--target",
        str(site),
    ]
    subprocess.run([*pip, str(EXAMPLE)], check=True, capture_output=True, timeout=300)
    data = yaml.safe_load((EXAMPLE / "study.yaml").read_text())
    data.pop("plugins")
    data["base"]["task"].update(train_size=200, val_size=32, test_size=32)
    data["base"]["model"].update(head_dim=40)  # the plugin's warning speaks for heads wider than 32
    data["base"]["training"]["val_every"] = 4
    data.update(seeds=2, budget={"steps": 4})
    data["design"]["grid"]["model.score"] = ["dot", "neg_distance"]
    data["analysis"]["contrasts"]["pairs"] = [["score=neg_distance", "score=dot"]]
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    store = f"sqlite:///{tmp_path}/mlflow.db"
    env = {"PYTHONPATH": str(site)}
    out = ablate("sweep", str(path), "--tracking-uri", store, "--cpus", "2", cwd=tmp_path, env=dict(env))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert sorted(vocabulary.cell_state(r) for r in cell_runs(store, "neg_distance")) == ["finished"] * 4
    report = ablate(
        "report", "neg_distance", "--tracking-uri", store, "--out", str(tmp_path / "r"), cwd=tmp_path, env=dict(env)
    )
    assert report.returncode == 0, report.stderr[-3000:]
    assert "negative-distance scores at heads wider than 32" in (tmp_path / "r" / "table.md").read_text()


def test_a_ray_that_does_not_start_ends_in_one_line(tmp_path):
    """Ray's start failing (here: its temporary folder cannot be made, a file is in the way) is said in one line that
    says where to look, as every other error, not with Ray's traceback."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    code = (
        "import sys, tempfile; tempfile.tempdir = sys.argv[1]\n"
        "from ablations.cluster import RayStartError, connect\n"
        "try:\n    connect()\nexcept RayStartError as err:\n    print(err)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(blocker)], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 0 and len(lines) == 1, out.stdout + out.stderr[-2000:]
    assert lines[0].startswith("a local Ray (its logs: ") and "did not start" in lines[0] and "plugin" in lines[0]
