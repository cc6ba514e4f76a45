"""Inline audit writes (the event loop writing a lone record) stay off where a write can hang."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from auditlog.writer import INLINE_GAP
from auditlog.writer_dir import filesystem_type, inline_writes_allowed
from policy_agent.audit_trail import build_audit as _build_audit
from policy_agent.config.loader import loads
from policy_agent.policy.rules import RuleRegistry

MOUNTINFO = "\n".join([
    "22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw",
    "30 22 0:40 / /var/log rw shared:9 - nfs4 srv:/logs rw,vers=4.2",
    "31 30 0:41 / /var/log/local rw shared:10 - tmpfs tmpfs rw",
    r"32 22 0:42 / /mnt/with\040space rw shared:11 - fuse.sshfs host:/x rw",
    "garbage line without separator",
])


@pytest.mark.parametrize(("path", "fstype"), [
    ("/var/log/npaudit/audit.jsonl", "nfs4"),      # nested under the NFS mount
    ("/var/log/local/npaudit/audit.jsonl", "tmpfs"),  # the longest mount point wins
    ("/var/lib/npaudit/audit.jsonl", "ext4"),
    ("/mnt/with space/audit.jsonl", "fuse.sshfs"),  # octal escapes in mountinfo
    ("/var/logs/audit.jsonl", "ext4"),               # /var/log is not a prefix of /var/logs
])
def test_filesystem_type_is_the_longest_mount_holding_the_path(path: str, fstype: str) -> None:
    assert filesystem_type(Path(path), MOUNTINFO) == fstype


@pytest.mark.parametrize(("path", "wanted", "allowed"), [
    ("/var/lib/npaudit/audit.jsonl", True, True),
    ("/var/lib/npaudit/audit.jsonl", False, False),
    ("/var/log/npaudit/audit.jsonl", True, False),
    ("/mnt/with space/audit.jsonl", True, False),
    ("/var/log/local/audit.jsonl", True, True),
])
def test_inline_writes_only_where_wanted_and_a_write_cannot_hang(path: str, wanted: bool, allowed: bool,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="auditlog.writer"):
        assert inline_writes_allowed(Path(path), wanted, MOUNTINFO) is allowed
    # Turned off by the filesystem: said once, naming it; turned off by config: nothing to say.
    assert bool(caplog.records) is (wanted and not allowed)


def test_this_hosts_mountinfo_names_the_root_filesystem() -> None:
    assert filesystem_type(Path("/")) not in ("", None)


@pytest.mark.parametrize(("setting", "gap"), [("true", INLINE_GAP), ("false", None)])
def test_the_agents_writer_follows_audit_inline_writes(tmp_path: Path, setting: str, gap: float | None) -> None:
    config = loads(f"audit:\n  path: {tmp_path / 'audit' / 'audit.jsonl'}\n  inline_writes: {setting}\n")
    _, writer = _build_audit(config, RuleRegistry(), lambda: None, lambda: 0.0, lambda: False)
    try:
        assert writer._inline_gap == gap
    finally:
        writer.close()
