"""Discovery on real processes shaped like a vLLM tree (no vLLM needed) and its parsers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import LEAKTRACE, REPO, is_root, run_cli

from leaktrace.vllm import discover as disc
from leaktrace.vllm import labels

TARGETS = Path(__file__).resolve().parent / "targets"
KV = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}


def test_is_vllm_serve() -> None:
    assert labels.is_vllm_serve(["/v/bin/python3.11", "/v/bin/vllm", "serve", "m"])
    assert labels.is_vllm_serve(["vllm", "serve", "m", "--port", "8000"])
    assert labels.is_vllm_serve(["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"])
    assert not labels.is_vllm_serve(["python", "-m", "vllm.entrypoints.cli.main", "bench"])
    assert not labels.is_vllm_serve(["/usr/bin/vllm-helper", "serve"])


def test_serve_settings_and_proxy_ports() -> None:
    s = labels.serve_settings(["vllm", "serve", "/m", "--port=8200", "--kv-transfer-config", json.dumps(KV)])
    assert s["model"] == "/m" and s["port"] == 8200 and s["kv_transfer_config"]["kv_connector"] == "NixlConnector"
    assert labels.serve_settings(["vllm", "serve", "--model", "/x"])["port"] == 8000
    assert labels.proxy_ports(["p.py", "--prefiller-ports", "8100", "8101", "--decoder-ports", "8200"]) == {
        "prefill": [8100, 8101], "decode": [8200]}
    assert labels.proxy_ports(["p.py", "--prefiller-port=8100", "--decoder-port=8200"]) == {
        "prefill": [8100], "decode": [8200]}
    assert labels.proxy_ports(["p.py", "--port", "8000"]) is None


@pytest.mark.parametrize("title,label", [
    ("VLLM::EngineCore", "engine-core"), ("VLLM::EngineCore_DP1", "engine-core"),
    ("VLLM::Worker_TP1_PP0", "worker"), ("VLLM::DPCoordinator", "dp-coordinator"),
    ("VLLM::APIServer_2", "api-server"), ("MYPFX::Worker", "worker"),
])
def test_title_labels(title: str, label: str) -> None:
    assert disc._label({"argv": [title]})[0] == label


def test_lib_groups_hashed_names() -> None:
    from leaktrace.procfs import Mapping

    paths = ["/s/nixl_cu12.libs/libucp-b39b3ed9.so.0.0.0", "/s/nixl_cu12.libs/libucm-f6ca5dec.so.0.0.0",
             "/s/.nixl_cu12.mesonpy.libs/plugins/libplugin_UCX.so", "/s/.nixl_cu12.mesonpy.libs/libnixl.so",
             "/s/torch/lib/libtorch_cpu.so", "/s/nixl_cu12.libs/libabsl_base-5dc7d7dc.so.2508.0.0",
             "/usr/lib/libnccl.so.2", "/usr/lib/x86_64-linux-gnu/libc.so.6"]
    maps = [Mapping(i * 4096, i * 4096 + 4096, "r-xp", 0, "00:00", 1, p) for i, p in enumerate(paths)]
    g = disc.libs_of_interest(maps)
    assert g["ucx"] == ["libucp-b39b3ed9.so.0.0.0", "libucm-f6ca5dec.so.0.0.0"]
    assert g["nixl"] == ["libplugin_UCX.so", "libnixl.so"]
    assert g["torch"] == ["libtorch_cpu.so"] and g["nccl"] == ["libnccl.so.2"]
    assert "libabsl_base-5dc7d7dc.so.2508.0.0" not in sum(g.values(), [])


@pytest.fixture
def fake_tree(spawn, tmp_path):
    """A `vllm serve` look-alike with a retitled EngineCore and Worker, plus a P/D proxy naming its port."""
    exe = tmp_path / "vllm"
    shutil.copy(TARGETS / "fake_vllm.py", exe)
    api = spawn([sys.executable, exe, "serve", "/models/tiny", "--host", "127.0.0.1", "--port", "18123",
                 "--kv-transfer-config", json.dumps(KV)], env={"UCX_NET_DEVICES": "lo", "VLLM_API_KEY": "s3cret"})
    proxy = spawn([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(600)",
                   "--prefiller-ports", "18999", "--decoder-ports", "18123"])
    return api, proxy


def _tree_pids(api_pid: int) -> tuple[int, int]:
    from leaktrace import procfs

    kids = procfs.children_map()
    engine = kids[api_pid][0]
    worker = kids[engine][0]
    return engine, worker


def test_discover_fake_tree(fake_tree) -> None:
    api, proxy = fake_tree
    engine, worker = _tree_pids(api.pid)
    procs = {p["pid"]: p for p in disc.discover(with_metrics=False)}
    assert procs[api.pid]["label"] == "api-server"
    assert procs[engine]["label"] == "engine-core" and procs[engine]["title"] == "VLLM::EngineCore"
    assert procs[worker]["label"] == "worker" and procs[worker]["title"] == "VLLM::Worker_TP0"
    assert {procs[p]["instance"] for p in (api.pid, engine, worker)} == {api.pid}
    # The proxy names our port as a decoder.
    assert procs[proxy.pid]["label"] == "proxy"
    assert all(procs[p]["role"] == "decode" for p in (api.pid, engine, worker))
    assert "proxy pid" in procs[api.pid]["role_source"]
    assert procs[api.pid]["port"] == 18123 and procs[api.pid]["model"] == "/models/tiny"
    assert procs[api.pid]["config"]["kv_transfer_config"]["kv_connector"] == "NixlConnector"
    # Settings: the API server's live environment (set in-process, absent from /proc/PID/environ)…
    mp = procs[api.pid]["config"]["multiproc_method"]
    assert mp["value"] == "spawn" and "live environ" in mp["source"]
    # …and the retitled worker (empty environ) reads its settings from the untitled ancestor.
    env = procs[worker]["config"]["env"]
    assert env["UCX_NET_DEVICES"]["value"] == "lo"
    assert f"untitled ancestor {api.pid}" in env["UCX_NET_DEVICES"]["source"]
    # Secrets never leave: VLLM_API_KEY looks like a secret.
    assert procs[api.pid]["config"]["env"]["VLLM_API_KEY"]["value"] == "<redacted>"
    assert api.pid in disc.vllm_targets()
    inst = [i for i in disc.instances(list(procs.values())) if i["instance"] == api.pid][0]
    assert sorted(inst["pids"]) == sorted([api.pid, engine, worker]) and inst["role"] == "decode"


def test_the_vllm_probe_looks_again_only_when_something_can_have_changed(fake_tree, spawn, tmp_path,
                                                                          monkeypatch) -> None:
    """A look reads every process's maps and environment: on a tick when no process was born and every
    instance's role is known it is skipped; a process born since is labelled at the next look."""
    from leaktrace.probes import HuntContext, HuntOptions, TargetSet
    from leaktrace.probes import vllm as vllm_probe
    from leaktrace.session import SessionWriter

    api, _proxy = fake_tree
    engine, worker = _tree_pids(api.pid)
    looks: list[int] = []
    real = vllm_probe.discover
    monkeypatch.setattr(vllm_probe, "discover", lambda *a, **k: looks.append(1) or real(*a, **k))
    targets = TargetSet(roots=[api.pid], pids={p: 0 for p in (api.pid, engine, worker)})
    ctx = HuntContext(session=SessionWriter(tmp_path / "s"), targets=targets, options=HuntOptions(vllm=True),
                      log=lambda line: None)
    probe = vllm_probe.VllmProbe(ctx.options, rediscover_every=1)
    try:
        probe.start(ctx)
        assert len(looks) == 1 and [i["role"] for i in probe.instances] == ["decode"]  # the proxy names it
        probe.tick(1.0)
        assert len(looks) == 1  # nothing new
        born = spawn([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"])
        with targets.lock:
            targets.roots.append(born.pid)
            targets.pids[born.pid] = os.getpid()
        probe.tick(2.0)
        assert len(looks) == 2 and born.pid in targets.labels
        probe.tick(3.0)
        probe.stop()
        assert len(looks) == 2
    finally:
        ctx.session.close()


def test_ps_cli_json_and_text(fake_tree) -> None:
    api, proxy = fake_tree
    r = run_cli("ps", "--json", "--no-metrics")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    keys = {"pid", "ppid", "label", "instance", "role", "port", "libs", "config"}
    assert rows and all(keys <= set(row) for row in rows)
    # The fake tree and its proxy, row by row: the labels, roles and instance the fixture set up.
    engine, worker = _tree_pids(api.pid)
    by_pid = {row["pid"]: row for row in rows}
    want = {api.pid: ("api-server", "decode", api.pid), engine: ("engine-core", "decode", api.pid),
            worker: ("worker", "decode", api.pid), proxy.pid: ("proxy", "unknown", None)}
    got = {pid: (by_pid[pid]["label"], by_pid[pid]["role"], by_pid[pid]["instance"]) for pid in want if pid in by_pid}
    assert got == want, got
    assert by_pid[api.pid]["port"] == 18123 and by_pid[api.pid]["ppid"] == os.getpid()
    text = run_cli("ps", "--no-metrics")
    assert text.returncode == 0 and f"vLLM instance {api.pid}" in text.stdout and "VLLM::Worker_TP0" in text.stdout


def test_role_without_proxy_is_unknown_when_metrics_down(spawn, tmp_path) -> None:
    """kv-transfer-config but no proxy and /metrics unreachable: role unknown, and the reason says so."""
    exe = tmp_path / "vllm"
    shutil.copy(TARGETS / "fake_vllm.py", exe)
    api = spawn([sys.executable, exe, "serve", "/m", "--host", "127.0.0.1", "--port", "18124",
                 "--kv-transfer-config", json.dumps(KV)])
    p = {x["pid"]: x for x in disc.discover([api.pid], with_metrics=True)}[api.pid]
    assert p["role"] == "unknown" and "unreachable" in p["role_source"]


def test_hunt_vllm_without_vllm_says_so(tmp_path) -> None:
    """Run in a fresh PID namespace (root), where no vLLM server can be, so the answer does not depend on
    what else runs on this host (another test's vLLM, a developer's server)."""
    if is_root():
        r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--", *LEAKTRACE, "hunt", "--vllm",
                            "--duration", "2", "--out", str(tmp_path / "h")],
                           capture_output=True, text=True, timeout=120, cwd=str(REPO))
    else:
        if disc.vllm_targets():
            pytest.skip("a vLLM server is running on this host (run as root to test in a PID namespace)")
        r = run_cli("hunt", "--vllm", "--duration", "2", "--out", tmp_path / "h")
    assert r.returncode == 2
    assert "no vLLM server found" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_role_from_metrics_when_no_proxy(spawn, tmp_path) -> None:
    """No proxy: a kv-transfer-config server whose /metrics shows KV received from remote is decode."""
    import http.server
    import threading

    text = (Path(__file__).resolve().parent / "data" / "vllm_metrics_decode.txt").read_bytes()

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        port = srv.server_address[1]
        exe = tmp_path / "vllm"
        shutil.copy(TARGETS / "fake_vllm.py", exe)
        api = spawn([sys.executable, exe, "serve", "/m", "--host", "127.0.0.1", "--port", str(port),
                     "--kv-transfer-config", json.dumps(KV)])
        p = {x["pid"]: x for x in disc.discover([api.pid], with_metrics=True)}[api.pid]
        assert p["role"] == "decode" and "KV transfer" in p["role_source"]
    finally:
        srv.shutdown()


def test_instance_members_as_discover_gives_them(fake_tree) -> None:
    """The watch's look at the vLLM instances (command lines only) agrees with the full discovery on each
    process's label, role and instance."""
    api, _proxy = fake_tree
    engine, worker = _tree_pids(api.pid)
    members = disc.instance_members()
    full = {p["pid"]: (p["label"], p["role"], p["instance"]) for p in disc.discover(with_metrics=False, ucx_state=False)
            if p.get("instance") is not None}
    assert members == full
    assert {members[p] for p in (api.pid, engine, worker)} == {("api-server", "decode", api.pid),
                                                              ("engine-core", "decode", api.pid),
                                                              ("worker", "decode", api.pid)}


def test_watch_vllm_follows_the_instance_with_its_labels(fake_tree, tmp_path) -> None:
    """`watch --vllm` follows each instance's tree, every process with its label, role and instance."""
    api, _proxy = fake_tree
    engine, worker = _tree_pids(api.pid)
    out = tmp_path / "w"
    r = run_cli("watch", "--vllm", "--duration", "4", "--interval", "1", "--no-bpf", "--out", out)
    assert r.returncode == 0, r.stderr
    targets = {t["pid"]: t for t in json.loads((out / "watch.json").read_text())["targets"]}
    got = {pid: (targets[pid]["label"], targets[pid]["role"], targets[pid]["instance"])
           for pid in (api.pid, engine, worker) if pid in targets}
    assert got == {api.pid: ("api-server", "decode", str(api.pid)), engine: ("engine-core", "decode", str(api.pid)),
                   worker: ("worker", "decode", str(api.pid))}, (got, r.stderr[-2000:])
