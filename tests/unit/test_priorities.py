"""Stable priorities: strictly ordered, and existing rules keep theirs when others come and go."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from policy_agent.policy import priorities


def strictly_decreasing(keys: list[str], prio: dict[str, int]) -> bool:
    values = [prio[k] for k in keys]
    return all(a > b for a, b in zip(values, values[1:])) and all(priorities.FLOOR < v <= priorities.TOP for v in values)


@given(st.lists(st.text(min_size=1, max_size=4), unique=True, max_size=60), st.data())
def test_insertions_and_removals_keep_existing_priorities(keys: list[str], data: st.DataObject) -> None:
    first = priorities.assign(keys, {})
    assert strictly_decreasing(keys, first)
    # Remove some, insert new ones anywhere, keep the relative order of the survivors.
    survivors = [k for k in keys if data.draw(st.booleans())]
    new = [f"new{i}" for i in range(data.draw(st.integers(0, 10)))]
    merged = list(survivors)
    for n in new:
        merged.insert(data.draw(st.integers(0, len(merged))), n)
    second = priorities.assign(merged, first)
    assert strictly_decreasing(merged, second)
    moved = [k for k in survivors if second[k] != first[k]]
    if moved:  # only allowed when a gap ran out and the table was spread again
        assert second == priorities.spread(merged)


def test_reordering_existing_rules_spreads_again() -> None:
    first = priorities.assign(["a", "b", "c"], {})
    second = priorities.assign(["c", "a", "b"], first)
    assert strictly_decreasing(["c", "a", "b"], second)


def test_an_insertion_between_neighbours_moves_nothing_else() -> None:
    first = priorities.assign(["a", "b", "c"], {})
    second = priorities.assign(["a", "x", "b", "c"], first)
    assert {k: second[k] for k in "abc"} == first
    assert first["a"] > second["x"] > first["b"]


def test_a_hundred_rules_inserted_above_everything_move_nothing() -> None:
    keys = [f"k{i}" for i in range(1000)]
    prev = priorities.assign(keys, {})
    first = dict(prev)
    for n in range(100):
        keys = [f"top{n}"] + keys
        prev = priorities.assign(keys, prev)
        assert strictly_decreasing(keys, prev)
    assert all(prev[k] == first[k] for k in first)  # the free margin took them, one step each
