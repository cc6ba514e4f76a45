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
    # Evenly spread, every gap has room for ten newcomers: nobody already placed moves.
    assert all(second[k] == first[k] for k in survivors)


def test_reordering_existing_rules_moves_only_those_out_of_order() -> None:
    keys = [f"k{i}" for i in range(100)]
    first = priorities.assign(keys, {})
    reordered = ["k50"] + [k for k in keys if k != "k50"]
    second = priorities.assign(reordered, first)
    assert strictly_decreasing(reordered, second)
    assert [k for k in keys if second[k] != first[k]] == ["k50"]


def test_clustered_insertions_respread_a_bounded_window_never_the_table() -> None:
    # The same spot again and again (a policy inserted before the same neighbour each time):
    # when its gap runs out, a window around it is spread again, not all 1,000 rules.
    keys = [f"k{i:04d}" for i in range(1000)]
    prev = priorities.assign(keys, {})
    first = dict(prev)
    worst = 0
    for n in range(300):
        keys.insert(500, f"new{n:03d}")
        nxt = priorities.assign(keys, prev)
        assert strictly_decreasing(keys, nxt)
        worst = max(worst, sum(1 for k in prev if k in nxt and nxt[k] != prev[k]))
        prev = nxt
    assert 0 < worst <= 300
    far = [k for k in first if not "k0300" <= k < "k0600"]
    assert all(prev[k] == first[k] for k in far)


def test_a_full_table_still_fits_and_one_more_rule_does_not() -> None:
    limit = priorities.TOP - priorities.FLOOR
    keys = [f"k{i}" for i in range(limit - 1)]
    prev = priorities.assign(keys, {})
    keys.insert(7, "one-more")
    assert strictly_decreasing(keys, priorities.assign(keys, prev))
    keys.insert(7, "too-many")
    try:
        priorities.assign(keys, prev)
    except ValueError:
        pass
    else:
        raise AssertionError("a table over capacity was accepted")


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
