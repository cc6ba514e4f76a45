# Two entry points, each doing all of its own set-up, idempotently, on a fresh
# Debian 12 machine run as root:  `make demo`  and  `make test`.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
APT_PACKAGES := openvswitch-switch openvswitch-common python3-openvswitch \
	python3-bpfcc bpfcc-tools linux-headers-amd64 containernetworking-plugins \
	iproute2 iptables iputils-ping ethtool acl rsyslog rsyslog-openssl rsyslog-relp procps python3-venv python3-dev gcc libssl-dev jq nodejs
KREL  := $(shell uname -r)

.PHONY: all setup system venv syslog-ng promtool ovn lint test test-unit test-integration demo bench clean

all: test

setup: system venv

# apt only when something is missing, so a second run costs a dpkg query.
system:
	@missing=$$(for p in $(APT_PACKAGES); do \
		dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing: $$missing"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -q && apt-get install -y -q --no-install-recommends $$missing; \
	fi
	@# bcc compiles against kernel headers; this VM kernel ships none, so point
	@# bcc at Debian's generic headers (only when nothing is there already).
	@mkdir -p /lib/modules/$(KREL)
	@if [ ! -e /lib/modules/$(KREL)/build ]; then \
		ln -sfn $$(ls -d /usr/src/linux-headers-*-amd64 | sort -V | tail -n1) /lib/modules/$(KREL)/build; fi
	@if [ ! -e /lib/modules/$(KREL)/source ]; then \
		ln -sfn $$(ls -d /usr/src/linux-headers-*-common | sort -V | tail -n1) /lib/modules/$(KREL)/source; fi

$(VENV)/.stamp: pyproject.toml setup.py auditlog/_record_fast.c auditlog/_frame_fast.c auditlog/_frame_fast.h \
		auditlog/_aggregate_fast.c auditlog/_aggregate_fast.h packetin/_layout_fast.c
	@test -x $(PY) || /usr/bin/python3 -m venv --system-site-packages $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $@

venv: system $(VENV)/.stamp

# syslog-ng for the receiver tests: Debian's package conflicts with rsyslog, so its .debs are
# downloaded and unpacked into .cache/syslog-ng (never installed); nothing to do once there.
syslog-ng: venv
	@$(PY) -m tests.support.syslog_ng >/dev/null

# promtool for the metrics and alert-rule tests: Debian's prometheus package would start a Prometheus
# server, so its .deb is downloaded and unpacked into .cache/promtool (never installed); nothing to do once there.
promtool: venv
	@$(PY) -m tests.support.promtool >/dev/null

# OVN 23.03 (ovn-controller, ovn-northd, ovn-nbctl and their schemas) for the comparison the latency bench runs
# (bench/agent_latency.py --ovn) and its test: Debian's ovn-host and ovn-central would enable and start their
# services, so their .debs are downloaded and unpacked into .cache/ovn (never installed); nothing to do once there.
ovn: venv
	@$(PY) -m tests.support.ovn >/dev/null

# Types (mypy over the production packages) and lint (ruff over the whole tree); configured in
# pyproject.toml. `test` runs it first, so a lint failure fails `make test` and CI.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: setup syslog-ng promtool ovn lint
	$(PY) -m pytest -q --durations=40 tests

test-unit: setup promtool
	$(PY) -m pytest -q tests/unit

test-integration: setup syslog-ng promtool ovn
	$(PY) -m pytest -q tests/integration tests/e2e

demo: setup
	$(VENV)/bin/npaudit demo

# Every bench/*.py not starting with "_", one after another; writes bench/RESULTS.md.
# BENCH_ARGS e.g. '--only pod_throughput' or '--note "The machine was shared."'.
bench: setup
	$(PY) bench/run_all.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
