"""OpenFlow priorities for ordered rules, stable across changes so that adding a rule moves no other.

Rules of one table are ordered (tier, policy priority, rule index); every rule
needs a priority of its own. Ranking them 60000, 59999, ... would shift every
rule below an insertion, rewriting their flows. Instead rules are spread with
gaps and a new rule takes a priority between its neighbours. When a gap is
exhausted, only a window around it is spread again, grown until it has room
(never the whole table unless the table is nearly full); when existing rules
changed order, the most of them that can keep their priority do.
"""

from __future__ import annotations

import bisect

TOP = 60000
FLOOR = 1000  # below: fixed flows (isolation drops at 100, table misses at 0)
SPACING = 64


def spread(keys: list[str]) -> dict[str, int]:
    """Evenly spaced, leaving an eighth of the range free above and below for
    rules that later sort before the first or after the last one."""
    span = TOP - FLOOR
    margin = span // 8
    step = max(1, min(SPACING, (span - 2 * margin) // (len(keys) + 1)))
    if len(keys) * step > span:
        raise ValueError(f"{len(keys)} rules do not fit in one table's priority range")
    if len(keys) * step > span - 2 * margin:
        margin = 0
    return {k: TOP - margin - step * (i + 1) for i, k in enumerate(keys)}


def _keepers(keys: list[str], previous: dict[str, int]) -> set[str]:
    """The largest set of previously placed keys whose old priorities still descend in the
    order of `keys` (longest decreasing subsequence): they keep their priority."""
    placed = [(k, previous[k]) for k in keys if k in previous]
    tails: list[int] = []  # tails[n]: smallest -priority ending a run of n+1
    tail_at: list[int] = []
    parent: list[int] = []
    for i, (_, prio) in enumerate(placed):
        n = bisect.bisect_left(tails, -prio)
        if n == len(tails):
            tails.append(-prio)
            tail_at.append(i)
        else:
            tails[n], tail_at[n] = -prio, i
        parent.append(tail_at[n - 1] if n else -1)
    keep: set[str] = set()
    i = tail_at[-1] if tail_at else -1
    while i >= 0:
        keep.add(placed[i][0])
        i = parent[i]
    return keep


def assign(keys: list[str], previous: dict[str, int]) -> dict[str, int]:
    """Priorities for `keys` (highest first), reusing `previous` wherever the order allows."""
    keep = _keepers(keys, previous)
    if not keep:
        return spread(keys)
    fixed: list[int | None] = [previous[k] if k in keep else None for k in keys]
    target = max(1, min(4, (TOP - FLOOR) // (len(keys) + 1)))
    out: dict[str, int] = {}
    i = 0
    while i < len(keys):
        if fixed[i] is not None:
            out[keys[i]] = fixed[i]  # type: ignore[assignment]
            i += 1
            continue
        j = i  # a run of keys to place between two kept ones (or the ends)
        while j < len(keys) and fixed[j] is None:
            j += 1
        upper = fixed[i - 1] if i else TOP + 1  # exclusive bounds
        lower = fixed[j] if j < len(keys) else FLOOR
        if (upper - lower) // (j - i + 1) < 1:  # type: ignore[operator]
            i, j, upper, lower = _window(fixed, i, j, target)
            step = (upper - lower) // (j - i + 1)
            for n in range(i, j):
                out[keys[n]] = upper - step * (n - i + 1)
            i = j
            continue
        run = keys[i:j]
        step = min((upper - lower) // (len(run) + 1), SPACING)  # type: ignore[operator]
        if i == 0 and j < len(keys):
            # Above everything kept: stack just above the first kept rule, so repeated
            # insertions at the top use the free margin one step at a time instead of
            # halving it each time.
            for n, key in enumerate(run):
                out[key] = lower + step * (len(run) - n)  # type: ignore[operator]
        else:
            for n, key in enumerate(run):
                out[key] = upper - step * (n + 1)  # type: ignore[operator]
        i = j
    return out


def _window(fixed: list[int | None], i: int, j: int, target: int) -> tuple[int, int, int, int]:
    """Grow the run [i, j) over its kept neighbours, on both sides and doubling, until its
    keys fit with `target` between each (or it covers the table): (i, j, upper, lower)."""
    grow = 1
    while True:
        upper = fixed[i - 1] if i else TOP + 1
        lower = fixed[j] if j < len(fixed) else FLOOR
        if (upper - lower) // (j - i + 1) >= target or (i == 0 and j == len(fixed)):  # type: ignore[operator]
            if (upper - lower) // (j - i + 1) < 1:  # type: ignore[operator]
                raise ValueError(f"{len(fixed)} rules do not fit in one table's priority range")
            return i, j, upper, lower  # type: ignore[return-value]
        i, j = max(0, i - grow), min(len(fixed), j + grow)
        while i and fixed[i - 1] is None:
            i -= 1
        while j < len(fixed) and fixed[j] is None:
            j += 1
        grow *= 2
