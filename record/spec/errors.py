"""Errors in configuration files: one line that names the file, the line, the key, what is wrong and the fix.

``SpecError`` is the only error a loader raises for bad input. ``suggest`` finds what a misspelt or misplaced
key was meant to be, across every section of the file ("did you mean training.lr?").
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import Any


class SpecError(ValueError):
    """A configuration that cannot run: ``str(err)`` is one line, ``FILE:LINE: KEY: message``.

    ``source`` is the file (or ``--set`` for a command-line override), ``line`` 1-based when known, ``key``
    the dotted key (``model.n_heads``, ``design.variants[2].name``), ``involves`` every dotted key the refusal
    reads, the one at fault first (``model.d_model``, ``model.n_heads``: "d_model=128 is not divisible by
    n_heads=3"), so that a study blames the variant's setting of any of them."""

    def __init__(
        self,
        source: str | None,
        key: str | None,
        message: str,
        line: int | None = None,
        *,
        involves: Sequence[str] = (),
    ) -> None:
        key = None if key is None else shorten(one_line(key), 200)  # a key or --set option may hold a newline
        source, message = None if source is None else one_line(source), shorten(one_line(message), 1000)
        self.source, self.key, self.message, self.line = source, key, message, line
        self.involves = tuple(involves)
        self.also: tuple[SpecError, ...] = ()  # the other mistakes found in the same pass (``every``)
        where = f"{source}:{line}" if source and line else source
        text = ": ".join(p for p in (where, key) if p)
        super().__init__(f"{text}: {message}" if text else message)

    def every(self) -> list[SpecError]:
        """This error and the others found with it: a file with three misspelt keys names all three at once."""
        return [self, *self.also]


def one_line(text: str) -> str:
    """``text`` with its line breaks and other unprintable characters escaped (``a\\nb``), so that an error is one
    line whatever the file's keys or a ``--set`` option hold."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def shorten(text: str, most: int) -> str:
    """``text`` cut in the middle to at most about ``most`` characters: a value of 20,000 items quoted in a message
    keeps its start and the message's end (what to do), with how much was left out."""
    if len(text) <= most:
        return text
    head, tail = most * 3 // 5, most // 3
    return f"{text[:head]} ...({len(text) - head - tail:,} characters left out)... {text[-tail:]}"


NOT_TEXT = "this key reads as "  # common.key_not_text: a key YAML read as a number, true/false, null or a date


MAX_SHOWN = 20  # mistakes said at once; a file with 20,000 unknown keys is not fixed line by line
MAX_FOUND = 25  # mistakes a check looks for before it stops (each costs a search for what was meant)
MORE = "more mistakes follow; fix these first"


def more(source: str | None) -> SpecError:
    """The line that ends a list of mistakes cut short (``MAX_SHOWN``, ``MAX_FOUND``)."""
    return SpecError(source, None, MORE)


def found(errors: Sequence[SpecError]) -> SpecError:
    """The error to raise for mistakes found in one pass: the first in the file's order, carrying the others
    (repeats dropped; a key YAML did not read as text named once, by what it reads as; a second file's, a study's
    base, after the first's; those without a line, ``--set``'s, last; at most ``MAX_SHOWN``, then ``MORE``)."""
    files: dict[str | None, int] = {}
    for e in errors:
        files.setdefault(e.source, len(files))
    not_text = {(e.source, e.key) for e in errors if e.message.startswith(NOT_TEXT)}
    errors = [e for e in errors if e.message.startswith(NOT_TEXT) or (e.source, e.key) not in not_text]
    unique = sorted({str(e): e for e in errors}.values(), key=lambda e: (e.line is None, files[e.source], e.line or 0))
    cut = [e for e in unique if e.message == MORE]
    unique = [e for e in unique if e.message != MORE]
    if cut or len(unique) > MAX_SHOWN:
        unique = unique[:MAX_SHOWN] + [more(unique[0].source if unique else cut[0].source)]
    for e in unique:
        e.also = ()
    unique[0].also = tuple(unique[1:])
    return unique[0]


def yaml_word(value: Any) -> str:
    """A value as YAML writes it: true, false, null, 3."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def dotted(path: Sequence[Any]) -> str:
    """("design", "variants", 2, "set") -> "design.variants[2].set"."""
    out = ""
    for part in path:
        if not isinstance(part, (str, int)) or isinstance(part, bool):  # a key YAML read as true, null, 1.5, a date
            out += f"[{yaml_word(part)}]"
        elif isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def suggest(key: str, valid: Iterable[str], *, section: str = "") -> str:
    """A hint for an unknown ``key`` (a leaf name) found under ``section`` (dotted, "" for the top level).

    ``valid`` lists every dotted key the file may hold (all sections). The hint is, in order of preference:
    where a section that holds no keys here belongs (a run's ``model:`` in a study: under ``base:``), the same name in another section ("lr belongs under training: did you mean training.lr?"), a close
    spelling in this section ("did you mean model.positions?"), a close spelling of the whole key, a close
    spelling of the name in any section (``lrr`` at the top level: training.lr). Empty if none."""
    valid = list(dict.fromkeys(valid))
    here = f"{section}." if section else ""
    full = here + key
    below = [v for v in valid if v.startswith(f"{full}.")]
    if below and full not in valid:  # `model:` at the top of a study or search: a run's section, which it varies
        return f"a section of the base run: put it under base:, or vary its keys ({below[0]}) in the design or space"
    same_leaf = [v for v in valid if v.rsplit(".", 1)[-1] == key and v != full]
    if same_leaf:
        shown = " or ".join(same_leaf[:3])
        where = _parent(same_leaf[0])
        place = f"under {where}:" if where else "at the top level of the file"
        return f"did you mean {shown}? ({key} belongs {place})"
    siblings = [v for v in valid if _parent(v) == section]
    close = closest(key, [v.rsplit(".", 1)[-1] for v in siblings], 0.6)
    if close:
        return "did you mean " + " or ".join(here + c for c in close) + "?"
    depth = full.count(".")
    peers = [v for v in valid if v.count(".") == depth and _parent(v) != section]
    close = closest(full, peers, 0.75)
    if close:
        return "did you mean " + " or ".join(close) + "?"
    leaves = closest(key, [v.rsplit(".", 1)[-1] for v in valid], 0.75)  # a misspelt name in another section
    anywhere = [v for leaf in leaves for v in valid if v.rsplit(".", 1)[-1] == leaf and v != full]
    return "did you mean " + " or ".join(anywhere[:3]) + "?" if anywhere else ""


def closest(word: str, options: list[str], cutoff: float) -> list[str]:
    """The closest options (the best, and any as close), at least ``cutoff`` similar."""
    matcher = difflib.SequenceMatcher(None, word)
    scored = []
    for o in dict.fromkeys(options):
        matcher.set_seq2(o)  # the quick ratios bound the ratio from above: most options end there
        if matcher.real_quick_ratio() >= cutoff and matcher.quick_ratio() >= cutoff and matcher.ratio() >= cutoff:
            scored.append((matcher.ratio(), o))
    scored.sort(reverse=True)
    return [o for r, o in scored if r >= scored[0][0] - 0.02][:3] if scored else []


def _parent(dotted_key: str) -> str:
    return dotted_key.rsplit(".", 1)[0] if "." in dotted_key else ""


def unknown_key_message(key: str, valid: Iterable[str], section: str = "", listed: Sequence[str] = ()) -> str:
    """``unknown key; did you mean ...? valid: a, b, c`` for a key under ``section``."""
    hint = suggest(key, valid, section=section)
    if hint:
        return f"unknown key; {hint}"
    options = list(listed) or list(dict.fromkeys(v.rsplit(".", 1)[-1] for v in valid if _parent(v) == section))
    shown = ", ".join(options[:40]) + (" ..." if len(options) > 40 else "")
    return "unknown key" + (f"; valid: {shown}" if shown else "")
