"""``--set section.key=value`` options: parsed, applied to a run's data (``apply_overrides``, also the settings of a
study's variants and a search's trials), and ``load_run``, which reads a run file with them and blames each mistake
on the option that caused it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from record.spec.common import Origin
from record.spec.errors import SpecError, found, unknown_key_message
from record.spec.run import SECTIONS, RunConfig, anchored_task, read_document, resolve_run
from record.spec.yamlfile import Document, YamlFileError, load_yaml


def _parse_each(overrides: list[str]) -> tuple[list[tuple[str, tuple[list[str], Any]]], list[SpecError]]:
    """(each option that parses, with what it sets), and the mistakes of those that do not."""
    parsed, errors = [], []
    for item in overrides:
        try:
            parsed.append((item, _parse_override(item)))
        except SpecError as err:
            errors.append(err)
    return parsed, errors


def _parse_override(item: str) -> tuple[list[str], Any]:
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise SpecError("--set", repr(item), "is not KEY=VALUE (for example --set model.n_heads=8)")
    path = key.strip().split(".")
    if path[0] not in SECTIONS:
        raise SpecError("--set", item, unknown_key_message(path[0], SECTIONS, listed=SECTIONS))
    try:
        value = load_yaml(raw) if raw.strip() else None
    except YamlFileError as err:
        raise SpecError("--set", item, f"the value {raw!r} {err.message}") from None
    if isinstance(value, dict) and len(path) == 1 and path[0] in SECTIONS[2:] and path[0] != "task":
        # it would replace the section (a task given whole is another task: its keys are its own)
        first = f"{path[0]}.{next(iter(value))}={next(iter(value.values()))}" if value else f"{path[0]}.KEY=VALUE"
        raise SpecError(
            "--set",
            item,
            f"would replace the whole {path[0]} section, the file's keys with it: set one key at a time (--set {first})",
        )
    return path, value


def _plain(value: Any) -> Any:
    """A deep copy of YAML data with its values made JSON's (a date becomes its text), its keys kept as YAML read
    them: a key `3:` or `yes:` stays 3 or True, for the check that names it (JSON would make it "3", "true")."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float)):  # JSON's already (bool is an int)
        return value
    return json.loads(json.dumps(value, default=str))


def apply_overrides(data: dict[str, Any], overrides: list[tuple[list[str], Any]]) -> dict[str, Any]:
    data = _plain(data)
    for path, value in overrides:
        node = data
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[path[-1]] = value
    return data


def override_origin(doc: Document, overrides: list[str], parsed: list[tuple[list[str], Any]]) -> Origin:
    """The file's origin, with each overridden key blamed on its ``--set``."""
    return Origin(doc.source, doc, {tuple(path): item for item, (path, _) in zip(overrides, parsed)})


def _resolve_blaming(doc: Document, each: list, errors: list[SpecError]) -> tuple[RunConfig | None, list[SpecError]]:
    """Resolve the file with the options ``each``; a section stops at its first mistake (the model's n_heads hides
    its d_model), so the options blamed are set aside and the rest resolved again, until nothing new is found: every
    bad option is named at once, each judged beside the options given with it (window=2 with pattern=local is no
    mistake; tried alone, it was one)."""
    remaining, said = list(each), set()
    while True:
        items, parsed = [item for item, _ in remaining], [one for _, one in remaining]
        try:
            return resolve_run(apply_overrides(doc.data, parsed), override_origin(doc, items, parsed)), errors
        except SpecError as err:
            new = [e for e in err.every() if str(e) not in said]
            said |= {str(e) for e in new}
            errors = errors + new
            blamed = {e.key for e in new if e.source == "--set"}
            left = [(item, one) for item, one in remaining if item not in blamed]
            if len(left) == len(remaining):
                return None, errors
            remaining = left


def load_run(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read, override (``--set section.key=value``), check and resolve a run file."""
    doc = read_document(path)
    doc.data = anchored_task(doc.data, Path(path).parent)  # its paths, not --set's: those are the shell's
    each, errors = _parse_each(overrides or [])
    run, errors = _resolve_blaming(doc, each, errors)
    if errors:  # the file's first, then the options in the order given
        order = {item: i for i, item in enumerate(overrides or [])} | {
            repr(item): i for i, item in enumerate(overrides or [])
        }
        errors.sort(key=lambda e: (e.source == "--set", order.get(e.key, len(order))))
        raise found(errors) from None
    return run
