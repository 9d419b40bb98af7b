"""The cluster command without a cluster: its answer when Ray is missing, bad requests, and the merge of
node reports (roles side by side, recurring culprits, failed nodes) on reports shaped like real ones."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_cli, wait_for

from leaktrace.cluster.merge import merge_reports, render_cluster
from leaktrace.cluster.request import CLUSTER_META, CLUSTER_SCHEMA, PidSpec
from leaktrace.errors import UsageError


def test_without_ray_one_line_says_how_to_install() -> None:
    # Ray made unimportable in this one process, exactly as on a machine without it.
    code = ("import sys; sys.modules['ray'] = None\n"
            "from leaktrace.cli import main\n"
            "main(['cluster', 'hunt', '--address', '127.0.0.1:6379', '--match', 'vllm'])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=str(REPO))
    assert r.returncode == 10, r.stderr
    assert r.stderr.count("\n") == 1
    assert "pip install 'leaktrace[cluster]'" in r.stderr


@pytest.mark.parametrize("args, needle", [
    (["--match", "x", "--vllm"], "exactly one of"),
    ([], "exactly one of"),
    (["--match", "("], "not a valid regular expression"),
    (["--pid", "lt-b=abc"], "expected PID or NODE=PID"),
    (["--match", "x", "--shared-dir", "relative/dir"], "absolute path"),
])
def test_bad_requests_are_usage_errors(args: list[str], needle: str) -> None:
    r = run_cli("cluster", "hunt", "--address", "127.0.0.1:1", *args, timeout=60)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and r.stderr.count("\n") == 1


def test_pid_spec() -> None:
    assert PidSpec.parse("4242") == PidSpec(4242, None)
    assert PidSpec.parse("10.0.0.3=17") == PidSpec(17, "10.0.0.3")
    with pytest.raises(UsageError):
        PidSpec.parse("0")


def _node_report(verdict: str, culprits: list[dict], processes: list[dict], instances: list[dict] | None = None):
    return {"schema": "leaktrace.report/1", "verdict": verdict, "duration_s": 20.0, "attach_s": 0.5,
            "processes": processes, "growth_by_class": {"anon": sum(p["anon_mb_per_min"] for p in processes)},
            "culprits": culprits, "ledger": {"outstanding_bytes": 1 << 20, "events": 10, "lost_events": 0,
                                             "available": True},
            "instances": instances or [], "warnings": []}


def _proc(pid: int, label: str, mbm: float) -> dict:
    return {"pid": pid, "ppid": 1, "label": label, "rss_mb_per_min": mbm, "anon_mb_per_min": mbm,
            "uss_mb_per_min": mbm}


def _culprit(pid: int, lib: str | None, mbm: float) -> dict:
    return {"kind": "native-mmap", "library": lib, "pid": pid, "process_label": "worker", "mb_per_min": mbm,
            "outstanding_bytes": 0, "stack": [], "evidence": [], "remedy": ""}


def test_merge_roles_recurring_and_failed_nodes(tmp_path: Path) -> None:
    ucm = "libucm-1a2b3c4d.so.0.0.0"
    prefill = _node_report("leak", [_culprit(11, ucm, 5.0)], [_proc(10, "api-server", 0.0), _proc(11, "worker", 5.0)],
                           [{"instance": 10, "role": "prefill", "port": 8100, "pids": [10, 11]}])
    decode = _node_report("leak", [_culprit(21, ucm, 400.0)], [_proc(20, "api-server", 0.1), _proc(21, "worker", 400.0)],
                          [{"instance": 20, "role": "decode", "port": 8200, "pids": [20, 21]}])
    entries = [
        {"node_id": "a" * 56, "hostname": "decode-0", "ip": "10.0.0.3", "status": "ok", "session": None},
        {"node_id": "b" * 56, "hostname": "prefill-0", "ip": "10.0.0.2", "status": "ok", "session": None},
        {"node_id": "c" * 56, "hostname": "spare", "ip": "10.0.0.4", "status": "failed",
         "reason": "no such process: 5", "session": None},
    ]
    rep = merge_reports({"address": "10.0.0.1:6379"}, [(entries[0], decode), (entries[1], prefill), (entries[2], None)])
    assert rep["verdict"] == "leak"
    assert [c["hostname"] for c in rep["culprits"]] == ["decode-0", "prefill-0"]  # fastest first
    assert list(rep["roles"]) == ["prefill", "decode"]
    assert rep["roles"]["decode"][0]["rss_mb_per_min"] == pytest.approx(400.1)
    assert rep["recurring_culprits"][0]["library"] == ucm
    assert rep["recurring_culprits"][0]["nodes"] == ["decode-0", "prefill-0"]
    assert rep["ledger"]["outstanding_bytes"] == 2 << 20 and rep["ledger"]["events"] == 20
    spare = next(n for n in rep["nodes"] if n["hostname"] == "spare")
    assert spare == {**spare, "status": "failed", "reason": "no such process: 5", "verdict": None, "culprits": []}

    # The same merge from a cluster session on disk, as `cluster report` does it.
    for e, r in ((entries[0], decode), (entries[1], prefill)):
        d = tmp_path / "nodes" / e["hostname"]
        d.mkdir(parents=True)
        (d / "report.json").write_text(json.dumps(r))
        e["session"] = f"nodes/{e['hostname']}"
    (tmp_path / CLUSTER_META).write_text(json.dumps({"schema": CLUSTER_SCHEMA, "address": "x", "nodes": entries}))
    on_disk = render_cluster(tmp_path)
    assert on_disk["roles"] == rep["roles"]
    md = (tmp_path / "report.md").read_text()
    assert "| prefill | prefill-0 |" in md and "| decode | decode-0 |" in md and "## Failed nodes" in md


def test_verdict_clean_failed_and_nodes_without_targets() -> None:
    ok = {"node_id": "a" * 56, "hostname": "n1", "status": "ok"}
    clean = _node_report("no-leak", [], [_proc(1, "worker", 0.0)])
    assert merge_reports({}, [(ok, clean)])["verdict"] == "no-leak"
    failed = {"node_id": "b" * 56, "hostname": "n2", "status": "failed", "reason": "node died"}
    assert merge_reports({}, [(ok, clean), (failed, None)])["verdict"] == "inconclusive"
    nothing_there = {"node_id": "c" * 56, "hostname": "n3", "status": "ok", "no_targets": True,
                     "reason": "no vLLM server on this node"}
    rep = merge_reports({}, [(ok, clean), (nothing_there, None)])
    assert rep["verdict"] == "no-leak"
    # nothing to hunt is an answer, not a failed node
    assert rep["nodes"][1]["status"] == "ok" and rep["nodes"][1]["no_targets"] and rep["nodes"][1]["verdict"] is None
    assert rep["nodes"][1]["reason"] == "no vLLM server on this node"
    assert "1 node(s) ok, 0 failed, 1 with nothing to hunt" in rep["stop_reason"]
    assert merge_reports({}, [(ok, clean), (nothing_there, None), (failed, None)])["verdict"] == "inconclusive"
    assert merge_reports({}, [(nothing_there, None)])["verdict"] == "inconclusive"
    # the cluster's confidence: the most likely leak among the nodes of its verdict
    leak = {**_node_report("leak", [], [_proc(2, "worker", 9.0)]), "confidence": 0.9}
    sure = {**clean, "confidence": 0.22}
    two = {"node_id": "d" * 56, "hostname": "n4", "status": "ok"}
    assert merge_reports({}, [(ok, sure), (two, leak)])["confidence"] == 0.9
    rep = merge_reports({}, [(ok, sure), (nothing_there, None)])
    assert rep["confidence"] == 0.22 and rep["nodes"][1]["confidence"] is None


def test_cluster_report_on_a_plain_directory_is_a_session_error(tmp_path: Path) -> None:
    r = run_cli("cluster", "report", tmp_path, timeout=60)
    assert r.returncode == 7 and "not a cluster session" in r.stderr


def test_match_picks_targets_but_not_the_driver(spawn) -> None:
    from leaktrace.cluster.node import match_processes

    target = spawn(["sleep", "61.5"], ready=None)
    # A process whose argv holds the pattern itself, as the driver's `--match PATTERN` does; the pattern
    # matches its own text, so only the exclusion keeps the driver out.
    pattern = "sleep 61.5"
    driver_like = spawn([sys.executable, "-c", "import time; time.sleep(60)", "--match", pattern], ready=None)
    assert wait_for(lambda: Path(f"/proc/{driver_like.pid}/cmdline").read_bytes().count(b"\0") >= 5, 10)
    found = {p["pid"] for p in match_processes(pattern)}
    assert target.pid in found and driver_like.pid not in found
