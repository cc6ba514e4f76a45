"""What the agent's OVSDB IDL watches (policy_agent/ovs/bridge.py): everything it may read, nothing
vswitchd rewrites every few seconds on an idle node."""

from __future__ import annotations

from ovs.db.idl import SchemaHelper

from policy_agent.ovs.bridge import UNWATCHED_COLUMNS, watch_columns


def test_every_table_is_watched_but_the_counters_and_status_vswitchd_rewrites_periodically() -> None:
    helper = SchemaHelper()  # the installed Open_vSwitch schema
    every_table = set(helper.schema_json["tables"])
    watch_columns(helper)
    tables = helper.get_idl_schema().tables
    assert set(tables) == every_table
    assert "statistics" not in tables["Interface"].columns and "status" not in tables["Controller"].columns
    for needed in ("name", "ofport", "type", "options", "external_ids"):
        assert needed in tables["Interface"].columns
    assert "target" in tables["Controller"].columns and "ports" in tables["Bridge"].columns
    for table, columns in UNWATCHED_COLUMNS.items():
        assert not columns & set(tables[table].columns)
