"""auditlog.compressor's codecs: ISA-L where the isal package is installed, zlib (said loudly) where not, the
same gzip files from both."""

from __future__ import annotations

import gzip
import io
import logging
import os
import subprocess
import sys
import zlib

import pytest

from auditlog import compressor as compressor_mod
from auditlog.compressor import ZLIB_FALLBACK_WARNING, gzip_codec, gzip_file
from auditlog.fileset import audit_files
from auditlog.verify import verify
from policy_agent.metrics import build_versions
from tests.support.audit_writer import record
from tests.support.audit_writer import live, make_writer  # noqa: F401 (fixtures)


@pytest.fixture
def without_isal(monkeypatch):
    """The isal package made unimportable, as on a platform without its wheel."""
    monkeypatch.setitem(sys.modules, "isal", None)
    monkeypatch.setitem(sys.modules, "isal.isal_zlib", None)


def test_the_agent_gzips_with_isal_where_it_is_installed():
    name, codec = gzip_codec()
    assert name == "isal" and codec.__name__ == "isal.isal_zlib"  # make setup installs it (pyproject.toml)
    assert build_versions()["audit_gzip"] == "isal"


def test_without_isal_the_codec_is_zlib_and_build_info_says_so(without_isal):
    assert gzip_codec() == ("zlib", zlib)
    assert build_versions()["audit_gzip"] == "zlib"


@pytest.mark.parametrize("codec", ["isal", "zlib"])
def test_both_codecs_write_a_gzip_file_that_gzip_and_python_read_back(tmp_path, codec, request):
    if codec == "zlib":
        request.getfixturevalue("without_isal")
    name, module = gzip_codec()
    assert name == codec
    data = b"".join(b'{"seq":%d,"event":{"id":"%032x"},"message":"Drop ingress udp"}\n' % (i, i * 7919)
                    for i in range(60_000))  # past one 1 MiB read
    assert len(data) > compressor_mod.MiB
    src = tmp_path / "audit.jsonl.1"
    src.write_bytes(data)
    os.utime(src, (1_700_000_000, 1_700_000_000))
    dst = tmp_path / "audit.jsonl.1.gz"
    with open(src, "rb") as f:
        gzip_file(f, dst, fsync=True, codec=module)
    assert gzip.decompress(dst.read_bytes()) == data
    # gzip(1), which an operator or a SIEM shipper would use
    assert subprocess.run(["gzip", "-dc", str(dst)], capture_output=True, check=True).stdout == data
    assert len(dst.read_bytes()) < len(data) / 5
    st = dst.stat()
    assert st.st_mtime == 1_700_000_000 and st.st_mode & 0o777 == compressor_mod.FILE_MODE


def test_a_failed_compression_leaves_no_file(tmp_path):
    class Broken(io.BytesIO):
        def read(self, *args):
            raise OSError("read error")

    dst = tmp_path / "x.gz"
    with pytest.raises(OSError, match="read error"):
        gzip_file(Broken(), dst, fsync=False)
    assert not dst.exists()


@pytest.mark.parametrize("codec", ["isal", "zlib"])
def test_the_writer_rotates_and_gzips_with_either_codec_and_warns_without_isal(live, make_writer, caplog, codec,
                                                                               request):
    if codec == "zlib":
        request.getfixturevalue("without_isal")
    caplog.set_level(logging.WARNING, logger="auditlog.compressor")
    w = make_writer(live, max_bytes=32 * 1024, backup_count=500, queue_size=10_000)
    n = 3_000
    for i in range(n):
        assert w.submit(record(i))
    assert w.flush_wait(30) and w.wait_compressed(30)
    assert w._compressor.codec == codec
    assert (ZLIB_FALLBACK_WARNING in caplog.text) == (codec == "zlib")
    rotated = [path for index, path in audit_files(live) if index]
    assert len(rotated) >= 5 and all(path.name.endswith(".gz") for path in rotated)
    assert w.stats["compressed"] == len(rotated) and w.stats["compress_errors"] == 0
    result = verify([live.parent])
    assert result.ok and (result.records, result.first_seq, result.last_seq) == (n, 1, n)
