"""Which contrasts of a table are exploratory: added or changed after results of their cells existed, as the study's
registration and amendments record (``ablations.register``). They are tested and shown, outside the confirmatory
Holm family (docs/statistics.md, "Registration"). A study without a registration (recorded before registration
existed) has no exploratory contrasts, and its table says it is not registered."""

from __future__ import annotations

from typing import Any

from record.recorded import Registration
from record.spec.analysis import Analysis, parse_analysis
from record.spec.decides import EVERY, keys_marked
from record.spec.declaration import Declaration
from record.stats.family import effect_labels

# a change of any of these after results moves every contrast: the declaration's fields marked so
EVERY_CONTRAST = keys_marked(Declaration, EVERY) | keys_marked(Analysis, EVERY, "analysis.")
# the keys marked as deciding their own contrasts, each of which ``_changed_for`` reads in its own way
PER_CONTRAST = ("variants", "runs", "analysis.expect", "analysis.contrasts")


def family_labels(declared: dict[str, Any]) -> list[str]:
    """The labels of the family a declaration declares (its pairs "a vs b", its effects' labels)."""
    variants = list(declared.get("variants", {}))
    axes = list(declared.get("axes", []))
    if not variants:
        return []
    family = parse_analysis(declared.get("analysis") or None).family(
        variants, variants[0], axes, declared.get("design") == "grid"
    )
    levels = {a: list(dict.fromkeys(s[a] for s in declared["variants"].values() if a in s)) for a in axes}
    labels = [f"{a} vs {b}" for a, b in family.pairs]
    if all(levels.get(a) for a in axes):
        labels += effect_labels(levels, family.main, family.interactions)
    return labels


def exploratory(registrations: list[Registration], involved: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """label -> why the contrast is exploratory, for the labels of ``involved`` (label -> the variants whose cells
    it compares)."""
    if not registrations:
        return {}
    if not all(r.verified for r in registrations):
        return dict.fromkeys(involved, "its registration was edited after it was recorded: not trusted")
    before = [i for i, r in enumerate(registrations) if not r.after_results]
    if not before:
        return dict.fromkeys(involved, "registered after its results existed")
    confirmed = registrations[before[-1]]
    declared = set(family_labels(confirmed.declaration))
    out = {
        label: f"not in the family registered before results (version {confirmed.version})"
        for label in involved
        if label not in declared
    }
    previous = confirmed
    for entry in registrations[before[-1] + 1 :]:
        for label, variants in involved.items():
            seen = label not in out and any(entry.finished.get(v, 0) for v in variants)  # its cells had results
            if seen and (why := _changed_for(label, variants, previous.declaration, entry)):
                out[label] = f"amendment {entry.version} changed {why} after results ({entry.reason})"
        previous = entry
    return out


def _changed_for(label: str, variants: tuple[str, ...], before: dict[str, Any], entry: Registration) -> str:
    """What an amendment changed that bears on one contrast ("" where nothing does)."""
    after = entry.declaration
    keys = [k for k in entry.changed if k in EVERY_CONTRAST]
    for key in ("variants", "runs"):
        if key in entry.changed and any(before.get(key, {}).get(v) != after.get(key, {}).get(v) for v in variants):
            keys.append(f"{key} of {', '.join(variants)}")
    if "analysis.expect" in entry.changed and _expected(before, label) != _expected(after, label):
        keys.append("its expected effect")
    if "analysis.contrasts" in entry.changed and label not in family_labels(before):
        keys.append("the family (it was added)")
    return ", ".join(keys)


def _expected(declared: dict[str, Any], label: str) -> list:
    expect = (declared.get("analysis") or {}).get("expect", [])
    name = lambda e: e["contrast"] if isinstance(e["contrast"], str) else " vs ".join(e["contrast"])  # noqa: E731
    return [e for e in expect if name(e) == label]


__all__ = ["exploratory", "family_labels"]
