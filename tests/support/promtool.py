"""A private promtool for tests, from Debian's prometheus package unpacked beside the tree (never installed).

Installing Debian's `prometheus` would enable and start a Prometheus server; the
tests only need its `promtool` (a static Go binary). So `fetch` downloads the
.deb with `apt-get download` into a cache directory and unpacks it with
`dpkg-deb -x` into a private root; `make setup` runs it (`python -m
tests.support.promtool`), and it does nothing once the root is there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.debs import unpacked

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "promtool"
PACKAGE = "prometheus"


def fetch(cache: Path = CACHE) -> Path:
    """The path of the unpacked promtool binary: downloaded and unpacked once, then reused."""
    return unpacked(cache, (PACKAGE,), "usr/bin/promtool") / "usr" / "bin" / "promtool"


def check_metrics(binary: Path, exposition: bytes) -> subprocess.CompletedProcess[str]:
    """`promtool check metrics` over a scrape's body (read from stdin); lint problems go to stdout/stderr."""
    return subprocess.run([str(binary), "check", "metrics"], input=exposition.decode(), capture_output=True,
                          text=True, timeout=120)


def check_rules(binary: Path, *rule_files: Path) -> subprocess.CompletedProcess[str]:
    """`promtool check rules` over rule files (syntax, PromQL parse, duplicate rules, label/annotation
    templates)."""
    return subprocess.run([str(binary), "check", "rules", *map(str, rule_files)], capture_output=True, text=True,
                          timeout=120)


def check_config(binary: Path, prometheus_yml: Path) -> subprocess.CompletedProcess[str]:
    """`promtool check config` over a prometheus.yml (scrape configs, service discovery, the rule files it
    names)."""
    return subprocess.run([str(binary), "check", "config", str(prometheus_yml)], capture_output=True, text=True,
                          timeout=120)


def run_rule_tests(binary: Path, *test_files: Path) -> subprocess.CompletedProcess[str]:
    """`promtool test rules`: alert rules evaluated over given series, expected alerts compared."""
    return subprocess.run([str(binary), "test", "rules", *map(str, test_files)], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="session")
def promtool() -> Path:
    """The private promtool binary (`make promtool` unpacks it; fetched here if it was not)."""
    return fetch()


if __name__ == "__main__":
    print(fetch(Path(sys.argv[1]) if len(sys.argv) > 1 else CACHE))
