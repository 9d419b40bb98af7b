"""The remedy on the real seed-002 leak (extended suite: two real vLLM P/D pairs one after the other, ~10 min on
2 cores; `make test-extended`). The CI suite hunts the leaking pair once (tests/test_vllm_pd.py); this module
hunts it beside its control and compares them, as a user checks a remedy.

One pair per setting: the leak (UCX_RCACHE_MAX_UNRELEASED=inf pinned in the servers' environment; vLLM 0.32
would otherwise set 1024 itself) and the control (=1024, the fix). Each pair runs in a private network
namespace (tests/targets/vintage_pd.py); ``leaktrace hunt --vllm`` runs in the same namespace (it scrapes
/metrics on 127.0.0.1) with no tuning flags. Both session directories are kept in ``vintage_sessions`` for
``leaktrace compare BEFORE AFTER``.

The leak follows traffic (~500 KB a request), so its rate is checked against the worker's /proc growth over
the window the hunt rated the worker's ledger over, with what else grows in the worker set aside (the named
other culprits, or the control worker's own growth under the same load). The control's worker may grow by
itself (oneDNN's primitive cache, bounded by ONEDNN_PRIMITIVE_CACHE_CAPACITY in vintage_pd.py): ``compare``
then still says fixed, since it judges the change by the culprits whose remedy setting changed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, run_cli

from leaktrace.session import SessionReader

sys.path.insert(0, str(REPO / "tests" / "targets"))

import vintage_pd  # noqa: E402

# The module fixture (two pairs, two hunts) runs inside the first test's time: ~10 min, more under load.
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.extended, pytest.mark.timeout(1800)]

HUNT_S = int(os.environ.get("LEAKTRACE_VINTAGE_HUNT_S", "90"))
WARMUP_S = 60
# The 60 s naming bound holds at the traffic it was calibrated at (13-17 requests a minute at the prefill):
# the leak is per request, so a box that starves the pair delays it. Under half that traffic the bound is not
# held and the leak must still be named within the hunt.
NAMING_REQUESTS_PER_MIN = 6.5
CHUNK = 151552  # one mpool chunk of UCX's rcache invalidation queue (148 KiB), mapped by ucm's raw mmap
UCX_LIB = re.compile(r"(?:^|/)libuc[ms](?:-[0-9a-f]{8})?\.so")


class RssSampler(threading.Thread):
    """VmRSS of some processes once a second, from /proc (independent of leaktrace)."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.samples: dict[int, list[tuple[float, int]]] = {p: [] for p in pids}
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            now = time.monotonic()
            for p in self.pids:
                try:
                    self.samples[p].append((now, vintage_pd.rss_kb(p) * 1024))
                except OSError:
                    pass
            self.stop_event.wait(1.0)

    def mb_per_min(self, pid: int, t0: float, t1: float) -> float:
        pts = [(t, b) for t, b in self.samples[pid] if t0 <= t <= t1]
        if len(pts) < 3:
            return float("nan")
        t, b = np.array(pts, dtype=float).T
        return float(np.polyfit(t, b, 1)[0]) * 60 / 2**20  # MiB, as report.json's "MB"

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)


@dataclass
class VintageRun:
    setting: str  # UCX_RCACHE_MAX_UNRELEASED given to both servers
    out: Path  # the hunt's session directory (report.json inside)
    prefill: int
    decode: int
    workers: dict[str, int]  # role -> VLLM::Worker pid
    hunt_s: float
    proc_mb_per_min: dict[int, float] = field(default_factory=dict)  # worker pid -> /proc RSS slope in the hunt
    requests: int = 0
    failed: int = 0
    stderr: str = ""
    wall_s: float = 0.0  # the hunt command, start to exit
    sampler: RssSampler | None = None  # the test's own /proc samples, from the hunt's start to its exit

    @property
    def report(self) -> dict:
        return json.loads((self.out / "report.json").read_text())

    def proc_rate(self, pid: int, t_from: float, t_to: float) -> float:
        """The worker's /proc RSS slope (MiB/min) between two times of the hunt's clock (seconds since its
        start: the session's t0_monotonic, the same CLOCK_MONOTONIC as the test's)."""
        t0 = float(SessionReader(self.out).meta["t0_monotonic"])
        return self.sampler.mb_per_min(pid, t0 + t_from, t0 + t_to)

    def ledger_window(self, pid: int) -> tuple[float, float]:
        """The window the hunt read a pid's ledger rates over: from its first ledger snapshot to its last
        (analysis.ledger.native_culprits rates the whole series, no warm-up cut)."""
        snaps = SessionReader(self.out).table("ledger_snapshots")
        t = snaps.loc[snaps["pid"] == pid, "t"]
        return float(t.min()), float(t.max())


def _hunt(setting: str, out: Path) -> VintageRun:
    pair = vintage_pd.start(setting)
    try:
        workers = {"prefill": vintage_pd.workers(pair.prefill.pid), "decode": vintage_pd.workers(pair.decode.pid)}
        assert all(len(w) == 1 for w in workers.values()), workers
        wpids = {role: w[0] for role, w in workers.items()}
        load = vintage_pd.Load(pair.ns, pair.proxy.url)
        load.start()
        # Warm-up: the NIXL handshake, the first transfers and WARMUP_S of load before the hunt (the
        # workers' own warm-up: oneDNN's primitive cache fills with the batch shapes 4 clients make).
        started = time.monotonic()
        deadline = started + 240
        while (load.ok < 4 or time.monotonic() - started < WARMUP_S) and time.monotonic() < deadline:
            time.sleep(1)
        assert load.ok >= 1, f"no completion through the vintage proxy:\n{pair.decode.tail()}"
        sampler = RssSampler(list(wpids.values()))
        sampler.start()
        ok0 = load.ok
        t0 = time.monotonic()
        err_path = out.parent / f"{out.name}.stderr"
        with open(err_path, "w") as err:
            hunt = subprocess.Popen([*pair.ns.enter(), sys.executable, "-m", "leaktrace", "hunt", "--vllm",
                                     "--duration", str(HUNT_S), "--out", str(out)],
                                    stdout=subprocess.DEVNULL, stderr=err, text=True, cwd=str(REPO))
        try:
            # The /proc sampler runs through the hunt's traced window: from its "attached" line to HUNT_S later.
            # The load runs until the hunt has exited, as a deployment's would: the hunt's last snapshots (its
            # final tick and the one at its stop, 20-40 s after the window on 2 saturated cores) then see the
            # leak go on.
            window_end = None
            deadline = t0 + HUNT_S + 400
            while hunt.poll() is None and time.monotonic() < deadline:
                if window_end is None and "] attached " in err_path.read_text():
                    window_end = time.monotonic() + HUNT_S
                if window_end is not None and time.monotonic() >= window_end:
                    break
                time.sleep(0.5)
            # The sampler goes on until the hunt exits: the hunt's series run to its stop, and its rates are
            # compared with /proc over their own window (``VintageRun.proc_rate``).
            hunt.wait(timeout=max(1.0, deadline - time.monotonic()))
            sampler.stop()
        finally:
            load.stop()
            if hunt.poll() is None:
                hunt.kill()
                hunt.wait()
        stderr = err_path.read_text()
        assert hunt.returncode == 0, stderr[-3000:]
        run = VintageRun(setting, out, pair.prefill.pid, pair.decode.pid, wpids, HUNT_S,
                         requests=load.ok - ok0, failed=load.failed, stderr=stderr, wall_s=time.monotonic() - t0,
                         sampler=sampler)
        # Each worker's /proc growth over the window the hunt rated its ledger over (attach to stop).
        for p in wpids.values():
            run.proc_mb_per_min[p] = run.proc_rate(p, *run.ledger_window(p))
        return run
    finally:
        pair.stop()


@pytest.fixture(scope="module")
def vintage_sessions(tmp_path_factory) -> dict[str, VintageRun]:
    """Both hunts, leak first: {"leak": ..., "fixed": ...}. The two session directories are what
    ``leaktrace compare BEFORE AFTER`` takes (before: leak, after: fixed)."""
    why = vintage_pd.available()
    if why:
        pytest.skip(f"vintage P/D target missing: {why}")
    root = tmp_path_factory.mktemp("vintage")
    runs = {}
    for name, setting in (("leak", vintage_pd.LEAK), ("fixed", vintage_pd.FIXED)):
        runs[name] = _hunt(setting, root / name)
        r = runs[name]
        print(f"vintage {name}: hunt {r.wall_s:.0f}s requests={r.requests} failed={r.failed} workers={r.workers} "
              f"/proc MB/min={r.proc_mb_per_min}", file=sys.stderr)
    return runs


def _ucm_chunks(run: VintageRun) -> dict[str, int]:
    """Per worker role: 148 KiB regions mapped through libucm during the hunt and still held at its end."""
    reg = SessionReader(run.out).table("ledger_regions")
    out = {}
    for role, pid in run.workers.items():
        mine = reg[(reg["pid"] == pid) & reg["library"].fillna("").str.contains(UCX_LIB)
                   & ~reg["preexisting"].astype(bool) & (reg["size"] == CHUNK)]
        out[role] = len(mine)
    return out


def test_vintage_ledger_sees_rcache_chunks(vintage_sessions) -> None:
    """The mechanism, whatever the rate: with the queue unbounded a worker ends the hunt holding many of
    UCX's 148 KiB chunks mapped during it (one per ~1,000 munmaps); with UCX_RCACHE_MAX_UNRELEASED=1024
    the queue is drained and its chunks are reused: a few at most."""
    leak, fixed = _ucm_chunks(vintage_sessions["leak"]), _ucm_chunks(vintage_sessions["fixed"])
    print(f"148 KiB libucm chunks held at the end: leak {leak}, fixed {fixed}", file=sys.stderr)
    # With 1024 the queue is drained when NIXL next uses the rcache: at ~800 munmaps/s a backlog of a few
    # chunks can be held at any moment (0-8 seen), against 70-170 held with the queue unbounded.
    assert max(leak.values()) >= 8, (leak, fixed)
    assert max(leak.values()) >= 10 * max(1, *fixed.values()), (leak, fixed)


def _ucx_culprits(rep: dict, run: VintageRun) -> list[dict]:
    mine = set(run.workers.values())
    return [c for c in rep["culprits"] if c["pid"] in mine and UCX_LIB.search(c.get("library") or "")]


def test_vintage_leak_named(vintage_sessions) -> None:
    run = vintage_sessions["leak"]
    rep = run.report
    assert run.requests > 0, run
    assert rep["verdict"] == "leak", (rep["verdict"], rep["culprits"])
    found = _ucx_culprits(rep, run)
    assert found, ([(c["pid"], c.get("library"), c["mb_per_min"]) for c in rep["culprits"]], run.workers)
    c = found[0]
    role = next(r for r, p in run.workers.items() if p == c["pid"])
    assert c["process_title"].startswith("VLLM::Worker"), c["process_title"]
    assert c["instance"] == (run.prefill if role == "prefill" else run.decode), c
    inst = next(i for i in rep["instances"] if i["instance"] == c["instance"])
    assert inst["role"] == role, inst
    # The call path: the pool of the rcache's invalidation queue (libucs's ucs_mpool_grow), grown through UCM's
    # raw mmap (ucm_orig_mmap_syscall), from the scanned stack window.
    assert any(re.search(r"ucm_orig_mmap_syscall", f) for f in c["stack"]), c["stack"]
    assert any(re.search(r"libucs.*ucs_mpool_grow", f) for f in c["stack"]), c["stack"]
    # The rate agrees with the worker's growth from /proc (sampled by the test over the window the hunt rated
    # the worker's ledger over) within 25% of it, once what else grows there is set aside: the worker also
    # grows by itself beside UCX's queue (oneDNN's JIT code and primitive cache in _C.abi3.so, its malloc heap,
    # Python), named as culprits of their own or not named at all; the control's worker of the same role,
    # under the same load with UCX's queue bounded, shows how much. So UCX's share of /proc lies between /proc
    # less the larger of those two and /proc itself.
    proc = run.proc_mb_per_min[c["pid"]]
    control = vintage_sessions["fixed"]
    own = control.proc_mb_per_min.get(control.workers.get(role, -1), float("nan"))
    own = 0.0 if np.isnan(own) else max(0.0, own)
    ucx = sum(x["mb_per_min"] for x in found if x["pid"] == c["pid"])
    others = [(x.get("library"), x["mb_per_min"]) for x in rep["culprits"] if x["pid"] == c["pid"] and x not in found]
    print(f"vintage leak rate: UCX {ucx:.2f} MB/min, worker /proc {proc:.2f}, others named there {others}, "
          f"the control's {role} worker {own:.2f}", file=sys.stderr)
    low, high = max(0.0, proc - max(sum(r for _, r in others), own)), proc
    assert low - 0.25 * proc <= ucx <= high + 0.25 * proc, (ucx, proc, others, own, found)
    # The remedy names the setting with the value read from the live process (vLLM retitles its
    # processes, so /proc/PID/environ is empty: the value comes from libc's environ in memory).
    assert "UCX_RCACHE_MAX_UNRELEASED=inf" in c["remedy"], c["remedy"]
    assert "live environ" in c["remedy"], c["remedy"]
    assert c["first_named_s"] is not None
    # The 60 s bound holds at the traffic it was measured at; under half of it the box starved the pair (a
    # failed precondition, said in a warning): then the leak must still be named within the hunt.
    pf = next((e for e in (rep.get("load") or {}).get("per_instance", []) if e.get("role") == "prefill"), {})
    per_min = 60 * pf.get("requests", 0) / pf["span_s"] if pf.get("span_s") else float("inf")
    if per_min >= NAMING_REQUESTS_PER_MIN:
        assert c["first_named_s"] <= 60, (c["first_named_s"], per_min)
    else:
        warnings.warn(f"the pair answered {per_min:.1f} requests a minute at the prefill during the hunt (under "
                      f"{NAMING_REQUESTS_PER_MIN}): first_named_s {c['first_named_s']} not held to 60 s", stacklevel=1)
        assert c["first_named_s"] <= rep["duration_s"], (c["first_named_s"], per_min)


def test_vintage_control_no_ucx_culprit(vintage_sessions) -> None:
    run = vintage_sessions["fixed"]
    rep = run.report
    assert run.requests > 0, run
    assert not _ucx_culprits(rep, run), rep["culprits"]
    # ... and no other growth of the control gets UCX's remedy (a stale libucs word in a scanned stack must not lend it)
    assert not [c for c in rep["culprits"] if c.get("rule") == "ucx-rcache"], rep["culprits"]


def test_vintage_compare_before_after_remedy(vintage_sessions, tmp_path) -> None:
    """``leaktrace compare`` on the pair before and after the remedy (UCX_RCACHE_MAX_UNRELEASED=1024):
    fixed, the UCX culprit gone; the other way round (the remedy undone): regressed, the UCX culprit new."""
    leak, fixed = vintage_sessions["leak"].out, vintage_sessions["fixed"].out
    for before, after, verdict, status in ((leak, fixed, "fixed", "gone"), (fixed, leak, "regressed", "new")):
        out = tmp_path / verdict
        r = run_cli("compare", before, after, "--out", out)
        assert r.returncode == 0, r.stderr
        cmp = json.loads((out / "compare.json").read_text())
        ucx = [c for c in cmp["culprits"] if UCX_LIB.search(c["library"] or "")]
        print(f"compare {before.name} -> {after.name}: {cmp['verdict']} ({cmp['verdict_reason']}), "
              f"confidence {cmp['confidence']}, UCX rows {ucx}", file=sys.stderr)
        assert cmp["verdict"] == verdict, cmp["verdict_reason"]
        assert ucx and all(c["status"] == status for c in ucx), cmp["culprits"]
        if verdict == "fixed":  # the change read from the live workers: the setting the UCX remedy names
            assert any(c["remedy_applied"] == {"UCX_RCACHE_MAX_UNRELEASED": {"before": "inf", "after": "1024"}}
                       for c in ucx), ucx
        assert all(c["library"] == "libucm.so" or c["library"] == "libucs.so" for c in ucx), ucx
        assert f"**{verdict}**" in (out / "compare.md").read_text()
        assert f'class="verdict {verdict}"' in (out / "compare.html").read_text()
