"""Run configurations: loaded from YAML, validated strictly, resolved against the task.

A run file has these sections (only ``task`` is required)::

    name: quickstart          # optional; names the MLflow run and, for single runs, the experiment
    seed: 0
    model:    {...}           # models.ModelConfig fields; vocab_size and n_classes default to the task's
    task:     {name: copy, ...}
    training: {...}           # models.lightning.TrainingConfig fields
    tracking: {experiment: ..., log_every: 10, checkpoint: false}   # operational: not in params or ids
    resources: {threads: 1}                                          # operational

Every problem is reported as one line that names the file, the key and what is valid, before anything
starts (``SpecError``).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from models.config import ConfigError, ModelConfig

SECTIONS = ("name", "seed", "model", "task", "training", "tracking", "resources")


class Loader(yaml.SafeLoader):
    """yaml.SafeLoader (no code, no arbitrary objects) that also reads 3e-4 as a float, not a string
    (YAML 1.1 wants 3.0e-4; researchers write 3e-4)."""


Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=Loader)  # noqa: S506  (Loader is a SafeLoader)


class SpecError(ValueError):
    """A configuration that cannot run: ``str(err)`` is one line naming the file, the key and the fix."""

    def __init__(self, source: str | None, key: str | None, message: str) -> None:
        self.source, self.key, self.message = source, key, message
        where = ": ".join(p for p in (source, key) if p)
        super().__init__(f"{where}: {message}" if where else message)


@dataclass(frozen=True)
class TrackingConfig:
    experiment: str | None = None  # default: the run's name, else "runs"
    log_every: int = 10  # steps between logged training metrics
    checkpoint: bool = False  # log the final weights as an artifact

    def __post_init__(self) -> None:
        if self.experiment is not None and (not isinstance(self.experiment, str) or not self.experiment.strip()):
            raise ConfigError(f"experiment={self.experiment!r} must be a non-empty string")
        if isinstance(self.log_every, bool) or not isinstance(self.log_every, int) or self.log_every < 1:
            raise ConfigError(f"log_every={self.log_every!r} must be a positive integer")
        if not isinstance(self.checkpoint, bool):
            raise ConfigError(f"checkpoint={self.checkpoint!r} must be true or false")


@dataclass(frozen=True)
class ResourcesConfig:
    threads: int | None = None  # torch threads; default: the CPUs given to the run (1 on a laptop run)

    def __post_init__(self) -> None:
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1
        ):
            raise ConfigError(f"threads={self.threads!r} must be a positive integer")


@dataclass(frozen=True)
class RunConfig:
    """A resolved run: every default filled in, everything checked."""

    task_spec: dict[str, Any]
    model: ModelConfig
    training: Any  # models.lightning.TrainingConfig (imported lazily: it pulls in lightning)
    seed: int = 0
    name: str | None = None
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)

    @property
    def task(self):
        from models.tasks import make_task

        return make_task(self.task_spec)

    def result_config(self) -> dict[str, Any]:
        """What determines the result: model, task, training and seed (not names, paths or resources)."""
        return {
            "seed": self.seed,
            "model": self.model.to_dict(),
            "task": dict(self.task_spec),
            "training": self.training.to_dict(),
        }

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, **self.result_config()}
        out["tracking"] = {f.name: getattr(self.tracking, f.name) for f in fields(self.tracking)}
        out["resources"] = {f.name: getattr(self.resources, f.name) for f in fields(self.resources)}
        return out

    def params(self) -> dict[str, Any]:
        from ablations.tracking import flatten

        return flatten(self.result_config())

    def config_hash(self) -> str:
        """Stable id of the result-affecting configuration (seed included)."""
        blob = json.dumps(self.result_config(), sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# --- loading ---------------------------------------------------------------------------------------


def _key_of(message: str) -> str | None:
    """The field a ConfigError message starts with ("window=8 requires ..." -> "window")."""
    m = re.match(r"([a-z_]+)(\[\d+\])?=", message)
    return m.group(1) if m else None


def _section(source: str | None, section: str, build, data: Any):
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(source, section, f"must be a mapping of keys to values (got {type(data).__name__})")
    try:
        return build(data)
    except ConfigError as err:
        key = _key_of(str(err))
        raise SpecError(source, f"{section}.{key}" if key else section, str(err)) from None
    except TypeError as err:  # a dataclass given a value it cannot take
        raise SpecError(source, section, str(err)) from None


def parse_overrides(overrides: list[str] | None, source: str | None = None) -> list[tuple[list[str], Any]]:
    """``["model.n_heads=8", "training.lr=3e-4"]`` -> [(["model", "n_heads"], 8), ...]; values are YAML."""
    out = []
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(source, "--set", f"{item!r} is not KEY=VALUE (for example --set model.n_heads=8)")
        path = key.strip().split(".")
        if path[0] not in SECTIONS:
            raise SpecError(source, key, f"unknown section {path[0]!r}; valid: {', '.join(SECTIONS)}")
        try:
            value = load_yaml(raw) if raw.strip() else None
        except yaml.YAMLError as err:
            raise SpecError(source, key, f"value {raw!r} is not valid YAML ({err.__class__.__name__})") from None
        out.append((path, value))
    return out


def apply_overrides(data: dict[str, Any], overrides: list[tuple[list[str], Any]]) -> dict[str, Any]:
    data = json.loads(json.dumps(data))  # a deep copy of plain YAML data
    for path, value in overrides:
        node = data
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[path[-1]] = value
    return data


def read_yaml(path: str | Path) -> dict[str, Any]:
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise SpecError(source, None, f"cannot read the file ({err.strerror or err})") from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(source, None, f"is not valid YAML{where}: {getattr(err, 'problem', err)}") from None
    if not isinstance(data, dict):
        raise SpecError(source, None, "must be a YAML mapping with the sections " + ", ".join(SECTIONS))
    return data


def resolve_run(data: dict[str, Any], source: str | None = None) -> RunConfig:
    """Check a run's sections and fill in what the task determines. Raises SpecError."""
    from models.lightning import TrainingConfig
    from models.tasks import make_task

    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise SpecError(source, unknown[0], f"unknown section; valid: {', '.join(SECTIONS)}")
    if "task" not in data:
        raise SpecError(source, "task", "is required (for example task: {name: copy})")
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SpecError(source, "seed", f"{seed!r} must be a non-negative integer")
    name = data.get("name")
    if name is not None and (not isinstance(name, str) or not re.fullmatch(r"[\w.\-]+", name)):
        raise SpecError(source, "name", f"{name!r} must be letters, digits, '_', '-' or '.'")

    task_spec = data["task"]
    task = _section(source, "task", make_task, task_spec)
    task_spec = task.to_dict()

    model_data = data.get("model") or {}
    if not isinstance(model_data, dict):
        raise SpecError(source, "model", f"must be a mapping of keys to values (got {type(model_data).__name__})")
    model_data = dict(model_data)
    arch = model_data.setdefault("arch", task.archs[0])
    if arch not in task.archs:
        raise SpecError(
            source,
            "model.arch",
            f"{arch!r} does not fit task {task.name!r}, which needs arch " + " or ".join(repr(a) for a in task.archs),
        )
    model_data.setdefault("vocab_size", task.vocab_size)
    if isinstance(model_data["vocab_size"], int) and model_data["vocab_size"] < task.vocab_size:
        raise SpecError(
            source,
            "model.vocab_size",
            f"{model_data['vocab_size']} is smaller than the vocabulary of "
            f"task {task.name!r} ({task.vocab_size}); remove it to use the task's",
        )
    if task.n_classes is not None:
        model_data.setdefault("n_classes", task.n_classes)
        if model_data["n_classes"] != task.n_classes:
            raise SpecError(
                source,
                "model.n_classes",
                f"{model_data['n_classes']} differs from the "
                f"{task.n_classes} classes of task {task.name!r}; remove it to use the task's",
            )
    if model_data.get("positions", "sinusoidal") == "learned":
        model_data.setdefault("max_len", max(512, task.max_length))
        if isinstance(model_data["max_len"], int) and model_data["max_len"] < task.max_length:
            raise SpecError(
                source,
                "model.max_len",
                f"{model_data['max_len']} is shorter than the longest sequence of "
                f"task {task.name!r} ({task.max_length}) for learned positions; raise it",
            )
    model = _section(source, "model", ModelConfig.from_dict, model_data)
    training = _section(source, "training", TrainingConfig.from_dict, data.get("training"))
    if training.sampling == "scheduled" and task.kind == "classify":
        raise SpecError(
            source,
            "training.sampling",
            f"'scheduled' feeds predictions back to a decoder; task "
            f"{task.name!r} trains an encoder classifier (use 'teacher_forcing')",
        )

    def build(cls):
        def make(d):
            names = {f.name for f in fields(cls)}
            bad = sorted(set(d) - names)
            if bad:
                raise ConfigError(f"unknown key(s) {bad}; valid keys: {sorted(names)}")
            return cls(**d)

        return make

    tracking = _section(source, "tracking", build(TrackingConfig), data.get("tracking"))
    resources = _section(source, "resources", build(ResourcesConfig), data.get("resources"))
    return RunConfig(
        task_spec=task_spec,
        model=model,
        training=training,
        seed=seed,
        name=name,
        tracking=tracking,
        resources=resources,
    )


def load_run(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read, override (``--set section.key=value``), check and resolve a run file."""
    source = str(path)
    data = apply_overrides(read_yaml(path), parse_overrides(overrides, source))
    return resolve_run(data, source)
