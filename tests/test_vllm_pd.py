"""A real vLLM P/D pair (NixlConnector over UCX, loopback only) and a small proxy.

The decode instance is started with UCX_RCACHE_MAX_UNRELEASED=inf (vLLM leaves a value it finds; the
prefill instance gets vLLM's own 1024, set in-process) and with tests/targets/libinvq_leak.so preloaded:
on 2 CPU cores the decode worker does too few munmaps for UCX's queue to grow measurably, so the library
reproduces the seed-002 mechanism in that worker (issue 5d). The report must name the decode instance,
the worker and the library.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from conftest import REPO, is_root, run_cli
from vllm_fixtures import Load, hunt_vllm, require_vllm, vllm_servers

from leaktrace.session import SessionReader

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
LEAK_LIB = REPO / ".cache" / "libinvq_leak.so"
# Syscalls a second that the hunt's kernel counters see in the tree while the stand-in keeps its pace
# (1,000 mmaps and 2,000 munmaps a second in the decode worker): 2,084 and 2,278 in the decode node's tree
# of two test_cluster_pd runs here (the same stand-in; this tree adds the prefill's own). Under a
# quarter of that, the box starved the pair and the stand-in barely ran (CI: 123 a second, 10,128 munmaps
# in 57 s, every process of the tree without events for 8-12 s at a time, the hunt's ticks 20 s late).
STAND_IN_SYSCALLS_S = 2000


@pytest.fixture(scope="module")
def pd():
    require_vllm()
    if not LEAK_LIB.exists():
        pytest.skip("no .cache/libinvq_leak.so (run tests/targets/setup_vllm.sh)")
    prefill, decode, proxy = vllm_servers.start_pd(
        decode_env={"UCX_RCACHE_MAX_UNRELEASED": "inf", "LD_PRELOAD": str(LEAK_LIB),
                    "LEAKTRACE_TESTLEAK_HZ": "2000"})
    try:
        vllm_servers.send_load(proxy.url, 2, timeout=120)  # warm-up: NIXL handshake, first transfer
        yield prefill, decode, proxy
    finally:
        proxy.stop()
        decode.stop()
        prefill.stop()


def _ps() -> dict[int, dict]:
    r = run_cli("ps", "--json")
    assert r.returncode == 0, r.stderr
    return {p["pid"]: p for p in json.loads(r.stdout)}


def test_ps_roles_and_ucx(pd) -> None:
    prefill, decode, proxy = pd
    procs = _ps()
    assert procs[proxy.pid]["label"] == "proxy"
    for server, role, max_unreleased in ((prefill, "prefill", "1024"), (decode, "decode", "inf")):
        mine = [p for p in procs.values() if p["instance"] == server.pid]
        assert {p["role"] for p in mine} == {role}, (role, [(p["pid"], p["role"]) for p in mine])
        assert "proxy pid" in mine[0]["role_source"]
        api = procs[server.pid]
        assert api["config"]["kv_transfer_config"]["kv_connector"] == "NixlConnector"
        workers = [p for p in mine if p["label"] == "worker"]
        assert len(workers) == 1
        w = workers[0]
        # On the CPU build the NIXL agent and UCX live in the worker.
        assert {"ucx", "nixl"} <= set(w["lib_groups"])
        u = w["config"]["ucx"]
        assert u["hooks_active"] is True and u["hook_mode"] == "bistro"
        assert u["rcache_max_unreleased"] == max_unreleased
        # prefill: vLLM set 1024 in-process; decode: our launch value. Both only visible in live memory.
        assert "live environ" in u["sources"]["UCX_RCACHE_MAX_UNRELEASED"]
        assert u["leak_prone"] is (role == "decode")


def _stand_in_starved(out: Path) -> bool:
    """The hunt's kernel counters saw the tree make under a quarter of the stand-in's syscalls."""
    if not is_root():
        return False  # no eBPF counters: nothing to tell it by
    c = SessionReader(out).table("bpf_counters")
    if len(c) < 2:
        return False
    span = float(c["t"].max() - c["t"].min())
    return span > 0 and float(c["syscalls"].max() - c["syscalls"].min()) < 0.25 * STAND_IN_SYSCALLS_S * span


def test_hunt_vllm_pd_names_decode_leak(pd, tmp_path) -> None:
    prefill, decode, proxy = pd
    # Two clients: a P/D request here may wait ~30 s (the decode pulls after the prefill's lease expires),
    # and one client alone once completed nothing inside a 40 s hunt under CI load.
    loads = [Load(proxy.url, pause=0.5), Load(proxy.url, pause=0.5)]
    for load in loads:
        load.start()
    try:
        # --no-pyheap: the count check below needs every munmap event consumed, and the pyheap walker still
        # stalls the hunt's ticks for 10-18 s at a time on vLLM's processes on 2 busy cores (events then
        # wait in the ring past the stop); open issue, see the session note of 2026-12-01.
        # 60 s: on 2 cores beside the pair the hunt's ticks can stop for 25-45 s at a time (CI once had none
        # between 6 s and 50 s of a 40 s hunt, and nothing was named).
        out = tmp_path / "h"
        rep, err = hunt_vllm(out, 60, ("--no-pyheap",))
        if _stand_in_starved(out):
            # The precondition failed, not the tool: the leak it must find hardly happened. Once more.
            warnings.warn(f"the box starved the P/D pair during the hunt ({out}): hunting once more", stacklevel=1)
            out = tmp_path / "h2"
            rep, err = hunt_vllm(out, 60, ("--no-pyheap",))
    finally:
        for load in loads:
            load.stop()
    load_ok = sum(load.ok for load in loads)
    roles = {i["instance"]: i["role"] for i in rep["instances"]}
    assert roles.get(prefill.pid) == "prefill" and roles.get(decode.pid) == "decode", rep["instances"]
    ld = rep["load"]
    # Requests completed during the hunt, counted on the decode instance: at least one, and no more
    # than the load completed (it ran before, through and after the hunt).
    assert load_ok > 0 and 1 <= ld["requests"] <= load_ok, (ld, load_ok)
    # Every request's prompt KV reaches decode by NIXL transfer from prefill: transfers happened and
    # decode's prompt tokens came from them; prefill computed its own and received none.
    assert ld["kv_transfers"] >= 1 and ld["kv_external_prompt_tokens"] > 0, ld
    per = {e["instance"]: e for e in ld["per_instance"]}
    assert per[decode.pid]["role"] == "decode" and per[decode.pid]["kv_external_prompt_tokens"] > 0, per
    assert per[decode.pid]["kv_transfers"] >= 1, per[decode.pid]
    assert per[prefill.pid]["role"] == "prefill" and per[prefill.pid]["kv_external_prompt_tokens"] == 0, per
    # What the leak costs per request and per token whose KV moved: the decode culprits' rate over the
    # decode's request and KV-token rates in the same scrapes; prefill leaks nothing of its own.
    dec = per[decode.pid]
    leak_b_min = dec["leak_mb_per_min"] * 2**20
    assert dec["leak_mb_per_min"] > 0 and per[prefill.pid]["leak_mb_per_min"] == 0, per
    assert dec["leak_bytes_per_request"] == pytest.approx(
        leak_b_min / (dec["requests"] * 60 / dec["span_s"]), rel=0.01), dec
    assert dec["leak_bytes_per_kv_token"] == pytest.approx(
        leak_b_min / (dec["kv_external_prompt_tokens"] * 60 / dec["span_s"]), rel=0.01), dec
    # 5d: the leak is named in the decode instance, in its worker, with the library.
    assert rep["verdict"] == "leak"
    worker = next(i for i in rep["instances"] if i["instance"] == decode.pid)
    worker_pids = [p["pid"] for p in worker["processes"] if p["label"] == "worker"]
    top = [c for c in rep["culprits"] if c["pid"] in worker_pids]
    assert top, rep["culprits"]
    # The stand-in's culprit, wherever it ranks: the worker's own warm-up can be named beside it (a
    # python-heap culprit once ranked first in CI); without root the watcher names no library.
    c = next((x for x in top if x.get("library") == "libinvq_leak.so"), top[0])
    assert c["instance"] == decode.pid and c["process_label"] == "worker"
    assert c.get("role") == "decode", c
    from leaktrace.report import html, markdown  # the hunt wrote JSON only (--format json)

    assert f"vLLM instance {decode.pid} (decode)" in markdown.render(rep)
    assert f"vLLM instance {decode.pid} (decode)" in html.render(rep)
    assert c["process_title"].startswith("VLLM::Worker"), c["process_title"]
    # One vocabulary everywhere: report.json's processes say what `ps --json` says, titles beside.
    by_pid = {p["pid"]: p for p in rep["processes"]}
    assert by_pid[c["pid"]]["label"] == "worker" and by_pid[c["pid"]]["title"] == c["process_title"]
    assert by_pid[decode.pid]["label"] == "api-server"
    if is_root():
        assert c["library"] == "libinvq_leak.so", c
        # Count-based, not a rate: the library queues 148 B per munmap of the worker into 148 KiB chunks
        # (1,024 entries each) that it never frees, so the chunks born during the hunt hold 148 B per
        # munmap the kernel saw in that process (within the one chunk partly filled at attach; munmaps
        # the kernel settled itself, not sent as events, widen that). A loaded machine may delay the
        # churn thread, which then catches up in a burst: that moves the slope, never this count.
        reader = SessionReader(out)
        ev = reader.table("bpf_events")
        munmaps = int(((ev["pid"] == c["pid"]) & (ev["type"] == "munmap")).sum())
        settled = int(reader.table("bpf_counters")["settled"].max())
        chunk = 148 * 1024
        # The churn thread's 8 KiB buffer is the same library's mmap (through UCX's hook, blamed on the hook's
        # caller): one may be in flight when the hunt stops, beside whole chunks.
        chunks = c["outstanding_bytes"] - c["outstanding_bytes"] % chunk
        assert chunks > 0 and c["outstanding_bytes"] - chunks <= 8192, c
        assert abs(chunks - 148 * munmaps) <= chunk + 148 * settled, (c, munmaps, settled)
        assert munmaps >= 10 * 1024, munmaps  # ≥ 10 chunks' worth: the one-chunk slack is ≤ 10% of it
        assert c["mb_per_min"] > 5, c  # a clear leak, whatever the pace
    else:
        assert 8 < c["mb_per_min"] < 40, c  # 2000 munmaps/s x 148 B = 17 MB/min (the watcher's slope)
    # Nothing comparable in prefill.
    assert not [x for x in rep["culprits"] if x.get("instance") == prefill.pid and x["mb_per_min"] > 5]


def test_ps_with_proxy_down_falls_back_to_metrics(pd) -> None:
    prefill, decode, proxy = pd
    proxy.stop()
    procs = _ps()
    assert procs[decode.pid]["role"] == "decode", procs[decode.pid]["role_source"]
    assert "/metrics" in procs[decode.pid]["role_source"]
    assert procs[prefill.pid]["role"] == "prefill", procs[prefill.pid]["role_source"]
