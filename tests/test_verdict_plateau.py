"""No false alarms on a plateau: growth that keeps slowing down — warm-up, malloc fragmentation,
arenas filling — is not a leak, while a steady leak, on its own or on top of a warm-up, stays a leak at its
own rate.

Units on synthetic series for the decision (analysis/growth.py ``growth_shape``), then two real hunts in
parallel (default probes, gdb included) on the fragmentation churner (tests/fixtures/frag_churn.c): alone,
and with a steady malloc leak on top.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import is_root, run_cli
from fixtures.build import build

from leaktrace.analysis.candidates import is_doubtful, is_leaking
from leaktrace.analysis.growth import MB, growth_shape, rate, shape_evidence
from leaktrace.analysis.growth_tables import process_rates

T = np.arange(0, 61, 1.0)  # a 60 s hunt, one watcher tick a second


def _noise(seed: int, mb: float = 0.3) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, mb * MB, len(T))


def _fragmentation_brief() -> np.ndarray:
    """A fragmenting churner's RSS: 150 MB, then +39, +31, +23, +19, +17, +15 MB per 10 s."""
    cum = np.concatenate([[0], np.cumsum([39, 31, 23, 19, 17, 15])])
    return (150 + np.interp(T, np.arange(0, 61, 10), cum)) * MB


# --------------------------------------------------------------------------- the decision, on numbers

@pytest.mark.parametrize("name,y", [
    ("issue's churner", _fragmentation_brief()),
    ("1/t slowdown (log growth)", (150 + 40 * np.log1p(T / 3)) * MB + _noise(1)),
    ("saturating exponential", (150 + 130 * (1 - np.exp(-T / 25))) * MB + _noise(2)),
])
def test_decelerating_growth_is_a_plateau_not_a_leak(name, y):
    r = rate(T, y)
    assert r.decelerating, (name, r.shape)
    assert r.steady_mb_per_min == 0.0  # no leak figure
    first, _, last = r.shape.thirds_per_s
    assert last < 0.6 * first
    assert r.shape.plateau is not None and r.shape.plateau >= y[-1]
    ev = shape_evidence(r)
    assert ev.startswith("growth decelerating: rate fell from ") and "projected plateau ~" in ev, ev


@pytest.mark.parametrize("tau", [0, 3, 5, 10])
def test_steady_leak_with_or_without_warm_up_keeps_its_rate(tau):
    """60 MB/min, alone or on top of a 40 MB warm-up settling with time constant tau: a leak at ~60 MB/min."""
    warm = 40 * (1 - np.exp(-T / tau)) if tau else 0.0
    y = (150 + T + warm) * MB + _noise(10 + tau)
    r = rate(T, y)
    assert not r.decelerating and not r.step, r.shape
    assert r.steady_mb_per_min == pytest.approx(60.0, rel=0.1), r.shape
    assert r.confidence > 0.9


@pytest.mark.parametrize("tau", [15, 20])
def test_slow_warm_up_on_a_leak_is_never_called_clean(tau):
    """A warm-up as slow as the hunt's thirds on top of a leak looks like a plateau forming (the limit of a
    one-minute window): then it reads inconclusive (still at the leak rate at the end), never no-leak."""
    y = (150 + T + 40 * (1 - np.exp(-T / tau))) * MB + _noise(10 + tau)
    row = process_rates(_rollup(y)).iloc[0]
    assert is_leaking(row) or is_doubtful(row), row.to_dict()
    if is_leaking(row):
        assert row["rss_mb_per_min"] == pytest.approx(60.0, rel=0.2)


@pytest.mark.parametrize("period", [8, 10, 12, 15, 20])
@pytest.mark.parametrize("phase", [0.0, 1 / 3, 2 / 3])
def test_leak_in_periodic_chunks_is_not_a_plateau(period, phase):
    """10 MB every ``period`` s (a pool grown chunk by chunk): some thirds may hold no jump, yet this is no
    slowing down: the first third's own slope is no clear growth, so no shape is read."""
    y = (150 + 10 * np.floor((T + phase * period) / period)) * MB + _noise(period, 0.05)
    r = rate(T, y)
    assert not r.decelerating, r.shape
    assert r.steady_mb_per_min > 10


def test_a_rate_drifting_down_is_no_warm_up():
    """A leak that follows traffic, its thirds at 8.7, 7.2 and 5.3 MB/min (as a vintage P/D worker's UCX queue
    can read): no warm-up to cut (the first third is not much steeper than the middle one), so the rate is
    the whole series' (~7 MB/min), not the last third's 5.3."""
    slopes = np.select([T < 20, T < 40], [8.7, 7.2], 5.3) / 60.0  # MB per second, per third
    y = (150 + np.concatenate([[0], np.cumsum(slopes[1:] * np.diff(T))])) * MB + _noise(7, 0.05)
    r = rate(T, y, warmup_s=0)
    assert r.shape is not None and r.shape.kind == "steady", r.shape
    assert r.steady_mb_per_min == pytest.approx(7.1, rel=0.1), r.shape


def test_growth_that_slows_with_the_traffic_is_a_leak_not_a_plateau():
    """A leak per request (400 KB each) under traffic that falls from 30 to 5 requests a minute grows ever
    slower, like a plateau forming. Given the server's requests on the same clock, the slowing is the
    traffic's: a leak at the whole window's rate, and the evidence says so. The same series under steady
    traffic (its growth per request falling) stays a plateau."""
    req_per_s = np.interp(T, [0, 60], [30, 5]) / 60.0
    done = np.concatenate([[0], np.cumsum(req_per_s[1:] * np.diff(T))])
    y = (150 + 0.4 * done) * MB + _noise(8, 0.02)
    assert rate(T, y, warmup_s=0).decelerating  # without the load: reads as a plateau forming
    r = rate(T, y, warmup_s=0, work=(T, done))
    assert r.shape.kind == "load-following" and not r.decelerating, r.shape
    assert r.steady_mb_per_min == pytest.approx(0.4 * done[-1] / 1.0, rel=0.25)  # ~ the mean rate
    ev = shape_evidence(r)
    per_request = re.search(r"\(per request: (\d+) then (\d+) KB\)", ev)
    assert ev.startswith("growth slowed with the traffic") and per_request, ev
    assert all(380 <= int(kb) <= 440 for kb in per_request.groups()), ev  # 0.4 MB = 410 KB each
    steady = np.cumsum(np.full(len(T), done[-1] / (len(T) - 1))) - done[-1] / (len(T) - 1)
    assert rate(T, y, warmup_s=0, work=(T, steady)).decelerating


def test_accelerating_growth_is_steady_not_a_plateau():
    r = rate(T, (150 + 0.02 * T ** 2) * MB)
    assert r.shape.kind == "steady" and r.steady_mb_per_min > 50


def test_step_is_neither_leak_nor_plateau():
    r = rate(T, (150 + 50 * (T > 30)) * MB + _noise(3, 0.02))
    assert r.step and r.steady_mb_per_min == 0.0 and not r.decelerating


def test_warm_up_then_flat_has_no_rate():
    r = rate(T, (150 + 60 * (1 - np.exp(-T / 6))) * MB + _noise(4, 0.1))
    assert r.steady_mb_per_min < 1.0, r.shape


def test_flat_noise_has_no_shape():
    sh = growth_shape(T, 150 * MB + _noise(5, 0.5))
    assert sh is None or sh.kind == "steady"


def test_too_short_to_tell():
    t = np.arange(0, 15, 1.0)
    assert growth_shape(t, (150 + 10 * np.log1p(t)) * MB) is None


def _rollup(y: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"pid": 1, "t": T, "rss": y, "anon": y - 100 * MB, "uss": y, "pss": y})


def test_verdict_rules_on_a_plateau():
    """Still growing at the leak rate at the end: doubtful (inconclusive), not leaking; already flat at the
    end: neither; a steady leak: leaking."""
    still = process_rates(_rollup(_fragmentation_brief())).iloc[0]
    assert still["rss_shape"] == "decelerating"
    assert not is_leaking(still) and is_doubtful(still)
    flat_end = process_rates(_rollup((150 + 130 * (1 - np.exp(-T / 6))) * MB + _noise(6, 0.05))).iloc[0]
    assert not is_leaking(flat_end) and not is_doubtful(flat_end)
    leak = process_rates(_rollup((150 + T + 40 * (1 - np.exp(-T / 5))) * MB)).iloc[0]
    assert is_leaking(leak)


# --------------------------------------------------------------------------- real hunts

CHURN = ["--threads", "4", "--live-mb", "128", "--max-kib", "1024"]
LEAK_MB_PER_MIN = 60.0


@pytest.fixture(scope="module")
def frag_bin() -> Path:
    return build("frag_churn", ["frag_churn.c"], ldflags=["-lpthread", "-lm"])


@pytest.mark.bpf
@pytest.mark.skipif(not is_root(), reason="BPF needs root")
def test_fragmentation_plateau_is_no_leak_and_a_leak_on_top_stays_a_leak(spawn, frag_bin, tmp_path):
    """Two 60 s hunts in parallel, default probes (eBPF, gdb, watcher): (a) 4 threads churning random-size
    blocks up to 1 MiB in a bounded 128 MB live set, paced so that the heaps' fragmentation growth spreads
    over the minute and slows down: not a leak, no culprit; (b) the same churn, faster (its warm-up done in
    ~20 s), with a steady 60 MB/min malloc leak on top: a leak at the asked rate (±15 %)."""
    plateau = spawn([frag_bin, *CHURN, "--ops-per-s", "20"])
    leaking = spawn([frag_bin, *CHURN, "--ops-per-s", "60", "--leak-mb-per-min", str(LEAK_MB_PER_MIN)])
    results: dict[str, object] = {}

    def hunt(name: str, pid: int) -> None:
        results[name] = run_cli("hunt", "--pid", pid, "--duration", 60, "--format", "json",
                                "--out", tmp_path / name, timeout=240)

    threads = [threading.Thread(target=hunt, args=a) for a in (("plateau", plateau.pid), ("leak", leaking.pid))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    reps = {}
    for name, r in results.items():
        assert r.returncode == 0, r.stderr  # type: ignore[attr-defined]
        reps[name] = json.loads((tmp_path / name / "report.json").read_text())

    rep = reps["plateau"]
    proc = next(p for p in rep["processes"] if p["pid"] == plateau.pid)
    assert proc["rss_last_mb"] - proc["rss_first_mb"] > 10, proc  # it did grow: the heaps fragmented
    assert rep["verdict"] != "leak", rep["verdict_reason"]
    assert rep["culprits"] == []
    if rep["verdict"] == "inconclusive":
        assert "growth decelerating: rate fell from" in rep["verdict_reason"], rep["verdict_reason"]

    rep = reps["leak"]
    assert rep["verdict"] == "leak", rep["verdict_reason"]
    top = rep["culprits"][0]
    assert (top["pid"], top["kind"]) == (leaking.pid, "malloc-heap"), top
    assert top["mb_per_min"] == pytest.approx(LEAK_MB_PER_MIN, rel=0.15), top
    # RSS grew too, but by the leak minus what the churn's heaps give back meanwhile (glibc trims them as the
    # fragmentation subsides): the rate of the heap mappings in the eBPF ledger is the leak's
    proc = next(p for p in rep["processes"] if p["pid"] == leaking.pid)
    assert proc["rss_last_mb"] - proc["rss_first_mb"] > 0.5 * LEAK_MB_PER_MIN, proc
