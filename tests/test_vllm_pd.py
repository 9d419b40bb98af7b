"""The real vLLM P/D pair (tests/vllm_fixtures.py, UCX's own seed-002 leak): what `leaktrace ps` and `leaktrace
hunt --vllm` must get right on it. Each process's label and role, the effective UCX settings read from live
memory, the instances and the load from /metrics, and the leak named in the worker that holds UCX's chunks,
with UCX's library, its call path, the remedy with the live value, and a rate that the chunks account for.

The hunt runs once, as a user types it (`hunt --vllm --duration 90`, no tuning flags), inside the pair's
network namespace (it scrapes /metrics there); the assertions are on what the tool must get right, never
on how fast the machine served: counts and rates are compared with what the same window really held.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import vllm_fixtures
from vllm_fixtures import RealPair, vintage_pd

from leaktrace.session import SessionReader

real_pd = vllm_fixtures.real_pd  # the module's one real pair (a fixture)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

HUNT_S = 90
CHUNK = 151552  # one mpool chunk of UCX's rcache invalidation queue (148 KiB), mapped by UCM's raw mmap
UCX_LIB = re.compile(r"(?:^|/)libuc[ms](?:-[0-9a-f]{8})?\.so")


@dataclass
class Hunt:
    pd: RealPair
    out: Path
    stderr: str
    requests: int  # completions the test's load got through during the hunt
    sampler: vintage_pd.RssSampler
    report: dict = field(default_factory=dict)

    def ledger_window(self, pid: int) -> tuple[float, float]:
        """The window the hunt rated a pid's ledger over: its first ledger snapshot to its last (seconds of the
        hunt's clock)."""
        snaps = SessionReader(self.out).table("ledger_snapshots")
        t = snaps.loc[snaps["pid"] == pid, "t"]
        return float(t.min()), float(t.max())

    def proc_mb_per_min(self, pid: int) -> float:
        """The pid's /proc RSS slope over the window the hunt rated its ledger over (the session's t0_monotonic
        is the same CLOCK_MONOTONIC as the sampler's)."""
        t0 = float(SessionReader(self.out).meta["t0_monotonic"])
        a, b = self.ledger_window(pid)
        return self.sampler.mb_per_min(pid, t0 + a, t0 + b)

    def ucx_chunks_held(self, pid: int, born_after: float | None = None) -> int:
        """148 KiB regions mapped through UCX during the hunt (after ``born_after``, seconds of the hunt's clock)
        and still held at its end, in one process."""
        reg = SessionReader(self.out).table("ledger_regions")
        mine = reg[(reg["pid"] == pid) & reg["library"].fillna("").str.contains(UCX_LIB)
                   & ~reg["preexisting"].astype(bool) & (reg["size"] == CHUNK)]
        if born_after is not None:
            mine = mine[mine["t_born"] > born_after]
        return len(mine)


@pytest.fixture(scope="module")
def hunt(real_pd: RealPair, tmp_path_factory: pytest.TempPathFactory) -> Hunt:
    root = tmp_path_factory.mktemp("pd")
    out, err_path = root / "hunt", root / "hunt.stderr"
    sampler = vintage_pd.RssSampler(list(real_pd.workers.values()))
    sampler.start()
    ok0 = real_pd.load.ok
    with open(err_path, "w") as err:
        p = real_pd.cli_popen("hunt", "--vllm", "--duration", str(HUNT_S), "--out", str(out), stderr=err)
    try:
        p.wait(timeout=HUNT_S + 600)
    finally:
        sampler.stop()
        if p.poll() is None:
            p.kill()
            p.wait()
    stderr = err_path.read_text()
    assert p.returncode == 0, stderr[-3000:]
    h = Hunt(real_pd, out, stderr, real_pd.load.ok - ok0, sampler)
    h.report = json.loads((out / "report.json").read_text())
    return h


def _ucx_culprits(h: Hunt) -> list[dict]:
    mine = set(h.pd.workers.values())
    return [c for c in h.report["culprits"] if c["pid"] in mine and UCX_LIB.search(c.get("library") or "")]


def _ps(pd: RealPair) -> dict[int, dict]:
    r = pd.cli("ps", "--json")
    assert r.returncode == 0, r.stderr
    return {p["pid"]: p for p in json.loads(r.stdout)}


def test_ps_labels_roles_and_live_ucx_settings(real_pd: RealPair) -> None:
    procs = _ps(real_pd)
    assert procs[real_pd.proxy.pid]["label"] == "proxy"
    for server, role in ((real_pd.prefill, "prefill"), (real_pd.decode, "decode")):
        mine = [p for p in procs.values() if p["instance"] == server.pid]
        assert {p["role"] for p in mine} == {role}, (role, [(p["pid"], p["role"]) for p in mine])
        labels = sorted(p["label"] for p in mine)
        assert labels.count("api-server") == 1 and labels.count("engine-core") == 1, labels
        assert labels.count("worker") == 1, labels  # the CPU build starts one VLLM::Worker
        api = procs[server.pid]
        assert "proxy pid" in api["role_source"], api["role_source"]
        assert api["port"] == server.port and "torch" in api["lib_groups"]
        assert api["config"]["kv_transfer_config"]["kv_connector"] == "NixlConnector"
        assert api["config"]["multiproc_method"]["value"] == "spawn"  # the CPU platform forces it, in-process
        engine = next(p for p in mine if p["label"] == "engine-core")
        assert engine["title"].startswith("VLLM::EngineCore") and engine["ppid"] == server.pid
        assert all(v["source"] for v in engine["config"]["env"].values())  # retitled: still a source each
        w = next(p for p in mine if p["label"] == "worker")
        assert w["pid"] == real_pd.workers[role]
        # On the CPU build the NIXL agent and UCX live in the worker.
        assert {"ucx", "nixl"} <= set(w["lib_groups"]), w["lib_groups"]
        u = w["config"]["ucx"]
        assert u["hooks_active"] is True and u["hook_mode"] == "bistro", u
        # Set at launch; vLLM retitles its processes (/proc/PID/environ is empty), so only live memory has it.
        assert u["rcache_max_unreleased"] == "inf", u
        assert "live environ" in u["sources"]["UCX_RCACHE_MAX_UNRELEASED"], u["sources"]
        assert u["leak_prone"] is True, u


def test_hunt_names_ucx_in_the_worker_that_holds_its_chunks(hunt: Hunt) -> None:
    rep = hunt.report
    assert hunt.requests > 0, hunt.stderr[-2000:]
    assert rep["verdict"] == "leak", (rep["verdict"], rep.get("verdict_reason"), rep["culprits"])
    found = _ucx_culprits(hunt)
    assert found, ([(c["pid"], c.get("library"), c["mb_per_min"]) for c in rep["culprits"]], hunt.pd.workers)
    c = found[0]
    role = next(r for r, p in hunt.pd.workers.items() if p == c["pid"])
    # The mechanism, read from the ledger: the named worker ends the hunt holding UCX's 148 KiB chunks mapped
    # during it (one per ~1,000 munmaps), far more than any other worker of the pair.
    held = {r: hunt.ucx_chunks_held(p) for r, p in hunt.pd.workers.items()}
    assert held[role] >= 8 and held[role] == max(held.values()), held
    assert c["process_title"].startswith("VLLM::Worker"), c["process_title"]
    server = hunt.pd.prefill if role == "prefill" else hunt.pd.decode
    assert c["instance"] == server.pid, c
    inst = next(i for i in rep["instances"] if i["instance"] == c["instance"])
    assert inst["role"] == role, inst
    # The call path: the pool of the rcache's invalidation queue (libucs's ucs_mpool_grow), grown through UCM's
    # raw mmap (ucm_orig_mmap_syscall).
    assert any("ucm_orig_mmap_syscall" in f for f in c["stack"]), c["stack"]
    assert any(re.search(r"libucs.*ucs_mpool_grow", f) for f in c["stack"]), c["stack"]
    # The remedy names the setting with the value read from the live process.
    assert "UCX_RCACHE_MAX_UNRELEASED=inf" in c["remedy"], c["remedy"]
    assert "live environ" in c["remedy"], c["remedy"]
    assert c.get("rule") == "ucx-rcache", c
    assert c["first_named_s"] is not None and 0 <= c["first_named_s"] <= rep["duration_s"], c["first_named_s"]


def test_ucx_rate_is_what_its_chunks_and_proc_account_for(hunt: Hunt) -> None:
    """The rate is the growth of what the worker holds, over the window it was rated on: the chunks UCX mapped
    in that window and still holds at its end, per minute of it. It cannot exceed the worker's own RSS growth
    from /proc over the same window (UCX's chunks are written as the queue fills them)."""
    found = _ucx_culprits(hunt)
    assert found, hunt.report["culprits"]
    pid = found[0]["pid"]
    ucx = sum(c["mb_per_min"] for c in found if c["pid"] == pid)
    a, b = hunt.ledger_window(pid)
    chunks = hunt.ucx_chunks_held(pid, born_after=a)
    from_chunks = chunks * CHUNK / 2**20 / ((b - a) / 60)
    proc = hunt.proc_mb_per_min(pid)
    print(f"UCX {ucx:.2f} MB/min; {chunks} chunks born and held in {b - a:.0f} s = {from_chunks:.2f} MB/min; "
          f"worker /proc {proc:.2f} MB/min", file=sys.stderr)
    # Both measure the same chunks over the same window. The traffic, and so the growth, comes in bursts (a KV
    # read can wait out the prefill's 30 s lease), and the tool rates such a series from its shape, not from
    # its two ends: within a factor of 2 of the chunks' mean rate, whichever way the bursts fall.
    assert 0.5 * from_chunks <= ucx <= 1.6 * from_chunks, (ucx, from_chunks, chunks, (a, b))
    assert ucx <= 1.3 * proc + 1.0, (ucx, proc)


def test_instances_and_load_from_metrics(hunt: Hunt) -> None:
    rep, pd = hunt.report, hunt.pd
    roles = {i["instance"]: i["role"] for i in rep["instances"]}
    assert roles.get(pd.prefill.pid) == "prefill" and roles.get(pd.decode.pid) == "decode", rep["instances"]
    ld = rep["load"]
    per = {e["instance"]: e for e in ld["per_instance"]}
    # Every request's prompt KV reaches decode by NIXL transfer from prefill: transfers happened and decode's
    # prompt tokens came from them; prefill computed its own and received none.
    dec, pre = per[pd.decode.pid], per[pd.prefill.pid]
    assert dec["role"] == "decode" and dec["kv_transfers"] >= 1 and dec["kv_external_prompt_tokens"] > 0, dec
    assert pre["role"] == "prefill" and pre["kv_external_prompt_tokens"] == 0, pre
    # Requests counted during the hunt: at least one, and no more than the load completed from the hunt's
    # start to its exit (the counters are read inside that span).
    assert 1 <= dec["requests"] <= hunt.requests, (dec, hunt.requests)
    # What the leak costs per request: the instance's culprits' rate over its request rate in the same scrapes.
    c = _ucx_culprits(hunt)[0]
    leaking = per[c["instance"]]
    assert leaking["leak_mb_per_min"] > 0, leaking
    assert leaking["leak_bytes_per_request"] == pytest.approx(
        leaking["leak_mb_per_min"] * 2**20 / (leaking["requests"] * 60 / leaking["span_s"]), rel=0.01), leaking
    # One vocabulary everywhere: report.json's processes say what `ps --json` says, titles beside.
    by_pid = {p["pid"]: p for p in rep["processes"]}
    assert by_pid[c["pid"]]["label"] == "worker" and by_pid[c["pid"]]["title"] == c["process_title"]
    assert by_pid[pd.prefill.pid]["label"] == "api-server" and by_pid[pd.decode.pid]["label"] == "api-server"
    role = roles[c["instance"]]
    assert f"vLLM instance {c['instance']} ({role})" in (hunt.out / "report.md").read_text()
    assert f"vLLM instance {c['instance']} ({role})" in (hunt.out / "report.html").read_text()


def test_ps_with_proxy_down_falls_back_to_metrics(real_pd: RealPair) -> None:
    real_pd.proxy.stop()
    try:
        procs = _ps(real_pd)
        assert procs[real_pd.decode.pid]["role"] == "decode", procs[real_pd.decode.pid]["role_source"]
        assert "/metrics" in procs[real_pd.decode.pid]["role_source"], procs[real_pd.decode.pid]["role_source"]
        assert procs[real_pd.prefill.pid]["role"] == "prefill", procs[real_pd.prefill.pid]["role_source"]
    finally:
        real_pd.restart_proxy()
