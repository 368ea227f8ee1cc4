"""fuzz/fuzz_walk.py, the differential fuzzer of diff's alignment walk: it runs, and it can fail."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from tests.conftest import ROOT


@pytest.fixture
def fuzz_walk() -> Any:
    from graphsvc.native import built
    from tests.conftest import native_missing

    if not built():
        native_missing("the C extensions are not built here (pip install -e . builds them)")
    from fuzz import fuzz_walk

    return fuzz_walk


def test_a_short_run_finds_the_two_walks_alike(fuzz_walk: Any) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "fuzz" / "fuzz_walk.py"), "--seconds", "1", "--seed", "7"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"[1-9]\d* cases in \d+ s: the same both ways\n", done.stdout)


def test_a_case_runs_again_and_its_graphs_compete_for_partners(fuzz_walk: Any) -> None:
    assert fuzz_walk.check(3) is None
    a, b = fuzz_walk.pair(3)
    again = fuzz_walk.pair(3)
    assert [a.op(n) for n in range(a.num_nodes)] == [again[0].op(n) for n in range(again[0].num_nodes)]
    matched, unaligned = fuzz_walk.align(a, b)
    assert (matched >= 0).sum() == 9 and len(unaligned) == 17  # some pairs, and nodes left over


def test_a_walk_that_pairs_differently_is_reported(fuzz_walk: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    real = fuzz_walk.align

    def off_by_one(a: Any, b: Any, engine: Any) -> Any:
        matched, unaligned = real(a, b, engine=engine)
        if engine is not fuzz_walk.REFERENCE:
            matched = np.where(matched == 0, -1, matched)  # B's node 0 left unpaired
        return matched, unaligned

    monkeypatch.setattr(fuzz_walk, "align", off_by_one)
    assert fuzz_walk.check(3) == "case 3: the pairs differ"
