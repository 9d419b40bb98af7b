"""A real vLLM P/D pair (NixlConnector over UCX, loopback only) and a small proxy.

The decode instance is started with UCX_RCACHE_MAX_UNRELEASED=inf (vLLM leaves a value it finds; the
prefill instance gets vLLM's own 1024, set in-process) and with tests/targets/libinvq_leak.so preloaded:
on 2 CPU cores the decode worker does too few munmaps for UCX's queue to grow measurably, so the library
reproduces the seed-002 mechanism in that worker (issue 5d). The report must name the decode instance,
the worker and the library.
"""

from __future__ import annotations

import json

import pytest
from conftest import REPO, is_root, run_cli
from vllm_fixtures import Load, hunt_vllm, require_vllm, vllm_servers

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
LEAK_LIB = REPO / ".cache" / "libinvq_leak.so"


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


def test_hunt_vllm_pd_names_decode_leak(pd, tmp_path) -> None:
    prefill, decode, proxy = pd
    load = Load(proxy.url, pause=0.5)
    load.start()
    try:
        rep, err = hunt_vllm(tmp_path / "h", 40)
    finally:
        load.stop()
    roles = {i["instance"]: i["role"] for i in rep["instances"]}
    assert roles.get(prefill.pid) == "prefill" and roles.get(decode.pid) == "decode", rep["instances"]
    ld = rep["load"]
    assert ld["requests"] >= 1, ld
    assert ld["kv_transfers"] >= 1 or ld["kv_external_prompt_tokens"] > 0, ld
    per = {e["instance"]: e for e in ld["per_instance"]}
    assert per[decode.pid]["role"] == "decode" and per[decode.pid]["kv_external_prompt_tokens"] >= 0
    # 5d: the leak is named in the decode instance, in its worker, with the library.
    assert rep["verdict"] == "leak"
    worker = next(i for i in rep["instances"] if i["instance"] == decode.pid)
    worker_pids = [p["pid"] for p in worker["processes"] if p["label"] == "worker"]
    top = [c for c in rep["culprits"] if c["pid"] in worker_pids]
    assert top, rep["culprits"]
    c = top[0]
    assert c["instance"] == decode.pid and c["process_label"] == "worker"
    assert c["process_title"].startswith("VLLM::Worker"), c["process_title"]
    # One vocabulary everywhere: report.json's processes say what `ps --json` says, titles beside.
    by_pid = {p["pid"]: p for p in rep["processes"]}
    assert by_pid[c["pid"]]["label"] == "worker" and by_pid[c["pid"]]["title"] == c["process_title"]
    assert by_pid[decode.pid]["label"] == "api-server"
    assert 8 < c["mb_per_min"] < 40, c  # 2000 munmaps/s x 148 B = 17 MB/min
    if is_root():
        assert c["library"] == "libinvq_leak.so", c
    # Nothing comparable in prefill.
    assert not [x for x in rep["culprits"] if x.get("instance") == prefill.pid and x["mb_per_min"] > 5]


def test_ps_with_proxy_down_falls_back_to_metrics(pd) -> None:
    prefill, decode, proxy = pd
    proxy.stop()
    procs = _ps()
    assert procs[decode.pid]["role"] == "decode", procs[decode.pid]["role_source"]
    assert "/metrics" in procs[decode.pid]["role_source"]
    assert procs[prefill.pid]["role"] == "prefill", procs[prefill.pid]["role_source"]
