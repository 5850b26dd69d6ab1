"""Run files: loaded from YAML, validated strictly, resolved against the task.

A run file has these sections (only ``task`` is required)::

    name: quickstart          # optional; names the MLflow run and, for single runs, the experiment
    seed: 0
    model:    {...}           # models.ModelConfig fields; vocab_size and n_classes default to the task's
    task:     {name: copy, ...}
    training: {...}           # models.training.TrainingConfig fields
    tracking: {experiment: ..., log_every: 10, checkpoint: false}   # operational: not in params or ids
    resources: {threads: 1}                                          # operational

The file's structure is the pydantic model ``RunFile``; the ``model``, ``training`` and ``task`` sections are
checked by the configuration classes of ``models`` (which stay free of this package's dependencies). Every
problem is one line naming the file, the line, the key and the fix (``SpecError``), before anything starts.
A run file read with ``--set`` options is ``load_run`` (record/spec/overrides.py); the settings a run would not
read are refused by record/spec/unread.py.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from models.config import ConfigError, ModelConfig
from models.errors import did_you_mean, not_a_choice
from models.training import TrainingConfig
from record.spec.common import Origin, Strict, check_name, key_not_text, validate
from record.spec.configs import canonical, effective
from record.spec.errors import MAX_FOUND, SpecError, found, more, unknown_key_message
from record.spec.unread import read_by_the_run
from record.spec.yamlfile import Document, YamlFileError, read
from record.vocabulary import flatten

SECTIONS = ("name", "seed", "plugins", "model", "task", "training", "tracking", "resources")


class TrackingSection(Strict):
    experiment: str | None = Field(None, min_length=1)  # default: the run's name, else "runs"
    log_every: int = Field(10, ge=1)  # steps between logged training metrics
    checkpoint: bool = False  # log the final weights as an artifact


class ResourcesSection(Strict):
    threads: int | None = Field(None, ge=1)  # torch threads; default: the CPUs given to the run


class RunFile(Strict):
    """The sections of a run file (``model``, ``task`` and ``training`` are checked by ``resolve_run``)."""

    name: str | None = None
    seed: int = Field(0, ge=0, le=2**32 - 1)  # what torch, numpy and Lightning's seed_everything take
    plugins: list[str] = Field(default_factory=list)  # loaded by read_document, before anything is checked
    model: dict[str, Any] = Field(default_factory=dict)
    task: dict[str, Any]
    training: dict[str, Any] = Field(default_factory=dict)
    tracking: TrackingSection = TrackingSection()
    resources: ResourcesSection = ResourcesSection()

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        return check_name(v, "it names the MLflow run")

    @field_validator("model", "training", "tracking", "resources", "seed", "name", mode="before")
    @classmethod
    def _null_is_default(cls, v, info):  # "training:" with nothing under it is an empty section
        if v is None and info.field_name in ("model", "training"):
            return {}
        if v is None and info.field_name in ("tracking", "resources"):
            return {}
        return v


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """A resolved run: every default filled in, everything checked."""

    task_spec: dict[str, Any]
    model: ModelConfig
    training: TrainingConfig
    seed: int = 0
    name: str | None = None
    tracking: TrackingSection = field(default_factory=TrackingSection)
    resources: ResourcesSection = field(default_factory=ResourcesSection)
    # module -> source digest of the plugins whose components this run uses (models.plugins): part of its identity
    plugins: dict[str, str] = field(default_factory=dict)

    @property
    def task(self):
        from models.tasks import make_task

        return make_task(self.task_spec)

    def result_config(self) -> dict[str, Any]:
        """What determines the result: model, task, training and seed (not names, paths or resources), each value
        in one spelling (``canonical``), so that one run has one id."""
        out = {
            "seed": self.seed,
            "model": canonical(self.model),
            "task": dict(self.task_spec),
            "training": canonical(self.training),
        }
        return out | ({"plugins": dict(self.plugins)} if self.plugins else {})  # (none: the ids of before plugins)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, **self.result_config()}
        out["tracking"] = self.tracking.model_dump()
        out["resources"] = self.resources.model_dump()
        return out

    def params(self) -> dict[str, Any]:
        """MLflow's params: the seed, the task and every field of the model and the training as the run trains
        them (``effective``), what a reader compares runs by. The run's identity (``config_hash``) is
        ``result_config``, which writes a value that means the default as left out."""
        model, training = effective(self.model), effective(self.training)
        return flatten({"seed": self.seed, "model": model, "task": dict(self.task_spec), "training": training})

    def config_hash(self, workers: int = 1) -> str:
        """Stable id of the result-affecting configuration (seed included), and of the data-parallel ``workers``
        that train it when more than one (each rank loads a batch: another global batch, another result). A local
        corpus enters by the digest of its contents, not its path: an edited file is other data (its cells
        reused the old results), the same file spelt two ways the same (each task's ``content_spec``: a corpus, a
        data file, a datasets builder's data_files)."""
        from models.tasks import TASKS

        config = self.result_config() | ({"workers": workers} if workers > 1 else {})
        task_cls = TASKS.get(config["task"].get("name"))
        if task_cls is not None:
            config["task"] = task_cls.content_spec(dict(config["task"]))
        blob = json.dumps(config, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def run_keys(base: dict[str, Any]) -> list[str]:
    """Every dotted key of a run file, for the base's task (model.*, training.*, task.*, tracking.*, ...)."""
    from models.tasks import TASKS

    keys = ["name", "seed", "model", "task", "training", "tracking", "resources"]
    keys += [f"model.{f.name}" for f in fields(ModelConfig)]
    keys += [f"training.{f.name}" for f in fields(TrainingConfig)]
    keys += [f"tracking.{k}" for k in TrackingSection.model_fields]
    keys += [f"resources.{k}" for k in ResourcesSection.model_fields]
    task = base.get("task") if isinstance(base, dict) else None
    keys.append("task.name")
    task_cls = TASKS.get(task.get("name")) if isinstance(task, dict) and isinstance(task.get("name"), str) else None
    if task_cls is not None:
        keys += [f"task.{f.name}" for f in fields(task_cls.Params)]
    return keys


def axis_keys(base: dict[str, Any]) -> list[str]:
    """The dotted keys a design axis or a search parameter may set (result-affecting sections only)."""
    return [k for k in run_keys(base) if k.startswith(("model.", "training.", "task."))]


# --- reading ------------------------------------------------------------------------------------------------


def read_document(path: str | Path, keys: Sequence[str] = SECTIONS) -> Document:
    """A configuration file as a Document (data + lines); SpecError if it cannot be read as one (``keys``: what
    its mapping holds, for the message)."""
    source = str(path)
    try:
        doc = read(path)
    except OSError as err:
        raise SpecError(source, None, f"cannot read the file ({err.strerror or err})") from None
    except YamlFileError as err:
        raise SpecError(source, None, err.message, err.line) from None
    if not isinstance(doc.data, dict):
        raise SpecError(source, None, "must be a YAML mapping with the keys " + ", ".join(keys))
    load_plugins(doc, Path(path).parent)
    return doc


def load_plugins(doc: Document, folder: Path) -> None:
    """The plugins a file names (``plugins:``, paths relative to its folder), imported before anything of the file
    is checked: the names they register are valid choices then."""
    from models import plugins

    named = doc.data.get("plugins")
    if named is None:
        return
    if not isinstance(named, list) or not all(isinstance(x, str) for x in named):
        raise SpecError(doc.source, "plugins", "must be a list of module names or paths", doc.line(("plugins",)))
    for i, spec in enumerate(named):
        try:
            plugins.load([spec], folder, what=f"{doc.source}")
        except plugins.PluginError as err:
            message = str(err).removeprefix(f"{doc.source}: ")
            raise SpecError(doc.source, f"plugins[{i}]", message, doc.line(("plugins", i))) from None


def load_base(origin: Origin, value: Any, folder: Path) -> tuple[dict[str, Any], Origin]:
    """The base run (a file relative to the study, or inline) and where its keys come from."""
    if isinstance(value, str):
        shown = value if len(value) <= 80 else value[:80] + "..."
        try:
            path = (folder / value).resolve()
            is_dir, exists = path.is_dir(), path.exists()
        except (OSError, ValueError) as err:  # a name too long, a NUL byte: text that is no path
            why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            raise origin.error(
                ("base",), f"{shown!r} is not a run file ({why}): name one (base: ../runs/quickstart.yaml)"
            ) from None
        if not value.strip() or is_dir:
            raise origin.error(("base",), f"{shown!r} is not a run file: name one (base: ../runs/quickstart.yaml)")
        if not exists:
            raise origin.error(("base",), f"run file {shown!r} not found (looked for {path})")
        doc = read_document(path)
        return anchored_task(dict(doc.data), path.parent), Origin(str(path), doc)
    return anchored_task(dict(_mapping(origin, ("base",), value)), folder), origin.under("base")


def anchored_task(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A run's sections with the task's relative local paths (a corpus, a data file) made absolute against
    ``folder``, the folder of the file that wrote them (``Task.anchored``): a run reads the same files from any
    working directory, and records where they were."""
    from models.tasks import TASKS

    task = data.get("task")
    task_cls = TASKS.get(task.get("name")) if isinstance(task, dict) and isinstance(task.get("name"), str) else None
    return data if task_cls is None else {**data, "task": task_cls.anchored(dict(task), Path(folder))}


def _mapping(origin: Origin, path: tuple, value: Any) -> dict:
    if not isinstance(value, dict):
        raise origin.error(path, f"must be a mapping of keys to values (got {type(value).__name__})")
    return value


def read_yaml(path: str | Path) -> dict[str, Any]:
    return read_document(path).data


# --- resolving ----------------------------------------------------------------------------------------------


def _section(origin: Origin, section: str, build, data: dict[str, Any]):
    """Build a section with a configuration class of ``models`` (its keys are known: ``_misspelt``); its errors
    are blamed on the line of the field at fault, else of the first other field the refusal reads that the file
    (or ``--set``) gave: a default refused beside a value the file set (d_model beside n_heads=3), a key missing
    beside the one that needs it (window beside pattern: local)."""
    try:
        return build(data)
    except ConfigError as err:
        key = next((k for k in err.fields if k in data), err.field)
        involves = [(section, k) for k in err.fields]
        raise origin.error((section, key), str(err), involves=involves) from None
    except TypeError as err:  # a dataclass given a value it cannot take
        raise origin.error((section,), str(err)) from None


def _misspelt(origin: Origin, data: dict[str, Any], valid: list[str]) -> list[SpecError]:
    """The keys of the task, model and training sections that ``valid`` (``run_keys``) does not hold; the task's
    only when its name is known (else the name is the mistake)."""
    from models.tasks import TASKS

    task = data.get("task")
    named = isinstance(task, dict) and isinstance(task.get("name"), str) and task["name"] in TASKS
    if isinstance(task, dict) and "name" not in task:  # `nme: copy`: the name, misspelt
        misspelt = [k for k in task if isinstance(k, str) and did_you_mean(k, ["name"])]
        return [origin.error(("task", k), "unknown key; did you mean task.name?") for k in misspelt[:1]]
    unknown = [
        (section, key)
        for section in (("task",) if named else ()) + ("model", "training")
        if isinstance(data.get(section), dict)
        for key in data[section]
        if f"{section}.{key}" not in valid
    ]
    said = [
        origin.error(
            (section, key), unknown_key_message(key, valid, section) if isinstance(key, str) else key_not_text(key)
        )
        for section, key in unknown[:MAX_FOUND]
    ]
    return said + ([more(origin.source)] if len(unknown) > MAX_FOUND else [])


def _task_and_model(origin: Origin, file: RunFile):
    """The task and the model it determines (vocabulary, classes, the longest sequence)."""
    from models.tasks import TASKS, make_task

    task_data = dict(file.task)
    task_name = task_data.get("name")
    task_cls = TASKS.get(task_name) if isinstance(task_name, str) else None
    if task_cls is None:
        if "name" not in task_data:  # missing, not wrong (a misspelt `nme:` is named beside it, _misspelt)
            valid = ", ".join(repr(n) for n in TASKS)
            raise origin.error(
                ("task", "name"), f"is required: a task needs a name (task: {{name: copy}}); valid: {valid}"
            )
        from models.plugins import unknown_hint

        message = not_a_choice("name", task_name, TASKS, what="a valid task") + f"; {unknown_hint('task')}"
        raise origin.error(("task", "name"), message)
    task = _section(origin, "task", make_task, task_data)

    model_data = dict(file.model)
    arch = model_data.setdefault("arch", task.archs[0])
    if arch not in task.archs:
        raise origin.error(
            ("model", "arch"),
            f"{arch!r} does not fit task {task.name!r}, which needs arch " + " or ".join(repr(a) for a in task.archs),
            involves=[("model", "arch"), ("task", "name")],
        )
    model_data.setdefault("vocab_size", task.vocab_size)
    if isinstance(model_data["vocab_size"], int) and model_data["vocab_size"] < task.vocab_size:
        raise origin.error(
            ("model", "vocab_size"),
            f"{model_data['vocab_size']} is smaller than the vocabulary of "
            f"task {task.name!r} ({task.vocab_size}); remove it to use the task's",
            involves=[("model", "vocab_size"), ("task", "name")],
        )
    if task.n_classes is not None:
        model_data.setdefault("n_classes", task.n_classes)
        if model_data["n_classes"] != task.n_classes:
            raise origin.error(
                ("model", "n_classes"),
                f"{model_data['n_classes']} differs from the "
                f"{task.n_classes} classes of task {task.name!r}; remove it to use the task's",
                involves=[("model", "n_classes"), ("task", "name")],
            )
    if model_data.get("positions", "sinusoidal") == "learned":
        model_data.setdefault("max_len", max(512, task.max_length))
        if isinstance(model_data["max_len"], int) and model_data["max_len"] < task.max_length:
            raise origin.error(
                ("model", "max_len"),
                f"{model_data['max_len']} is shorter than the longest sequence of "
                f"task {task.name!r} ({task.max_length}) for learned positions; raise it",
                involves=[("model", "max_len"), ("model", "positions"), ("task", "name")],
            )
    model = _section(origin, "model", ModelConfig.from_dict, model_data)
    return task, model


def _structure(origin: Origin, data: Any) -> RunFile:
    """The run's sections and every key of them: every misspelt key of the file at once, whichever section holds
    it, beside the values of the wrong type (the values the model judges come after, in ``resolve_run``)."""
    valid = run_keys(data)
    if not isinstance(data, dict):
        raise origin.error((), "must be a mapping with the sections " + ", ".join(SECTIONS))
    if "task" not in data:
        raise origin.error(("task",), "is required (for example task: {name: copy})")
    misspelt = _misspelt(origin, data, valid)
    try:
        file = validate(RunFile, data, origin, valid)
    except SpecError as err:
        raise found([*err.every(), *misspelt]) from None
    if misspelt:
        raise found(misspelt)
    return file


def structure_errors(origin: Origin, data: Any) -> list[SpecError]:
    """A base run's mistakes of structure, named beside those of the study or search that uses it."""
    try:
        _structure(origin, data)
    except SpecError as err:
        return err.every()
    return []


def resolve_run(data: dict[str, Any], source: str | Origin | None = None) -> RunConfig:
    """Check a run's sections and fill in what the task determines. Raises SpecError."""
    origin = Origin.of(source)
    file = _structure(origin, data)

    # the training section does not depend on the task: its mistake is named beside the task's or the model's
    try:
        training, late = _section(origin, "training", TrainingConfig.from_dict, dict(file.training)), []
    except SpecError as err:
        training, late = None, err.every()
    try:
        task, model = _task_and_model(origin, file)
    except SpecError as err:
        raise found([*err.every(), *late]) from None
    if late:
        raise found(late)
    task_spec = task.to_dict()
    if training.sampling == "scheduled" and model.non_autoregressive:  # the LightningModule refuses it: say it now
        raise origin.error(
            ("training", "sampling"),
            f"'scheduled' feeds a decoder its own earlier predictions; decoding={model.decoding!r} has none "
            "(use sampling='teacher_forcing')",
            involves=[("training", "sampling"), ("model", "decoding")],
        )
    if training.sampling == "scheduled" and task.kind == "classify":
        raise origin.error(
            ("training", "sampling"),
            f"'scheduled' feeds predictions back to a decoder; task "
            f"{task.name!r} trains an encoder classifier (use 'teacher_forcing')",
            involves=[("training", "sampling"), ("task", "name")],
        )
    read_by_the_run(origin, task, model, training)
    from models import plugins

    return RunConfig(
        plugins=plugins.used_by({**model.component_names(), "task": {task.name}}),
        task_spec=task_spec,
        model=model,
        training=training,
        seed=file.seed,
        name=file.name,
        tracking=file.tracking,
        resources=file.resources,
    )
