"""The Fluent Bit and Vector snippets in config/syslog/ parse and hang together.

Neither tool is installed where these tests run, so this is all that is checked
of them (their file headers say so); the rsyslog configs run in a real rsyslogd
in tests/integration/test_syslog_receivers.py.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

from policy_agent.config.loader import AgentConfig

SHIPPED = Path(__file__).resolve().parents[3] / "config" / "syslog"


def test_the_fluent_bit_snippet_tails_the_default_audit_file_and_keeps_each_record_whole() -> None:
    text = (SHIPPED / "fluent-bit.yaml").read_text()
    assert "NOT EXERCISED HERE" in text
    conf = yaml.safe_load(text)
    parsers = {p["name"]: p for p in conf["parsers"]}
    (tail,) = conf["pipeline"]["inputs"]
    (output,) = conf["pipeline"]["outputs"]
    assert tail["name"] == "tail" and tail["path"] == AgentConfig().audit.path
    parser = parsers[tail["parser"]]
    # The json parser would drop "@timestamp" from the record without time_keep.
    assert (parser["format"], parser["time_key"], parser["time_keep"]) == ("json", "@timestamp", True)
    assert tail["read_from_head"] is True and tail["db"] and tail["buffer_max_size"] == "1M"
    assert output["match"] == tail["tag"] and output["format"] == "plain"


def test_the_vector_snippet_receives_tls_syslog_and_emits_the_parsed_record_without_test_messages() -> None:
    text = (SHIPPED / "vector.toml").read_text()
    assert "NOT EXERCISED HERE" in text
    conf = tomllib.loads(text)
    (name, source), = conf["sources"].items()
    (transform_name, transform), = conf["transforms"].items()
    (sink,) = conf["sinks"].values()
    assert (source["type"], source["mode"], source["tls"]["enabled"]) == ("syslog", "tcp", True)
    assert source["address"].endswith(":6514") and source["max_length"] >= 1 << 20
    assert transform["type"] == "remap" and transform["inputs"] == [name] and transform["drop_on_abort"] is True
    assert '.msgid == "TEST"' in transform["source"] and "parse_json!(string!(.message))" in transform["source"]
    assert sink["inputs"] == [transform_name] and sink["encoding"]["codec"] == "json"
