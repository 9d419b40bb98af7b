"""Real NIXL 1.5.1 agents (UCX 1.23 inside the nixl-cu12 wheel) in two processes, DRAM transfers over
loopback: discovery finds the hashed UCX/NIXL libraries, the active memory hooks and the settings,
including one set in-process (invisible in /proc/PID/environ)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import REPO, run_cli

from leaktrace import procfs
from leaktrace.vllm import discover, ucx

NIXL_DIR = REPO / ".cache" / "nixl-1.5.1"
# Loopback only: UCX would otherwise also use eth0. '^ib*,rdmacm' avoids a segfault at exit when
# Debian's libibverbs is present.
NIXL_ENV = {"UCX_NET_DEVICES": "lo", "UCX_MODULES": "^ib*,rdmacm", "PYTHONPATH": str(NIXL_DIR)}
HASHED = re.compile(r"^libuc[pmst]-[0-9a-f]{8}\.so")


@pytest.fixture(scope="module")
def nixl_ready() -> None:
    if not (NIXL_DIR / ".complete").exists():
        r = subprocess.run(["bash", str(REPO / "tests/targets/setup_ucx.sh")], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"nixl 1.5.1 not installable here: {r.stderr.strip()[-300:]}")


def _start(spawn, *extra: str):
    p = spawn([sys.executable, REPO / "tests/targets/nixl_pair.py", "--rate", "10", *extra], env=NIXL_ENV)
    return p


def _pids(p) -> tuple[int, int]:
    kids = procfs.children_map().get(p.pid, [])
    assert kids, "initiator not started"
    return p.pid, kids[0]


@pytest.mark.nixl
def test_nixl_pair_discovered(spawn, nixl_ready) -> None:
    p = _start(spawn)
    target, initiator = _pids(p)
    found = {x["pid"]: x for x in discover.discover(with_metrics=False)}
    for pid in (target, initiator):
        assert pid in found, f"pid {pid} not listed by discover()"
        row = found[pid]
        assert {"ucx", "nixl"} <= set(row["lib_groups"]), row["lib_groups"]
        assert sum(1 for n in row["libs"] if HASHED.match(n)) >= 3, row["libs"]
        assert "libplugin_UCX.so" in row["libs"]
        u = row["config"]["ucx"]
        assert u["hooks_active"] is True and u["ucx_version"] == "1.23.0"
        assert u["hook_mode"] == "bistro" and u["rcache_max_unreleased"] == "inf"
        assert any(HASHED.match(v) and "libucm" in v for v in u["hooked_functions"].values())
        assert row["config"]["env"]["UCX_NET_DEVICES"]["value"] == "lo"
    # The transfers go on after we looked (nothing was stopped).
    assert p.popen.poll() is None


@pytest.mark.nixl
def test_nixl_inprocess_setting_is_seen(spawn, nixl_ready) -> None:
    """As vLLM's nixl_utils does, the target sets UCX_RCACHE_MAX_UNRELEASED in os.environ before importing
    nixl: /proc/PID/environ does not show it; the live environment does, and says so."""
    p = _start(spawn, "--inprocess-env", "UCX_RCACHE_MAX_UNRELEASED=1024")
    target, initiator = _pids(p)
    assert "UCX_RCACHE_MAX_UNRELEASED" not in procfs.read_environ(target, redact=False)
    t = ucx.read_ucx_config(target)
    assert t.rcache_max_unreleased == "1024" and t.sources["UCX_RCACHE_MAX_UNRELEASED"] == ucx.SRC_LIVE_ENV
    assert not t.leak_prone
    i = ucx.read_ucx_config(initiator)  # launched with the launch environment: UCX's default
    assert i.rcache_max_unreleased == "inf" and i.leak_prone


@pytest.mark.nixl
def test_ps_cli_lists_nixl(spawn, nixl_ready) -> None:
    p = _start(spawn)
    target, initiator = _pids(p)
    r = run_cli("ps", "--json", "--no-metrics")
    assert r.returncode == 0, r.stderr
    rows = {x["pid"]: x for x in json.loads(r.stdout)}
    assert rows[target]["label"] == "other" and rows[target]["role"] == "unknown"
    assert "ucx" in rows[initiator]["lib_groups"]
    text = run_cli("ps", "--no-metrics").stdout
    assert f"{target}" in text and "ucx hooks=on mode=bistro max_unreleased=inf" in text
