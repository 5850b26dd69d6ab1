"""The suite's own order (tests/conftest.py): the measured tests are dealt out between the test processes so that
each starts on long tests of its own and what is left for stealing at the end is short."""

from __future__ import annotations

import random
from dataclasses import dataclass

from tests.conftest import deal_longest_first


@dataclass
class Item:
    nodeid: str
    slow: bool = False

    def get_closest_marker(self, name: str):
        return object() if name == "slow" and self.slow else None


def test_each_share_is_contiguous_longest_first_and_balanced_as_lpt_guarantees():
    rng = random.Random(3)
    items = [Item(f"t{i}", slow=i % 9 == 0) for i in range(101)]
    cost = {f"t{i}": rng.uniform(3, 150) for i in rng.sample(range(101), 30)}
    for shares in (1, 2, 3):
        out = deal_longest_first(items, cost, shares)
        assert sorted(i.nodeid for i in out) == sorted(i.nodeid for i in items)  # nothing lost or repeated
        # xdist's worksteal hands process k the k-th contiguous run of len(items) // shares (+1 for the first ones)
        sizes = [len(items) // shares + (k < len(items) % shares) for k in range(shares)]
        starts = [sum(sizes[:k]) for k in range(shares)]
        runs = [out[s : s + n] for s, n in zip(starts, sizes, strict=True)]
        totals = []
        for run in runs:
            measured = [cost[i.nodeid] for i in run if i.nodeid in cost]
            assert measured == sorted(measured, reverse=True)  # longest first
            assert all(i.nodeid in cost for i in run[: len(measured)])  # the measured ones before the rest
            totals.append(sum(measured))
        # greedy longest-processing-time: the shares differ by at most the longest test
        assert max(totals) - min(totals) <= max(cost.values())
    unmeasured = [i.nodeid for i in deal_longest_first(items, {}, 2)]
    assert unmeasured[:12] == [f"t{i}" for i in range(0, 101, 9)]  # nothing measured: the slow ones first


def test_without_measurements_one_share_keeps_the_collection_order_slow_first():
    items = [Item("a"), Item("b", slow=True), Item("c")]
    assert [i.nodeid for i in deal_longest_first(items, {}, 1)] == ["b", "a", "c"]
