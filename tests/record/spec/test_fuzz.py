"""Fuzzing of every file the platform reads, in a few hundred inputs of each kind (benchmarks/fuzz.py runs 10,000):
mutations of the catalogue's run, study and search files, and ``--set`` options, drawn by hypothesis with a fixed
seed. Each is accepted (and passes its dry run's checks) or refused by a SpecError whose every line names the file,
and the line and the key where the file has them; never another exception, never more than a second, never a file
written. A failure is shrunk by hypothesis to its smallest input, which becomes a test of test_fuzz_found.py."""

from __future__ import annotations

import importlib.util
import random
import sys

import pytest

from tests.conftest import ROOT

EXAMPLES = 200  # per kind: 2 to 4 s each on 2 cores


def fuzz_module():
    spec = importlib.util.spec_from_file_location("fuzz_bench", ROOT / "benchmarks" / "fuzz.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


fuzz = fuzz_module()


@pytest.mark.parametrize("kind", fuzz.KINDS)
def test_mutated_files_are_accepted_or_refused_with_their_file_line_and_key(kind):
    work = fuzz.Workdir()
    try:
        tally = fuzz.run_kind(kind, EXAMPLES, None, work, raise_failures=True)
    finally:
        work.close()
    assert tally.examples == EXAMPLES and not tally.failures
    assert tally.refused > EXAMPLES // 2 and tally.accepted > 0  # the mutations reach both outcomes


@pytest.mark.slow
def test_mutated_files_through_the_command_exit_0_or_2_without_a_traceback():
    """One input of each kind through the real `ablate` (run with --set, sweep --dry-run, search --dry-run)."""
    work = fuzz.Workdir()
    rng = random.Random(0)
    try:
        for kind in ("set", "study", "search"):
            raw, sets = fuzz._cli_input(kind, rng)
            assert fuzz.through_cli(kind, raw, sets, work) is None, kind
        assert {p for p in work.listing() - work.before if not p.endswith("fuzzed.yaml")} == set()
    finally:
        work.close()
