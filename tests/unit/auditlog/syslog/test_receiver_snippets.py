"""The shipped receiver snippets write one verbatim copy per node, and the Fluent Bit one says what it needs (issue 23)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

SHIPPED = Path(__file__).resolve().parents[4] / "config" / "syslog"


def test_fluent_bit_names_the_version_its_parsers_section_needs_and_skips_an_overlong_line() -> None:
    text = (SHIPPED / "fluent-bit.yaml").read_text()
    assert "3.2 or later" in text.splitlines()[0] and "3.x" not in text
    (tail,) = yaml.safe_load(text)["pipeline"]["inputs"]
    assert tail["skip_long_lines"] is True  # off stops the tail at the first line over buffer_max_size


def test_rsyslog_writes_the_verbatim_copy_per_node_through_a_safe_path() -> None:
    text = (SHIPPED / "rsyslog-receiver.conf").read_text()
    template = re.search(r'template\(name="npaudit_node_file" type="list"\) \{(.*?)\}', text, re.S)
    assert template is not None
    assert 'property(name="hostname" securepath="replace")' in template[1]
    assert 'constant(value="/var/log/npaudit-siem/nodes/")' in template[1]
    assert 'dynaFile="npaudit_node_file" template="npaudit_verbatim"' in text


def test_syslog_ng_writes_msg_unparsed_per_node_with_flow_control() -> None:
    text = (SHIPPED / "syslog-ng-receiver.conf").read_text()
    assert 'file("/var/log/npaudit-siem/nodes/${HOST}/audit.jsonl" template("${MSG}\\n") template-escape(no))' in text
    config = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert not any("json-parser" in line or "format-json" in line for line in config)  # numbers become strings
    assert "keep-hostname(yes)" in text and "flags(flow-control)" in text
    assert 'subst("/", "_", value("HOST") flags(global))' in text
