"""The hostile-input fuzz targets at a small sample (bench/fuzz.py runs them at >= 100k cases each)."""

from __future__ import annotations

import pytest

from policy_agent.policy import manifests
from tests.support import fuzz_targets
from tests.support.fuzz_targets import TARGETS, run_target

SAMPLE = 250


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_target_raises_nothing_but_its_own_error(name: str) -> None:
    assert run_target(name, SAMPLE) >= SAMPLE // 2  # hypothesis may stop early on a small input space


def test_an_uncaught_exception_in_a_parser_fails_the_target(monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(*args: object, **kwargs: object) -> None:
        raise KeyError("metadata")
    monkeypatch.setattr(manifests, "load_text", crash)
    with pytest.raises(KeyError):
        run_target("manifests", 50)


def test_the_cases_include_the_hostile_kinds_the_issue_names() -> None:
    """Aliased YAML, lone surrogates and non-UTF-8 bytes are all generated (not only plain text)."""
    seen = {"alias": False, "surrogate": False, "bytes": False}

    def spy(case: tuple[str, object]) -> None:
        kind, value = case
        seen["alias"] |= kind == "text" and isinstance(value, str) and "*a0" in value
        seen["surrogate"] |= isinstance(value, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in value)
        seen["bytes"] |= kind == "bytes"

    original = TARGETS["manifests"]
    TARGETS["manifests"] = (original[0], spy)
    try:
        run_target("manifests", 600, seed=5)
    finally:
        TARGETS["manifests"] = original
    assert seen == {"alias": True, "surrogate": True, "bytes": True}, seen
    assert fuzz_targets.TARGETS["manifests"] is original
