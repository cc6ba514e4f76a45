"""`npaudit logs` over a recorded multi-file set (real writer, gzip): filters, --not, time, --last, exit codes."""

from __future__ import annotations

import datetime as dt
import gzip
import ipaddress
import json
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auditlog.fileset import audit_files
from auditlog.query import Filter, Query, QueryError, parse_time
from policy_agent.cli.main import main
from tests.support.audit_records import T0, sample_record, stamp, write_set

N = 240
Rec = dict[str, Any]
UTC = dt.timezone.utc


@pytest.fixture(scope="module")
def logset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("logs")
    write_set(directory / "audit.jsonl", (sample_record(i) for i in range(N)), max_bytes=12_000)
    return directory


@pytest.fixture(scope="module")
def records(logset: Path) -> list[Rec]:
    """Every record of the set, oldest first, read independently of npaudit logs."""
    out = []
    for _, path in audit_files(logset / "audit.jsonl"):
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as f:
            out += [json.loads(line) for line in f]
    return out


def run(capsysbinary: pytest.CaptureFixture[bytes], *args: str) -> tuple[int, bytes, str]:
    code = main(["logs", *args])
    captured = capsysbinary.readouterr()
    return code, captured.out, captured.err.decode()


def seqs_of(out: bytes) -> list[int]:
    return [json.loads(line)["npaudit"]["seq"] for line in out.splitlines()]


def pods(r: Rec) -> list[tuple[str, str]]:
    return [(p["pod"]["namespace"], p["pod"]["name"]) for side in ("source", "destination")
            if (p := r["npaudit"].get(side))]


def in_net(ip: str, net: str) -> bool:
    return ipaddress.ip_address(ip) in ipaddress.ip_network(net)


# (arguments, the records they must select) for every filter kind.
CASES: list[tuple[list[str], Callable[[Rec], bool]]] = [
    (["--pod", "client-1"], lambda r: any(n.startswith("client-1") for _, n in pods(r))),
    (["--pod", "backend/d"], lambda r: any(ns == "backend" and n.startswith("d") for ns, n in pods(r))),
    (["--pod", "kube-system/"], lambda r: any(ns == "kube-system" for ns, _ in pods(r))),
    (["--from-pod", "frontend/client-2"], lambda r: r["npaudit"]["source"]["pod"]["namespace"] == "frontend"
     and r["npaudit"]["source"]["pod"]["name"].startswith("client-2")),
    (["--to-pod", "db"], lambda r: "destination" in r["npaudit"]
     and r["npaudit"]["destination"]["pod"]["name"].startswith("db")),
    (["-n", "backend"], lambda r: any(ns == "backend" for ns, _ in pods(r))),
    (["--namespace", "frontend", "-n", "kube-system"],
     lambda r: any(ns in ("frontend", "kube-system") for ns, _ in pods(r))),
    (["--policy", "deny-all"], lambda r: r["rule"]["ruleset"] == "AntreaClusterNetworkPolicy:deny-all"),
    (["--policy", "backend/allow-web"], lambda r: r["rule"]["ruleset"] == "NetworkPolicy:backend/allow-web"),
    (["--policy", "NetworkPolicy:frontend/allow-web"],
     lambda r: r["rule"]["ruleset"] == "NetworkPolicy:frontend/allow-web"),
    (["--policy", "allow-web"], lambda r: r["rule"]["ruleset"].endswith("/allow-web")),
    (["--rule", "rule-2"], lambda r: r["rule"]["name"] == "rule-2"),
    (["--rule", "101"], lambda r: r["rule"]["id"] == "101"),
    (["--tier", "Baseline"], lambda r: r["rule"]["category"] == "baseline"),
    (["--disposition", "DROP"], lambda r: r["npaudit"]["disposition"] == "Drop"),
    (["--disposition", "reject", "--disposition", "pass"], lambda r: r["npaudit"]["disposition"] in ("Reject", "Pass")),
    (["--direction", "egress"], lambda r: r["network"]["direction"] == "egress"),
    (["--ip", "10.244.1.0/24"], lambda r: in_net(r["source"]["ip"], "10.244.1.0/24")
     or in_net(r["destination"]["ip"], "10.244.1.0/24")),
    (["--ip", "fd00::99"], lambda r: r["destination"]["ip"] == "fd00::99"),
    (["--from-ip", "10.244.0.4"], lambda r: r["source"]["ip"] == "10.244.0.4"),
    (["--from-ip", "fd00::/64"], lambda r: ":" in r["source"]["ip"]),
    (["--to-ip", "10.96.2.0/24"], lambda r: in_net(r["destination"]["ip"], "10.96.2.0/24")),
    (["--port", "443"], lambda r: r["destination"]["port"] == 443),
    (["--port", "40007"], lambda r: r["source"]["port"] == 40007),
    (["--protocol", "UDP"], lambda r: r["network"]["transport"] == "udp"),
    (["--protocol", "1"], lambda r: r["network"]["iana_number"] == "1"),
    (["--label", "audit-b"], lambda r: r.get("labels", {}).get("log_label") == "audit-b"),
    (["--node", "node-b"], lambda r: r["observer"]["hostname"] == "node-b"),
    # AND across kinds, OR within a kind.
    (["--disposition", "drop", "--protocol", "tcp", "--protocol", "icmp", "-n", "backend"],
     lambda r: r["npaudit"]["disposition"] == "Drop" and r["network"]["transport"] in ("tcp", "icmp")
     and any(ns == "backend" for ns, _ in pods(r))),
    # --not negates the next filter only.
    (["--not", "--disposition", "allow"], lambda r: r["npaudit"]["disposition"] != "Allow"),
    (["--not", "-n", "kube-system", "--not", "-n", "backend"],
     lambda r: not any(ns in ("kube-system", "backend") for ns, _ in pods(r))),
    (["--protocol", "tcp", "--not", "--port", "80"],
     lambda r: r["network"]["transport"] == "tcp" and 80 not in (r["source"]["port"], r["destination"]["port"])),
    # Negated kinds hide a record that matches all of them (hubble observe's blacklist).
    (["--not", "--disposition", "allow", "--not", "--node", "node-a"],
     lambda r: not (r["npaudit"]["disposition"] == "Allow" and r["observer"]["hostname"] == "node-a")),
]


@pytest.mark.parametrize(("args", "want"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_each_filter_selects_exactly_the_records_it_names(logset, records, capsysbinary, args, want):
    code, out, err = run(capsysbinary, str(logset), "-o", "json", *args)
    expected = [r["npaudit"]["seq"] for r in records if want(r)]
    assert code == 0, err
    assert 0 < len(expected) < N, "the case must select some records and leave some out"
    assert seqs_of(out) == expected


def test_records_come_oldest_first_across_rotated_gzip_files_byte_for_byte(logset, capsysbinary):
    files = audit_files(logset / "audit.jsonl")
    assert len(files) > 5 and sum(p.name.endswith(".gz") for _, p in files) >= 5
    raw = b"".join(gzip.open(p).read() if p.name.endswith(".gz") else p.read_bytes() for _, p in files)
    code, out, _ = run(capsysbinary, str(logset))  # not a terminal: json by default
    assert code == 0
    assert out == raw
    assert seqs_of(out) == list(range(1, N + 1))


def test_since_and_until_take_absolute_times_in_several_forms(logset, records, capsysbinary):
    start, end = stamp(T0 + 100), stamp(T0 + 110)  # records 100..110, inclusive
    for since, until in ((start, end), (start.replace("Z", "+00:00"), end),
                         ("2024-05-01T04:15:43.5+02:00", "2024-05-01 02:15:53.500")):
        code, out, err = run(capsysbinary, str(logset), "--since", since, "--until", until)
        assert (code, err) == (0, "")
        assert seqs_of(out) == [r["npaudit"]["seq"] for r in records[100:111]]
    code, out, _ = run(capsysbinary, str(logset), "--until", "2024-05-01")
    assert (code, out) == (0, b"")


def test_relative_times_count_back_from_now():
    now = dt.datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    for text, delta in (("30s", dt.timedelta(seconds=30)), ("10m", dt.timedelta(minutes=10)),
                        ("2h", dt.timedelta(hours=2)), ("7d", dt.timedelta(days=7)),
                        ("1h30m", dt.timedelta(minutes=90)), ("0s", dt.timedelta(0))):
        assert parse_time("--since", text, now) == now - delta
    # dateutil's fuzzy parser would read "10m" as 00:10 today; the absolute forms are strict ISO.
    assert parse_time("--since", "2024-05-01T02:14:03Z", now) == dt.datetime(2024, 5, 1, 2, 14, 3, tzinfo=UTC)
    assert parse_time("--since", "2024-05-01", now) == dt.datetime(2024, 5, 1, tzinfo=UTC)


@pytest.mark.parametrize("bad", ["10x", "m10", "10 m", "yesterday", "2024-13-01", "2024-05-01T25:00", "", "-5m"])
def test_a_bad_time_is_refused_with_its_option_named(bad):
    with pytest.raises(QueryError, match="--until"):
        parse_time("--until", bad, dt.datetime(2024, 5, 1, tzinfo=UTC))


def test_relative_since_selects_by_the_clock_given(logset, records):
    from io import BytesIO, StringIO

    from auditlog.logs_command import LogsRequest, run_logs

    out, err = BytesIO(), StringIO()
    now = dt.datetime.fromtimestamp(T0 + N - 1, UTC)  # the last record's time
    req = LogsRequest(paths=[logset], since="10s")
    assert run_logs(req, out=out, err=err, now=now, tty=False, colour=False) == 0
    assert seqs_of(out.getvalue()) == [r["npaudit"]["seq"] for r in records[N - 11:]]


def test_last_n_takes_the_newest_matches_across_files(logset, records, capsysbinary):
    code, out, _ = run(capsysbinary, str(logset), "--last", "30")
    assert seqs_of(out) == list(range(N - 29, N + 1))
    code, out, _ = run(capsysbinary, str(logset), "--last", "25", "--disposition", "reject")
    rejects = [r["npaudit"]["seq"] for r in records if r["npaudit"]["disposition"] == "Reject"]
    assert seqs_of(out) == rejects[-25:]
    assert run(capsysbinary, str(logset), "--last", "0")[:2] == (0, b"")
    assert seqs_of(run(capsysbinary, str(logset), "--last", "100000")[1]) == list(range(1, N + 1))


@pytest.mark.parametrize(("args", "message"), [
    (["--disposition", "denied"], "--disposition 'denied': not one of allow, drop, reject, pass"),
    (["--direction", "both"], "--direction 'both'"),
    (["--ip", "10.0.0.300"], "--ip '10.0.0.300': not an IP address or CIDR"),
    (["--to-ip", "10.0.0.0/33"], "--to-ip '10.0.0.0/33'"),
    (["--port", "65536"], "--port '65536': not a port"),
    (["--port", "http"], "--port 'http'"),
    (["--protocol", "tcpp"], "--protocol 'tcpp': not a protocol"),
    (["--pod", "a/b/c"], "--pod 'a/b/c': not a Pod"),
    (["--from-pod", "/x"], "--from-pod '/x'"),
    (["-n", ""], "--namespace"),
    (["--since", "soon"], "--since 'soon'"),
    (["--since", "1h", "--until", "2h"], "is after --until"),
    (["--last", "-1"], "--last -1"),
    (["--follow", "--until", "1m"], "--until cannot be used with --follow"),
    (["--disposition", "drop", "--not"], "--not must be followed by a filter"),
])
def test_bad_input_exits_2_with_one_line_naming_it(logset, capsysbinary, args, message):
    code, out, err = run(capsysbinary, str(logset), *args)
    assert (code, out) == (2, b"")
    assert len(err.splitlines()) == 1 and message in err, err


def test_a_bad_path_exits_2(tmp_path, capsysbinary):
    code, out, err = run(capsysbinary, str(tmp_path / "nowhere"))
    assert (code, out) == (2, b"") and err.strip() == f"npaudit logs: {tmp_path / 'nowhere'}: no such file or directory"
    code, _, err = run(capsysbinary, str(tmp_path))  # a directory without audit files
    assert code == 2 and len(err.splitlines()) == 1 and "no audit.jsonl files" in err
    code, _, err = run(capsysbinary, "--follow", str(tmp_path / "nowhere" / "audit.jsonl"))
    assert (code, err) == (2, f"npaudit logs: {tmp_path / 'nowhere'}: no such directory\n")


def test_no_match_exits_0_and_prints_nothing(logset, capsysbinary):
    assert run(capsysbinary, str(logset), "--pod", "nobody") == (0, b"", "")
    # Table output tells a person why the screen stayed empty, on stderr only.
    assert run(capsysbinary, str(logset), "--pod", "nobody", "-o", "table") == (0, b"", "no matching records\n")


def test_filters_match_copies_re_encoded_by_other_tools(tmp_path, capsysbinary):
    # jq or a SIEM may add spaces and write non-ASCII unescaped: the quick substring
    # test must never hide a record the exact test would show.
    hostile = sample_record(1)
    hostile["npaudit"]["source"]["pod"]["name"] = "café-1"
    lines = [json.dumps(hostile, indent=None, ensure_ascii=False), json.dumps(sample_record(2), indent=1)
             .replace("\n", ""), json.dumps(sample_record(3), separators=(", ", " : "))]
    (tmp_path / "copy.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for args, count in ((["--pod", "backend/café"], 1), (["--pod", "caf"], 1), (["--disposition", "reject"], 1),
                        (["--port", "40002"], 1), (["--node", "node-b"], 2), (["--protocol", "tcp"], 1)):
        code, out, _ = run(capsysbinary, str(tmp_path / "copy.jsonl"), *args)
        assert code == 0 and len(out.splitlines()) == count, args


def test_several_sets_are_merged_by_time(tmp_path, capsysbinary):
    write_set(tmp_path / "a" / "audit.jsonl", (sample_record(i) for i in range(0, 40, 2)), max_bytes=5000)
    write_set(tmp_path / "b" / "audit.jsonl", (sample_record(i) for i in range(1, 40, 2)), max_bytes=5000)
    code, out, _ = run(capsysbinary, str(tmp_path / "a"), str(tmp_path / "b"), "--last", "39")
    assert code == 0
    assert [json.loads(line)["@timestamp"] for line in out.splitlines()] == [stamp(T0 + i) for i in range(1, 40)]


def test_a_gzip_file_cut_short_gives_what_it_holds_and_a_note(tmp_path, capsysbinary):
    write_set(tmp_path / "audit.jsonl", (sample_record(i) for i in range(60)), max_bytes=8000)
    oldest = audit_files(tmp_path / "audit.jsonl")[0][1]
    data = oldest.read_bytes()
    oldest.write_bytes(data[: len(data) // 2])
    code, out, err = run(capsysbinary, str(tmp_path))
    seqs = seqs_of(out)
    assert code == 0 and "gzip stream cut short" in err
    assert seqs == sorted(seqs) and seqs[-1] == 60 and len(seqs) < 60


def test_query_refuses_an_unknown_kind():
    with pytest.raises(QueryError, match="unknown filter --colour"):
        Query([Filter("colour", "red")])


def test_version_prints_the_package_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"npaudit {version('npaudit')}\n"


def reference(record: Rec, spec: list[str]) -> bool:
    """hubble's semantics for the pod, namespace and disposition kinds, written out plainly."""
    pod = record["npaudit"]["source"]["pod"]

    def hit(kind: str, value: str) -> bool:
        if kind == "pod":
            ns, _, prefix = value.rpartition("/")
            return (not ns or pod["namespace"] == ns) and pod["name"].startswith(prefix)
        if kind == "namespace":
            return pod["namespace"] == value
        return record["npaudit"]["disposition"].lower() == value

    def group(negated: bool) -> dict[str, list[str]]:
        kinds: dict[str, list[str]] = {}
        for item in spec:
            if item.startswith("!") == negated:
                kind, value = item.lstrip("!").split(":", 1)
                kinds.setdefault(kind, []).append(value)
        return kinds

    allow, deny = group(False), group(True)
    shown = all(any(hit(k, v) for v in values) for k, values in allow.items())
    hidden = bool(deny) and all(any(hit(k, v) for v in values) for k, values in deny.items())
    return shown and not hidden


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["frontend", "backend", "kube-system", "café"]),
                          st.sampled_from(["db-0", "web-1", "dns", "db-9x"]),
                          st.sampled_from(["Allow", "Drop"])), max_size=40),
       st.sampled_from([["pod:db"], ["namespace:backend", "disposition:drop"], ["pod:café/d"],
                        ["namespace:kube-system", "namespace:café"], ["pod:web", "pod:db"],
                        ["!namespace:backend", "!disposition:drop"], ["pod:d", "!namespace:café"],
                        ["!pod:db", "!pod:café/web"]]),
       st.booleans())
def test_the_quick_text_tests_never_change_what_is_shown(rows, spec, sparse):
    # The rare-text search over a block and the per-line text tests (for --not too) must
    # select what the plain semantics select, in order, whatever the encoding of the line.
    filler = b'{"npaudit":{"disposition":"Pass","source":{"pod":{"namespace":"other","name":"zz"}}}}'
    records = [{"npaudit": {"disposition": d, "source": {"pod": {"namespace": ns, "name": name}}}}
               for ns, name, d in rows]
    lines = [json.dumps(r, ensure_ascii=i % 2 == 0).encode() for i, r in enumerate(records)]
    if sparse:  # lines without any filter's text between the rows: the block search's sparse path
        lines = [x for line in lines for x in (line, *[filler] * 50)]
        records = [x for r in records for x in (r, *[json.loads(filler)] * 50)]
    query = Query([Filter(s.lstrip("!").split(":", 1)[0], s.split(":", 1)[1], s.startswith("!")) for s in spec])
    block = b"".join(line + b"\n" for line in lines)
    want = [line for line, r in zip(lines, records) if reference(r, spec)]
    assert [raw for raw, _ in query.select([block])] == want
