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
    step = max(1, min(SPACING, (TOP - FLOOR) // (len(keys) + 1)))
    if len(keys) * step > TOP - FLOOR:
        raise ValueError(f"{len(keys)} rules do not fit in one table's priority range")
    return {k: TOP - step * (i + 1) for i, k in enumerate(keys)}


def assign(keys: list[str], previous: dict[str, int]) -> dict[str, int]:
    """Priorities for `keys` (highest first), reusing `previous` wherever the order allows."""
    kept = [previous[k] for k in keys if k in previous]
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
        for n, key in enumerate(run):
            out[key] = upper - step * (n + 1)
        upper = out[run[-1]]
        i = j
    return out
