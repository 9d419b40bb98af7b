"""`leaktrace watch` on real processes: one watch over a clean churner, a grower that exits and a leak that
starts later picks the new process up, turns only the leak into a deep-hunt incident whose report names the
library, leaves an exit incident for the grower, serves the metrics (outstanding bytes by library included)
and stops on SIGTERM with exit 0. Also: bad inputs, the disk bound, the rolling history's bound, and the
shipped Prometheus rules / Grafana dashboard checked against what the exporter serves."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import LEAKTRACE, REPO, is_root, run_cli, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from build import build

RULES = REPO / "docs" / "prometheus" / "leaktrace-alerts.yml"
DASHBOARD = REPO / "docs" / "grafana" / "leaktrace-dashboard.json"
LEAK_KIB_S = 2048  # 120 MB/min
LIB = "libwatchleak.so"


@pytest.fixture(scope="module")
def target_bin() -> Path:
    lib = build(LIB, ["watch_lib.c"], cflags=["-fomit-frame-pointer"], shared=True, strip=True)
    return build("watch_target", ["watch_target.c"],
                 ldflags=[f"-L{lib.parent}", "-lwatchleak", f"-Wl,-rpath,{lib.parent}"])


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def _samples(text: str) -> list:
    from prometheus_client.parser import text_string_to_metric_families

    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def _state(out: Path) -> dict:
    try:
        return json.loads((out / "watch.json").read_text())
    except (OSError, ValueError):
        return {}


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bleaktrace_[a-z_]+\b", expr))


@pytest.mark.skipif(not is_root(), reason="deep hunts need root (eBPF, ptrace)")
def test_watch_end_to_end(tmp_path, spawn, target_bin):
    tag = f"wt{os.getpid()}x{time.monotonic_ns() % 100000}"
    churner = spawn([target_bin, tag, "--churn-kib-per-s", "4096"])
    out = tmp_path / "w"
    watch = subprocess.Popen(
        [*LEAKTRACE, "watch", "--match", f"watch_target {tag}", "--interval", "1", "--confirm-s", "10",
         "--deep-hunt-s", "15", "--duration", "110", "--out", str(out), "--prometheus-port", "0",
         "--format", "json,md", "--no-gdb"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO))
    try:
        # The watch is live (its eBPF program compiled, the churner followed) before the grower starts: its
        # 16 s of life must fall inside the watch, however long the compile takes.
        assert wait_for(lambda: len(_state(out).get("targets", [])) >= 1, timeout=90), _state(out)
        # Grows, then exits with status 3 (an unreaped zombie until the test reaps it: /proc tells the status).
        grower = spawn([target_bin, tag, "--leak-kib-per-s", str(LEAK_KIB_S), "--exit-after", "16",
                        "--exit-code", "3"])
        assert wait_for(lambda: len(_state(out).get("targets", [])) >= 2, timeout=30), _state(out)
        # The leak starts after the watch: picked up at a later tick.
        leaker = spawn([target_bin, tag, "--leak-kib-per-s", str(LEAK_KIB_S)])
        port = _state(out)["prometheus"]["port"]
        try:
            socket.create_connection(("127.0.0.2", port), timeout=2).close()
            raise AssertionError("metrics reachable beyond 127.0.0.1")
        except ConnectionRefusedError:
            pass

        suspects: list[dict] = []  # what watch.json names for the leaker while it is confirmed

        def hunted() -> bool:
            st = _state(out)
            suspects.extend(t["suspect"] for t in st.get("targets", []) if t["pid"] == leaker.pid and t.get("suspect"))
            return any(i["kind"] == "leak" and i["pid"] == leaker.pid and i["status"] != "running"
                       for i in st.get("incidents", []))

        assert wait_for(hunted, timeout=90, step=0.5), _state(out)
        assert suspects and suspects[-1]["library"] == LIB and suspects[-1]["kind"] == "native-mmap", suspects
        assert abs(suspects[-1]["mb_per_min"] - LEAK_KIB_S * 60 / 1024) < 0.3 * LEAK_KIB_S * 60 / 1024, suspects
        text = _scrape(port)
        samples = _samples(text)
        served = {s.name for s in samples}
        by = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples}
        outstanding = [s for s in samples if s.name == "leaktrace_outstanding_bytes"
                       and s.labels["library"] == LIB and s.labels["pid"] == str(leaker.pid)]
        assert outstanding and outstanding[0].value > 4 << 20, text
        # beside it, what of it is resident (pagemap): the library writes every page it maps
        resident = [s.value for s in samples if s.name == "leaktrace_outstanding_resident_bytes"
                    and s.labels == outstanding[0].labels]
        assert resident and 0.9 * outstanding[0].value <= resident[0] <= outstanding[0].value, (resident, text)
        rss = [s for s in samples if s.name == "leaktrace_process_rss_bytes" and s.labels["pid"] == str(churner.pid)]
        assert rss and set(rss[0].labels) == {"pid", "label", "role", "instance"}
        assert by[("leaktrace_incidents_total", ())] >= 2
        assert by[("leaktrace_watch_cpu_seconds_total", ())] > 0
        # The eBPF ledger's own counters: the leaker's maps were handed over, none lost at this rate.
        assert by[("leaktrace_ledger_events_total", ())] > 0 and by[("leaktrace_ledger_lost_events_total", ())] == 0
        growth = [s.value for s in samples if s.name == "leaktrace_process_growth_bytes_per_second"
                  and s.labels["pid"] == str(leaker.pid)]
        assert growth and abs(growth[0] - LEAK_KIB_S * 1024) < 0.3 * LEAK_KIB_S * 1024, growth
        # The shipped dashboard and alert rules name only metrics this exporter serves.
        dash = json.loads(DASHBOARD.read_text())
        exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
        exprs += [a["expr"] for a in dash["annotations"]["list"]]
        exprs += [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
        named = set().union(*map(_metric_names, exprs))
        assert named and named <= served, named - served
        # The exit incident's session and reports were written by a child: the daemon, which has judged and
        # traced growing processes by now, maps neither pandas nor pyarrow (~70 MB they would keep resident).
        held = [ln.split()[-1] for ln in Path(f"/proc/{watch.pid}/maps").read_text().splitlines()
                if re.search(r"/(pandas|pyarrow)/", ln)]
        assert not held, sorted(set(held))[:5]
        watch.send_signal(signal.SIGTERM)
        stdout, stderr = watch.communicate(timeout=90)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.communicate()
    assert watch.returncode == 0, stderr
    assert "watch stopped: SIGTERM" in stdout, stdout
    state = _state(out)
    assert state["running"] is False and state["stop_reason"] == "SIGTERM"
    incidents = state["incidents"]
    # Only the leak and the grower that ended: never the churner.
    assert {i["pid"] for i in incidents} <= {leaker.pid, grower.pid}, incidents
    deep = [i for i in incidents if i["kind"] == "leak" and i["pid"] == leaker.pid]
    assert len(deep) == 1 and deep[0]["status"] == "done", deep
    path = Path(deep[0]["path"])
    assert path.parent == out / "incidents" and re.fullmatch(rf"\d{{8}}T\d{{6}}Z-{leaker.pid}", path.name)
    report = json.loads((path / "report.json").read_text())
    assert report["verdict"] == "leak"
    assert report["culprits"][0]["library"] == LIB, report["culprits"][:2]
    assert (path / "report.md").exists()
    # The grower's death left its history, and how it ended.
    ex = [i for i in incidents if i["kind"] == "exit" and i["pid"] == grower.pid]
    assert len(ex) == 1 and ex[0]["status"] == "done", incidents
    epath = Path(ex[0]["path"])
    assert epath.name.endswith(f"-{grower.pid}-exit")
    erep = json.loads((epath / "report.json").read_text())
    proc = next(p for p in erep["processes"] if p["pid"] == grower.pid)
    assert proc["exit"]["how"] == "exited" and proc["exit"]["status"] == 3, proc
    assert proc["rss_mb_per_min"] > 50
    # The watch's own eBPF ledger followed it: the library that mapped what it held at its end.
    assert erep["culprits"] and erep["culprits"][0]["library"] == LIB, erep["culprits"][:2]
    assert erep["culprits"][0]["outstanding_bytes"] > 4 << 20
    r = run_cli("report", epath, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert churner.popen.poll() is None


def test_watch_bad_input(tmp_path, spawn, target_bin):
    target = spawn([target_bin, "bad-input"])
    session = tmp_path / "session"
    session.mkdir()
    (session / "meta.json").write_text('{"schema": "leaktrace.session/1"}')
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        cases = [
            (("watch",), 2),
            (("watch", "--vllm", "--match", "x"), 2),
            (("watch", "--match", "(unclosed"), 2),
            (("watch", "--match", "x", "--interval", "0"), 2),
            (("watch", "--match", "x", "--max-disk-mb", "-5"), 2),
            (("watch", "--match", "x", "--format", "bogus"), 2),
            (("watch", "--match", "x", "--prometheus-port", "70000"), 2),
            (("watch", "--pid", "999999999"), 3),
            (("watch", "--match", "x", "--out", session), 13),
            (("watch", "--match", "x", "--out", "/proc/leaktrace/w"), 9),
            (("watch", "--pid", target.pid, "--out", tmp_path / "p", "--prometheus-port",
              busy.getsockname()[1], "--duration", "5"), 2),
        ]
        procs = [(args, rc, subprocess.Popen([*LEAKTRACE, *map(str, args)], stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, text=True, cwd=str(REPO)))
                 for args, rc in cases]
        for args, rc, p in procs:
            _out, err = p.communicate(timeout=60)
            lines = [ln for ln in err.strip().splitlines() if ln.strip()]
            assert p.returncode == rc, (args, p.returncode, err)
            assert len(lines) <= 3 and "Traceback" not in err, (args, err)
    finally:
        busy.close()


def test_disk_bound(tmp_path):
    from leaktrace.watch.incidents import INCIDENTS, enforce_disk

    d = tmp_path / INCIDENTS
    for i in range(5):
        inc = d / f"2026010{i}T000000Z-{100 + i}"
        inc.mkdir(parents=True)
        (inc / "report.json").write_bytes(b"x" * (1 << 20))
    busy = {d / "20260100T000000Z-100"}  # the oldest, still being written: kept
    deleted = enforce_disk(tmp_path, 2.5 * (1 << 20), busy)
    assert [p.name for p in deleted] == ["20260101T000000Z-101", "20260102T000000Z-102", "20260103T000000Z-103"]
    assert sorted(p.name for p in d.iterdir()) == ["20260100T000000Z-100", "20260104T000000Z-104"]


def test_rolling_history_is_bounded():
    from leaktrace.watch.ring import RingSession

    ring = RingSession(rollup_rows=50)
    for k in range(2000):
        ring.append("rollup", [{"t": float(k), "pid": p, "rss": k, "pss": k, "uss": k, "anon": k, "swap": 0,
                                "shared": 0} for p in (1, 2)])
        ring.append("regions", [{"t": float(k), "pid": 1, "snapshot": "first" if k == 0 else "last", "start": k}])
    assert len(ring.rollup(1)) == 50 and ring.rollup(1)[-1]["t"] == 1999.0
    regions = ring.tables(1)["regions"]
    assert [r["start"] for r in regions] == [0, 1999]
    ring.forget(1)
    assert ring.pids() == [2]


def test_alert_rules_parse():
    doc = yaml.safe_load(RULES.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert rules and all({"alert", "expr", "labels", "annotations"} <= set(r) for r in rules)
    from leaktrace.probes.exporter import WATCH_METRICS

    for r in rules:
        assert _metric_names(r["expr"]) <= set(WATCH_METRICS), r["alert"]
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (.ci/setup.d/46-watch.sh installs Debian's prometheus)")
    res = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_watch_judges_growth_by_the_hunts_rules_without_pandas():
    """The daemon judges a growing process with the hunt's rules (the same verdict as process_rates and
    is_leaking on the same rows) and never loads pandas or pyarrow for it: they would stay in its RSS."""
    import numpy as np

    from leaktrace.analysis.growth_tables import process_rates
    from leaktrace.analysis.leaking import is_doubtful, is_leaking
    from leaktrace.watch.judge import thresholds

    rnd = np.random.default_rng(7)
    t = np.arange(0.0, 60.0, 1.0)
    shapes = {  # bytes over the window
        "leak": 200e6 + t * 10e6 / 60 + rnd.normal(0, 2e5, t.size),
        "cache filling then flat": 200e6 + np.minimum(t, 20.0) * 1e6,
        "decelerating": 200e6 + 40e6 * (1 - np.exp(-t / 15)),
        "noise": 200e6 + rnd.normal(0, 3e6, t.size),
        "step": 200e6 + (t > 30) * 30e6,
    }
    series = {k: [{"t": float(a), "pid": 9, "rss": float(v), "anon": float(v) - 50e6, "uss": float(v),
                   "pss": float(v)} for a, v in zip(t, y, strict=True)] for k, y in shapes.items()}
    child = ("import json, sys\n"
             "import leaktrace.watch.daemon\n"
             "from leaktrace.watch.judge import judge, thresholds\n"
             "series = json.load(sys.stdin)\n"
             "out = {k: [judge(v, thresholds(None)).leaking, judge(v, thresholds(None)).growing] "
             "for k, v in series.items()}\n"
             "out['loaded'] = sorted(m for m in ('pandas', 'pyarrow') if m in sys.modules)\n"
             "print(json.dumps(out))\n")
    r = subprocess.run([sys.executable, "-c", child], input=json.dumps(series), capture_output=True, text=True,
                       timeout=120, cwd=str(REPO))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got.pop("loaded") == []
    th = thresholds(None)
    import pandas as pd

    want = {}
    for k, rows in series.items():
        row = process_rates(pd.DataFrame(rows)).iloc[0]
        leaking = bool(is_leaking(row, th))
        want[k] = [leaking, leaking or bool(is_doubtful(row, th))]
    assert got == want
    assert want["leak"] == [True, True] and want["noise"] == [False, False] and want["step"][0] is False


@pytest.fixture(scope="module")
def retain_bin() -> Path:
    return build("malloc_retain", ["malloc_retain.c"], ldflags=["-lpthread"])


@pytest.mark.skipif(not is_root(), reason="malloc's books and the eBPF ledger need root")
def test_watch_holds_back_rss_that_nothing_held_explains(tmp_path, spawn, retain_bin):
    """A process whose RSS grows by first touch of a pool malloc already handed out (its books flat) is judged
    leaking by its RSS, then held back by malloc's books and the eBPF ledger: no incident, early or late. A
    malloc leak beside it, as fast, whose memory in use grows with it, is confirmed early
    (--fast-confirm-mb-per-min): before --confirm-s."""
    toucher = spawn([retain_bin, "0", "0", "0", "0", "400"])  # 24 MB/min of first touch, in use flat
    leaker = spawn([retain_bin, "0", "0", "0", "400"])  # 24 MB/min kept in 256-byte entries
    confirm_s = 40
    out = tmp_path / "w"
    watch = subprocess.Popen(
        [*LEAKTRACE, "watch", "--pid", str(toucher.pid), "--pid", str(leaker.pid), "--interval", "1",
         "--confirm-s", str(confirm_s), "--fast-confirm-mb-per-min", "10", "--deep-hunt-s", "10", "--duration", "75",
         "--out", str(out), "--no-gdb",
         "--format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO))
    held: list[str] = []
    toucher_states: set[str] = set()
    try:
        def done() -> bool:
            for t in _state(out).get("targets", []):
                if t["pid"] == toucher.pid:
                    toucher_states.add(t["state"])
                    if t.get("held_back"):
                        held.append(t["held_back"])
            return watch.poll() is not None

        wait_for(done, timeout=150, step=0.5)
        stdout, stderr = watch.communicate(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.communicate()
    assert watch.returncode == 0, stderr
    state = _state(out)
    assert state["ebpf"] is True, state["warnings"]
    incidents = state["incidents"]
    assert [i["pid"] for i in incidents if i["kind"] == "leak"] == [leaker.pid], incidents
    # Leaking from before the watch started: judged leaking within seconds, confirmed FAST_CONFIRM_S (20 s) later
    # on what it holds; without the early confirmation not before confirm_s of the watch's clock.
    first = next(i for i in incidents if i["kind"] == "leak")
    assert first["t"] < confirm_s, (first, stderr[-3000:])
    assert f"pid {leaker.pid}: leak confirmed: it grows" in stderr, stderr[-3000:]
    assert held and "nothing it holds does" in held[-1], (toucher_states, stderr[-3000:])
    assert "confirmed" not in toucher_states and "leaking" in toucher_states, toucher_states
    assert f"pid {toucher.pid}: not confirmed: RSS grows" in stderr, stderr[-3000:]


def test_confirmation_needs_a_leak_over_its_own_stretch():
    """A cache that started filling two minutes into the window, filled at 16 MB/min for two minutes and has
    held still for the last minute: over the 300 s window the watch judges, the flat start is as long a pause
    as the flat end, so no stop shows and it reads a leak; the stretch under confirmation (the last two
    minutes: a minute of growth, a minute flat) is no leak. A steady leak reads one over both."""
    import numpy as np

    from leaktrace.watch.judge import judge, leaks_through, thresholds

    th = thresholds(None)
    rnd = np.random.default_rng(7)
    t = np.arange(0.0, 301.0, 10.0)  # watch's ticks

    def rows(level: np.ndarray) -> list[dict]:
        y = 200 * 2**20 + level + rnd.normal(0, 0.02 * 2**20, len(t))
        return [{"t": float(a), "pid": 1, "rss": float(b), "anon": float(b), "uss": float(b), "pss": float(b)}
                for a, b in zip(t, y, strict=True)]

    cache = rows(np.clip(t - 120.0, 0.0, 120.0) * 16.0 / 60.0 * 2**20)
    leak = rows(t * 16.0 / 60.0 * 2**20)
    assert judge(cache, th).leaking, "the window alone calls the filled cache a leak"
    assert not leaks_through(cache, 180.0, th)
    assert judge(leak, th).leaking and leaks_through(leak, 180.0, th)
