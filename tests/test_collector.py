"""graphsvc.collector: gc_paused turns the cyclic garbage collector off in a block and leaves it as
it found it: on again after the block (even one that raises), still off if it was off."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from graphsvc.collector import gc_paused


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    gc.enable()
    yield
    gc.enable()


def test_the_collector_is_off_in_the_block_and_on_after_it() -> None:
    with gc_paused():
        assert gc.isenabled() is False
    assert gc.isenabled() is True


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    with gc_paused():
        assert gc.isenabled() is False
    assert gc.isenabled() is False


def test_an_error_in_the_block_passes_through_and_the_collector_comes_back() -> None:
    with pytest.raises(KeyError, match="boom"), gc_paused():
        raise KeyError("boom")
    assert gc.isenabled() is True


def test_an_inner_pause_does_not_turn_the_collector_on_inside_an_outer_one() -> None:
    with gc_paused():
        with gc_paused():
            assert gc.isenabled() is False
        assert gc.isenabled() is False  # the inner block found it off
    assert gc.isenabled() is True
