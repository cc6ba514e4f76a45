"""policy_agent.config.strict_yaml: libyaml's parser where PyYAML has it, with the pure loader's results and errors."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from policy_agent.config import strict_yaml
from policy_agent.config.strict_yaml import ConfigError, strict_load

TEXTS = [
    "", "a: 1\n", "a: {b: [1, 2.5, true, null, '2026-01-01']}\n", "x: &a {k: 1}\ny: *a\n",
    'a: "\\ud83d"\n',          # a surrogate escape: libyaml refuses it, the pure loader reads it
    "a: \ud800\n",             # a lone surrogate in the text
    "a: [unclosed\n", "a: 1\na: 2\n", "a: !!python/object:os.system x\n", "a: \x07\n", "\tb: 1\n",
]


def outcome(text: str) -> Any:
    try:
        return ("ok", strict_load(text))
    except ConfigError as exc:
        return ("config", exc.errors)
    except yaml.YAMLError as exc:
        return ("yaml", str(exc))


@pytest.mark.skipif(strict_yaml.SAFE_LOADER is yaml.SafeLoader, reason="PyYAML here is built without libyaml")
@pytest.mark.parametrize("text", TEXTS)
def test_libyaml_gives_what_the_pure_loader_gives(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = outcome(text)
    monkeypatch.setattr(strict_yaml, "SAFE_LOADER", yaml.SafeLoader)
    assert fast == outcome(text)


def test_a_key_given_twice_is_named_with_both_lines() -> None:
    with pytest.raises(ConfigError) as exc:
        strict_load("ovs:\n  bridge: a\n  bridge: b\n")
    assert exc.value.errors == ["ovs.bridge: duplicate key (line 2, again at line 3); YAML would keep only the "
                                "last: give it once"]
