"""Tasks as LightningDataModules built on Hugging Face ``datasets``. A new task is one module and one line."""

from __future__ import annotations

from typing import Any

from models import plugins
from models.config import ConfigError
from models.errors import not_a_choice
from models.tasks.base import BOS, EOS, PAD, SEP, Task
from models.tasks.listops import ListOpsTask
from models.tasks.recall import RecallTask
from models.tasks.retrieval import RetrievalTask
from models.tasks.seq2seq import CopyTask, ReverseTask, SortTask
from models.tasks.text import DataUnavailable, TextTask
from models.tasks.userdata import DataClassifyTask, DataLMTask, DataSeq2SeqTask


class TaskRegistry(dict):
    """Task name -> Task class. ``@TASKS.register`` adds one (a plugin's task: models.plugins), named by its class's
    ``name``; a name already taken is refused."""

    def register(self, cls: type[Task]) -> type[Task]:
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"a task class needs a `name` (got {name!r} on {cls.__name__})")
        if name in self and self[name] is not cls:
            raise ValueError(f"task {name!r} is already registered ({self[name].__module__}); pick another name")
        self[name] = cls
        return cls

    def unregister(self, name: str) -> None:
        self.pop(name, None)


TASKS: TaskRegistry = TaskRegistry(
    {
        t.name: t
        for t in (CopyTask, ReverseTask, SortTask, RecallTask, ListOpsTask, RetrievalTask, TextTask)
        + (DataSeq2SeqTask, DataClassifyTask, DataLMTask)
    }
)
plugins.track("task", TASKS)  # what a plugin registers here is counted as its own


def make_task(spec: dict[str, Any]) -> Task:
    """A task from ``{"name": ..., **params}``; unknown names and keys are refused with the valid ones."""
    spec = dict(spec)
    name = spec.pop("name", None)
    if name not in TASKS:
        valid = ", ".join(repr(n) for n in TASKS)
        from models.plugins import unknown_hint

        message = not_a_choice("name", name, TASKS, what="a valid task") + f"; {unknown_hint('task')}"
        if name is None:  # no name at all: it is missing, not wrong
            message = f"a task needs a name; valid: {valid}"
        raise ConfigError(message, field="name", value=name, fix=f"use one of {valid}, or load the plugin that has it")
    return TASKS[name].from_dict(spec)


def __getattr__(name: str):
    """``TaskDataModule`` and ``collate`` on first use: they pull in Lightning and torch, which declaring and
    checking tasks (a study's driver) does not need."""
    if name == "TaskDataModule":
        from models.tasks.data import TaskDataModule

        return TaskDataModule
    if name == "collate":
        from models.tasks.batches import collate

        return collate
    raise AttributeError(f"module 'models.tasks' has no attribute {name!r}")


__all__ = ["BOS", "EOS", "PAD", "SEP", "TASKS", "DataUnavailable", "Task", "TaskDataModule", "collate", "make_task"]
