"""OpenFlow priorities for ordered rules, stable across changes so that adding a rule moves no other.

Rules of one table are ordered (tier, policy priority, rule index); every rule
needs a priority of its own. Ranking them 60000, 59999, ... would shift every
rule below an insertion, rewriting their flows. Instead rules are spread with
gaps, a new rule takes a priority between its neighbours, and only when a gap
is exhausted (or existing rules changed order) is the table spread again.
"""

from __future__ import annotations

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


def assign(keys: list[str], previous: dict[str, int]) -> dict[str, int]:
    """Priorities for `keys` (highest first), reusing `previous` wherever the order allows."""
    kept = [previous[k] for k in keys if k in previous]
    if not kept:
        return spread(keys)
    if any(a <= b for a, b in zip(kept, kept[1:])):
        return spread(keys)  # existing rules changed order: start over
    out: dict[str, int] = {}
    i = 0
    upper = TOP
    while i < len(keys):
        if keys[i] in previous:
            upper = out[keys[i]] = previous[keys[i]]
            i += 1
            continue
        j = i  # a run of new keys between two kept ones (or the ends)
        while j < len(keys) and keys[j] not in previous:
            j += 1
        lower = previous[keys[j]] if j < len(keys) else FLOOR
        run = keys[i:j]
        step = (upper - lower) // (len(run) + 1)
        if step < 1:
            return spread(keys)  # no room left in this gap
        step = min(step, SPACING)
        if i == 0 and j < len(keys):
            # Above everything kept: stack just above the first kept rule, so repeated
            # insertions at the top use the free margin one step at a time instead of
            # halving it each time.
            for n, key in enumerate(run):
                out[key] = lower + step * (len(run) - n)
        else:
            for n, key in enumerate(run):
                out[key] = upper - step * (n + 1)
        upper = out[run[-1]]
        i = j
    return out
