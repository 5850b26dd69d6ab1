"""Issue 72: each task declares what comparing needs of it (``Task.output_classes``: the classes its loss is over,
the chance level a uniform guess sets), recorded with every run, so a new task needs no edit in the comparing code.
Each declaration is checked against the tokens the task's own examples score, not against its params."""

from __future__ import annotations

import dataclasses

import pytest

from models.tasks import make_task
from models.tasks.base import EOS
from record.spec.run import resolve_run
from tests.dashboards.test_caveats import answer_tokens

SMALL = {"train_size": 50, "val_size": 300, "test_size": 50}


def model_for(task: dict, **model):
    return resolve_run({"task": task, "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, **model}}).model


@pytest.mark.parametrize("name", ["copy", "reverse", "sort"])
def test_a_seq2seq_task_is_judged_over_what_its_targets_hold(name):
    """The targets hold the symbols and the end of sequence (models.tasks.batches appends it to every target, as
    the model predicts it), never padding, the start or the separator."""
    spec = {"name": name, "symbols": 10, **SMALL}
    task = make_task(spec)
    held = {t for example in task.build("validation") for t in example["tgt"]} | {EOS}
    assert task.output_classes(model_for(spec)) == len(held) == 11


@pytest.mark.parametrize("spec", [{"name": "recall", "values": 8, "keys": 20}, {"name": "retrieval", "symbols": 12}])
def test_an_answer_scored_task_is_judged_over_what_its_answers_hold(spec):
    task = make_task(spec)
    assert task.output_classes(model_for(spec, arch="decoder")) == len(answer_tokens(spec)) < task.vocab_size


def test_a_classifier_is_judged_over_its_labels_and_a_tagger_over_none():
    spec = {"name": "listops", **SMALL}
    task = make_task(spec)
    labels = {example["label"] for example in task.build("validation")}
    model = model_for(spec, arch="encoder")
    assert task.output_classes(model) == len(labels) == task.n_classes
    # a tagger's loss sums over a sequence's tokens: no one choice, no chance level
    assert task.output_classes(dataclasses.replace(model, classifier="token")) is None
