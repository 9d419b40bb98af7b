"""CLI edges a new user hits first: where the session goes (relative paths while libbcc moves the working
directory, an --out that already holds a session, default names, a directory removed mid-hunt), doctor,
ps, report --stdout, the gdb budget flags, and Ctrl-C at every stage of a hunt and of the demo."""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import LEAKTRACE, REPO, is_root, wait_for

from leaktrace.analysis.growth import SHAPE_MIN_SPAN_S
from leaktrace.probes.gdb.checks import proc_state, tracer_of
from leaktrace.session import SessionReader

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
root_only = pytest.mark.skipif(not is_root(), reason="BPF and gdb need root")


def cli(*args: str, cwd: Path, timeout: float = 180, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*LEAKTRACE, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          cwd=str(cwd), env={**os.environ, **(env or {})})


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("leaktrace: error:")]


def start_cli(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([*LEAKTRACE, *map(str, args)], cwd=str(cwd), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def read_meta(out: Path) -> dict:
    return json.loads((out / "meta.json").read_text())


# ----------------------------------------------------------------------------- where the session goes

FLUSH_DURING_COMPILE = r'''
import os, sys, threading, time
from leaktrace import cli, session
from leaktrace.probes.bpf import loader

writers, seen = [], {}
init = session.SessionWriter.__init__
def record(self, *a, **k):
    init(self, *a, **k)
    writers.append(self)
session.SessionWriter.__init__ = record

real_import = loader.import_bcc
def import_bcc():
    bcc = real_import()
    real_bpf = bcc.BPF
    class Module:  # the real bcc module, with BPF() watched
        def __getattr__(self, name):
            return getattr(bcc, name)
        @staticmethod
        def BPF(*a, **k):
            home = os.getcwd()
            def flush_while_moved():
                # libbcc chdirs into the kernel-header tree while it compiles (GIL released): flush then.
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    cwd = os.getcwd()
                    if cwd != home:
                        for w in writers:
                            w.append("compile_window", {"t": w.now(), "cwd": cwd})
                            w.flush()
                        seen["cwd"] = cwd
                        seen["errors"] = [repr(w.write_error) for w in writers if w.write_error]
                        return
                    time.sleep(0.0002)
            t = threading.Thread(target=flush_while_moved, daemon=True)
            t.start()
            try:
                return real_bpf(*a, **k)
            finally:
                t.join(timeout=20)
                print("COMPILE-WINDOW", repr(seen), file=sys.stderr, flush=True)
    return Module()
loader.import_bcc = import_bcc
try:
    cli.main(sys.argv[1:])
except SystemExit as e:
    sys.exit(e.code)
'''


@root_only
@pytest.mark.bpf
@pytest.mark.gdb
def test_relative_out_survives_a_flush_while_bpf_compiles(spawn, leaker_bin, tmp_path):
    """The flush thread writes while libbcc has moved the working directory: the session lands in
    --out, relative to where the user ran the command, whole."""
    target = spawn([leaker_bin, "--leak-kib-per-s", "4096"])
    script = tmp_path / "flush_during_compile.py"
    script.write_text(FLUSH_DURING_COMPILE)
    work = tmp_path / "work"
    work.mkdir()
    r = subprocess.run([sys.executable, str(script), "hunt", "--pid", str(target.pid), "--duration", "4",
                        "--gdb-samples", "3", "--out", "rel", "--format", "json"],
                       capture_output=True, text=True, timeout=240, cwd=str(work),
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-3000:]
    window = next(ln for ln in r.stderr.splitlines() if ln.startswith("COMPILE-WINDOW"))
    seen = ast.literal_eval(window.split(" ", 1)[1])
    assert seen.get("cwd") and seen["cwd"] != str(work), f"the flush never ran inside the compile window: {window}"
    assert seen["errors"] == [], window
    reader = SessionReader(work / "rel")
    moved = reader.table("compile_window")
    assert len(moved) == 1 and moved["cwd"].iloc[0] == seen["cwd"]
    assert reader.meta["complete"] and "bpf" in reader.meta["probes"] and "gdb" in reader.meta["probes"]
    rep = json.loads((work / "rel" / "report.json").read_text())
    assert rep["ledger"]["events"] > 0 and [p["pid"] for p in rep["processes"]] == [target.pid]
    # gdb's work folder came from the same absolute path: nothing was written under the header tree.
    assert not (Path(seen["cwd"]) / "rel").exists()


def test_out_holding_a_session_is_refused_then_replaced_with_force(spawn, leaker_bin, tmp_path):
    first = spawn([leaker_bin, "--leak-kib-per-s", "1024"])
    second = spawn([leaker_bin, "--leak-kib-per-s", "1024"])
    hunt = ("hunt", "--no-bpf", "--no-gdb", "--duration", "2", "--format", "json", "--out", "same")
    r = cli(*hunt, "--pid", first.pid, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    before = read_meta(tmp_path / "same")

    r = cli(*hunt, "--pid", second.pid, cwd=tmp_path)
    assert r.returncode == 13 and "Traceback" not in r.stderr
    [line] = error_lines(r.stderr)
    assert "already holds a leaktrace session" in line and str(first.pid) in line and "--force" in line
    assert read_meta(tmp_path / "same") == before  # untouched

    r = cli(*hunt, "--pid", second.pid, "--force", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    after = read_meta(tmp_path / "same")
    assert after["id"] != before["id"] and after["target"]["pids"] == [second.pid]
    rep = json.loads((tmp_path / "same" / "report.json").read_text())
    assert [p["pid"] for p in rep["processes"]] == [second.pid]
    rollup = SessionReader(tmp_path / "same").table("rollup")
    assert set(rollup["pid"]) == {second.pid}  # no part of the first run survived
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same"]  # no staging or old copy left


def test_non_session_directory_is_never_touched(spawn, leaker_bin, tmp_path):
    target = spawn([leaker_bin, "--leak-kib-per-s", "256"])
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    for extra in ((), ("--force",)):
        r = cli("hunt", "--pid", target.pid, "--no-bpf", "--no-gdb", "--duration", "1", "--out", mine, *extra,
                cwd=tmp_path)
        assert r.returncode == 13, r.stderr
        assert "holds no leaktrace session" in error_lines(r.stderr)[0]
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and (mine / "notes.txt").read_text() == "keep me"


def test_default_names_never_collide(spawn, leaker_bin, tmp_path):
    """Two hunts started in the same second without --out get two directories; a failed one leaves none."""
    a = spawn([leaker_bin, "--leak-kib-per-s", "256"])
    b = spawn([leaker_bin, "--leak-kib-per-s", "256"])
    args = ("hunt", "--no-bpf", "--no-gdb", "--duration", "2", "--format", "json")
    procs = [start_cli(*args, "--pid", t.pid, cwd=tmp_path) for t in (a, b)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    dirs = sorted(d for d in tmp_path.iterdir() if d.name.startswith("leaktrace-"))
    assert len(dirs) == 2, dirs
    assert sorted(read_meta(d)["target"]["pids"][0] for d in dirs) == sorted([a.pid, b.pid])
    printed = sorted(ln.split("report: ", 1)[1] for out, _ in outs for ln in out.splitlines() if ln.startswith("report: "))
    assert printed == sorted(str(d / "report.json") for d in dirs)  # absolute paths, one per hunt
    r = cli(*args, "--pid", "999999", cwd=tmp_path)
    assert r.returncode == 3
    assert len([d for d in tmp_path.iterdir() if d.name.startswith("leaktrace-")]) == 2


def test_out_removed_mid_hunt_says_so(spawn, leaker_bin, tmp_path):
    target = spawn([leaker_bin, "--leak-kib-per-s", "256"])
    out = tmp_path / "gone"
    hunt = start_cli("hunt", "--pid", target.pid, "--no-bpf", "--no-gdb", "--duration", "6", "--out", out,
                     cwd=tmp_path)
    try:
        assert wait_for(lambda: any((out / "tables").glob("*/part-*.parquet")), timeout=60)
        # The hunt's flush may add a part while the tree is removed ("Directory not empty"): remove again.
        assert wait_for(lambda: shutil.rmtree(out, ignore_errors=True) or not out.exists(), timeout=30)
        _, err = hunt.communicate(timeout=120)
    finally:
        hunt.kill()
    assert hunt.returncode == 9, err
    [line] = error_lines(err)
    assert "disappeared" in line and "free space" not in line, line


# ----------------------------------------------------------------------------- doctor, ps, report

@root_only
def test_doctor_text_and_json_agree_and_a_failing_check_shows_its_fix(tmp_path):
    r = cli("doctor", "--json", cwd=tmp_path)
    doc = json.loads(r.stdout)
    assert r.returncode == (0 if doc["ok"] else 5) and doc["ok"], r.stdout
    names = {c["name"]: c for c in doc["checks"]}
    assert names["bpf syscall"]["ok"] and names["kernel BTF"]["ok"]
    text = cli("doctor", cwd=tmp_path)
    assert text.returncode == 0 and text.stdout.strip().endswith("ready to trace")
    for c in doc["checks"]:
        assert c["name"] in text.stdout
    # As nobody the bpf() syscall is refused: that check fails, says why and how to fix it; exit 5.
    os.chmod(tmp_path, 0o777)
    env = {"HOME": str(tmp_path), "MPLCONFIGDIR": str(tmp_path)}
    r = subprocess.run([*NOBODY, *LEAKTRACE, "doctor", "--json"], capture_output=True, text=True, timeout=120,
                       cwd=str(tmp_path), env={**os.environ, **env})
    assert r.returncode == 5, r.stderr
    doc = json.loads(r.stdout)
    bad = {c["name"]: c for c in doc["checks"] if not c["ok"]}
    assert not doc["ok"] and "bpf syscall" in bad and "root" in bad["bpf syscall"]["fix"]
    t = subprocess.run([*NOBODY, *LEAKTRACE, "doctor"], capture_output=True, text=True, timeout=120,
                       cwd=str(tmp_path), env={**os.environ, **env})
    assert t.returncode == 5 and f"fix: {bad['bpf syscall']['fix']}" in t.stdout
    assert t.stdout.strip().endswith("not ready: see the fixes above")


def test_ps_all_and_pid(spawn, leaker_bin, tmp_path):
    target = spawn([leaker_bin, "--leak-kib-per-s", "64"])
    r = cli("ps", "--json", "--no-metrics", cwd=tmp_path)
    assert r.returncode == 0 and target.pid not in [p["pid"] for p in json.loads(r.stdout)]
    r = cli("ps", "--json", "--all", "--no-metrics", cwd=tmp_path)
    everything = {p["pid"]: p for p in json.loads(r.stdout)}
    assert target.pid in everything and everything[target.pid]["label"] == "other"
    assert len(everything) > 3
    r = cli("ps", "--json", "--all", "--no-metrics", "--pid", target.pid, cwd=tmp_path)
    only = json.loads(r.stdout)
    assert [p["pid"] for p in only] == [target.pid] and only[0]["ppid"] == os.getpid()
    text = cli("ps", "--all", "--no-metrics", "--pid", target.pid, cwd=tmp_path)
    assert text.returncode == 0 and str(target.pid) in text.stdout and "other processes" in text.stdout
    r = cli("ps", "--pid", "999999", "--no-metrics", cwd=tmp_path)
    assert r.returncode == 3 and len(error_lines(r.stderr)) == 1


def test_report_stdout_prints_the_report_it_writes(spawn, leaker_bin, tmp_path):
    target = spawn([leaker_bin, "--leak-kib-per-s", "4096"])
    # A watcher-only verdict needs min_span_s (8 s) of growth after the warm-up cut.
    r = cli("hunt", "--pid", target.pid, "--no-bpf", "--no-gdb", "--duration", "12", "--format", "json",
            "--out", "s", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (tmp_path / "s" / "report.json").unlink()
    r = cli("report", "s", "--stdout", "--format", "json,md", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    printed = json.loads(r.stdout)
    assert printed == json.loads((tmp_path / "s" / "report.json").read_text())
    assert printed["verdict"] == "leak" and printed["processes"][0]["pid"] == target.pid
    assert (tmp_path / "s" / "report.md").is_file() and not (tmp_path / "s" / "report.html").exists()


# ----------------------------------------------------------------------------- gdb budget flags

@root_only
@pytest.mark.gdb
def test_gdb_seconds_is_honoured(spawn, leaker_bin, tmp_path):
    # A few mmaps per second: the sample count (100000) is never reached, so --gdb-seconds ends the run.
    target = spawn([leaker_bin, "--leak-kib-per-s", "256", "--chunk-kib", "64"])
    r = cli("hunt", "--pid", target.pid, "--no-bpf", "--gdb-samples", "100000", "--gdb-seconds", "2",
            "--duration", "7", "--format", "json", "--out", "s", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    runs = SessionReader(tmp_path / "s").table("gdb_runs")
    assert list(runs["reason"]) == ["time"], runs.to_dict("records")
    window = float(runs["t_end"].iloc[0] - runs["t_start"].iloc[0])
    assert 2.0 <= window < 4.0, window
    assert tracer_of(target.pid) == 0 and proc_state(target.pid) not in ("t", "T")


@root_only
@pytest.mark.gdb
def test_gdb_pause_pct_is_honoured(spawn, leaker_bin, tmp_path):
    # Thousands of mmap/munmap a second: a 0.1% budget (30 ms over the 30 s floor) ends the run early.
    target = spawn([leaker_bin, "--churn-per-s", "3000"])
    r = cli("hunt", "--pid", target.pid, "--no-bpf", "--gdb-samples", "100000", "--gdb-seconds", "20",
            "--gdb-pause-pct", "0.1", "--duration", "8", "--format", "json", "--out", "s", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    runs = SessionReader(tmp_path / "s").table("gdb_runs").to_dict("records")
    assert len(runs) == 1 and runs[0]["reason"].startswith("budget: paused") and "0.1%" in runs[0]["reason"], runs
    assert runs[0]["paused_s"] <= 0.001 * 30 + 0.01, runs  # the budget, plus at most the last stop
    assert runs[0]["stops"] > 0
    r = cli("hunt", "--pid", "1", "--no-bpf", "--gdb-pause-pct", "0", "--out", "x", cwd=tmp_path)
    assert r.returncode == 2 and "--gdb-pause-pct" in error_lines(r.stderr)[0]


# ----------------------------------------------------------------------------- Ctrl-C

def _bpf_compiling(pid: int, headers: Path) -> bool:
    """libbcc's compile moves the process's working directory into the kernel-header tree."""
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd")).is_relative_to(headers)
    except OSError:
        return False


def _assert_stopped_by_ctrl_c(hunt: subprocess.Popen, out: Path, target_pid: int) -> dict:
    stdout, stderr = hunt.communicate(timeout=120)
    assert hunt.returncode == 0, stderr[-2000:]
    assert "Traceback" not in stderr
    meta = read_meta(out)
    assert meta["complete"] and meta["stop_reason"] == "interrupted (Ctrl-C)", meta.get("stop_reason")
    rep = json.loads((out / "report.json").read_text())
    assert rep["processes"] and rep["processes"][0]["pid"] == target_pid
    assert f"report: {out / 'report.json'}" in stdout
    assert tracer_of(target_pid) == 0 and proc_state(target_pid) not in ("t", "T")
    return rep


@root_only
@pytest.mark.bpf
def test_ctrl_c_during_the_bpf_compile(spawn, leaker_bin, tmp_path):
    from leaktrace.probes.bpf.loader import choose_headers

    headers = Path(choose_headers().path)
    target = spawn([leaker_bin, "--leak-kib-per-s", "1024"])
    hunt = start_cli("hunt", "--pid", target.pid, "--duration", "60", "--out", "s", cwd=tmp_path)
    try:
        assert wait_for(lambda: _bpf_compiling(hunt.pid, headers), timeout=60, step=0.002), "never saw the compile"
        hunt.send_signal(signal.SIGINT)
        _assert_stopped_by_ctrl_c(hunt, tmp_path / "s", target.pid)
    finally:
        hunt.kill()


@root_only
@pytest.mark.bpf
def test_ctrl_c_mid_hunt_and_twice(spawn, leaker_bin, tmp_path):
    target = spawn([leaker_bin, "--leak-kib-per-s", "2048"])
    for name, presses in (("once", 1), ("twice", 2)):
        out = tmp_path / name
        hunt = start_cli("hunt", "--pid", target.pid, "--duration", "120", "--gdb-samples", "0", "--out", out,
                         cwd=tmp_path)
        try:
            # Mid-hunt: the eBPF ledger has recorded events (handshake on the session, not a sleep).
            assert wait_for(lambda o=out: any((o / "tables").glob("ledger*/part-*.parquet")), timeout=90)
            t0 = time.monotonic()
            for _ in range(presses):
                hunt.send_signal(signal.SIGINT)
                time.sleep(0.05)
            rep = _assert_stopped_by_ctrl_c(hunt, out, target.pid)
        finally:
            hunt.kill()
        assert time.monotonic() - t0 < 60
        assert rep["ledger"]["available"] and rep["ledger"]["events"] > 0
        assert rep["duration_s"] < 100


@root_only
@pytest.mark.bpf
def test_ctrl_c_of_demo_writes_the_report(tmp_path):
    demo = start_cli("demo", "--duration", "120", "--out", "d", cwd=tmp_path)
    try:
        line = ""
        while "demo workload: pid" not in line:
            line = demo.stderr.readline()
            assert line, "demo ended before starting its workload"
        workload = int(line.split("pid ")[1].split(",")[0])
        assert wait_for(lambda: any((tmp_path / "d" / "tables").glob("ledger*/part-*.parquet")), timeout=90)
        # The first ledger part comes within a second of attach, but a verdict needs growth measured over a
        # span (SHAPE_MIN_SPAN_S): interrupted once the hunt has run past it, as a user who read the live view
        start_wall = read_meta(tmp_path / "d")["start_wall"]
        time.sleep(max(0.0, start_wall + SHAPE_MIN_SPAN_S + 15 - time.time()))
        demo.send_signal(signal.SIGINT)
        stdout, stderr = demo.communicate(timeout=120)
    finally:
        demo.kill()
    assert demo.returncode == 0, stderr[-2000:]
    meta = read_meta(tmp_path / "d")
    assert meta["stop_reason"] == "interrupted (Ctrl-C)" and meta["complete"]
    assert "hunt stopped early: interrupted (Ctrl-C)" in stdout
    rep = json.loads((tmp_path / "d" / "report.json").read_text())
    assert rep["culprits"] and rep["culprits"][0]["library"] == "libxfer_demo.so"
    assert (tmp_path / "d" / "report.html").is_file()
    assert not Path(f"/proc/{workload}").exists()  # the demo's workload is stopped with it
