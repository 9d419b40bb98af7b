"""Fault matrix on real processes: what happens to the target, the session and the report when
leaktrace or its target dies, execs, or its pid is reused, when two hunts meet, when the disk fills."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, is_root, run_cli, wait_for
from ops_helpers import (
    bpf_prog_ids,
    children_of,
    live_rollup,
    one_error_line,
    parts,
    proc_status,
    prog_ids_held_by,
    session_now,
    start_hunt,
    stop_hunt,
    wait_attached,
    wait_gone,
    wait_rollup,
)

from leaktrace.session import SessionReader


def test_leaktrace_sigkilled_midhunt(tmp_path, spawn, leaker_bin):
    """SIGKILL the hunter (the OOM killer's way): the target runs on, unstopped and untraced; no BPF
    program of the hunt stays loaded; no helper it started survives; the session reads and reports."""
    target = spawn([leaker_bin, "--leak-kib-per-s", "2048", "--churn-per-s", "100"])
    out = tmp_path / "s"
    # Many gdb samples: gdb is attached (the target traced) at the moment leaktrace dies.
    hunt = start_hunt(
        "--pid",
        target.pid,
        "--duration",
        "120",
        "--interval",
        "0.5",
        "--out",
        out,
        "--no-live",
        "--gdb-samples",
        "100000",
    )
    try:
        assert wait_attached(out), hunt.stderr.read() if hunt.poll() is not None else "no attach"
        # Ticks on disk over ≥ 11 s of hunt time (not a wall-clock sleep): past the 10% warm-up cut the
        # steady 2 MiB/s leak spans more than the 8 s a leak verdict needs, so the truth is "leak".
        assert wait_rollup(out, span_s=11.0, timeout=120), f"the hunt wrote {len(live_rollup(out))} rollup rows"
        wait_for(lambda: proc_status(target.pid)["TracerPid"] != "0", timeout=10)  # gdb attached, if any
        held = prog_ids_held_by(hunt.pid)
        helpers = children_of(hunt.pid)
        os.kill(hunt.pid, signal.SIGKILL)
        hunt.wait(timeout=10)
    finally:
        if hunt.poll() is None:
            hunt.kill()
    meta = json.loads((out / "meta.json").read_text())
    # Helpers (gdb) read EOF and leave; a survivor would keep the target traced or stopped.
    for pid in helpers:
        assert wait_gone(pid), f"helper pid {pid} ({proc_status(pid).get('Name')}) survived leaktrace"
    assert wait_for(lambda: proc_status(target.pid)["TracerPid"] == "0", timeout=10)
    st = proc_status(target.pid)
    assert st["State"][0] in "RS", st["State"]
    rss0 = int(st["VmRSS"].split()[0])
    assert wait_for(lambda: int(proc_status(target.pid)["VmRSS"].split()[0]) > rss0 + 1024, timeout=10), (
        "target stopped making progress after leaktrace died"
    )
    if held:
        live_ids = bpf_prog_ids()
        assert live_ids is not None
        assert wait_for(lambda: not (held & (bpf_prog_ids() or set())), timeout=10), (
            f"BPF programs {held & live_ids} outlived leaktrace"
        )
    elif "bpf" in meta.get("probes", []):
        pytest.fail("the bpf probe ran but the hunt held no BPF program fds")
    if is_root():
        assert "bpf" in meta.get("probes", []), meta.get("warnings")
    reader = SessionReader(out)
    assert not reader.complete
    rollup = reader.table("rollup")
    assert set(rollup["pid"]) == {target.pid}
    assert rollup["t"].max() - rollup["t"].min() >= 11.0  # what was on disk before the SIGKILL stays
    r = run_cli("report", out, "--format", "json,md")
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["session_complete"] is False
    assert rep["verdict"] == "leak", rep["verdict_reason"]
    assert rep["culprits"][0]["pid"] == target.pid, rep["culprits"]


def test_target_sigkilled_midhunt(tmp_path, spawn, leaker_bin):
    """The target dies: the hunt ends by itself, finalizes the session, and the report says when."""
    target = spawn([leaker_bin, "--leak-kib-per-s", "1024"])
    out = tmp_path / "s"
    hunt = start_hunt(
        "--pid",
        target.pid,
        "--duration",
        "120",
        "--interval",
        "0.5",
        "--out",
        out,
        "--no-live",
        "--no-gdb",
        "--format",
        "json",
    )
    assert wait_attached(out)
    assert wait_rollup(out, rows=4)  # a few ticks of the live target on disk
    t_kill = session_now(out)
    target.kill()
    rc, stdout, stderr = stop_hunt(hunt, timeout=60)
    assert rc == 0, stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["complete"] and meta["stop_reason"] == "all targets exited"
    rep = json.loads((out / "report.json").read_text())
    (proc,) = rep["processes"]
    assert proc["exited_s"] is not None and abs(proc["exited_s"] - t_kill) < 3.0, (proc, t_kill)
    assert "exited" in stderr


EXEC_SCRIPT = """
import os, sys, time
print("ready", flush=True)
big = bytearray(64 << 20)  # touched: 64 MiB of anonymous memory in the program before exec
while not os.path.exists(sys.argv[2]):  # exec on the test's word (a file appears), not after a sleep
    time.sleep(0.02)
os.execv(sys.argv[1], [sys.argv[1], "--leak-kib-per-s", "1024"])
"""


def test_target_execs(tmp_path, spawn, leaker_bin):
    """The target exec()s another program: same pid, new address space. The hunt follows the pid,
    records the exec, and does not diff the new address space against the old (no fake moves). The
    program it execs leaks 1 MiB/s: observed for ≥ 20 s after the exec, the verdict is a leak in that pid."""
    go = tmp_path / "exec-now"
    target = spawn([sys.executable, "-c", EXEC_SCRIPT, leaker_bin, go])
    out = tmp_path / "s"
    hunt = start_hunt(
        "--pid",
        target.pid,
        "--duration",
        "300",
        "--interval",
        "0.5",
        "--smaps-every",
        "2",
        "--out",
        out,
        "--no-live",
        "--no-gdb",
        "--no-bpf",
        "--format",
        "json",
    )
    try:
        assert wait_attached(out) and wait_rollup(out, rows=2), "no tick before the exec"
        go.touch()

        def exec_seen_long_enough() -> bool:
            try:
                pr = SessionReader(out).table("processes")
            except Exception:  # a session being written: try again
                return False
            ex = pr[pr["event"] == "exec"] if "event" in pr else pr.iloc[0:0]
            return len(ex) > 0 and float(live_rollup(out)["t"].max()) >= float(ex["t"].iloc[0]) + 20.0

        assert wait_for(exec_seen_long_enough, timeout=180, step=0.5), "exec not recorded, or too few ticks after it"
        hunt.send_signal(signal.SIGTERM)
    finally:
        rc, _, stderr = stop_hunt(hunt)
    assert rc == 0, stderr
    reader = SessionReader(out)
    procs = reader.table("processes")
    ex = procs[procs["event"] == "exec"]
    assert len(ex) == 1 and ex.iloc[0]["exe"] == str(leaker_bin), procs
    t_exec = float(ex.iloc[0]["t"])
    rollup = reader.table("rollup")
    assert (rollup["t"] < t_exec).any() and (rollup["t"] > t_exec).any()
    # The Python program's 64 MiB anonymous block and the leaker's regions are different processes'
    # memory: nothing may be reported as moved or grown across the exec.
    ev = reader.table("region_events")
    at_exec = ev[(ev["t"] >= t_exec - 0.01) & (ev["t"] <= t_exec + 0.01)]
    assert at_exec.empty, at_exec
    rep = json.loads((out / "report.json").read_text())
    assert rep["verdict"] == "leak", rep["verdict_reason"]
    assert [c["pid"] for c in rep["culprits"]][:1] == [target.pid], rep["culprits"]


def _spawn_with_pid(want: int, argv: list[str]) -> subprocess.Popen | None:
    """Start ``argv`` with pid ``want`` (ns_last_pid; racy with the machine's other forks: retried)."""
    for _ in range(50):
        try:
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(want - 1))
        except OSError:
            return None
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
        if p.pid == want:
            return p
        p.kill()
        p.wait()
    return None


def test_pid_reuse_not_misattributed(tmp_path, spawn, leaker_bin):
    """The target dies and an unrelated, fast-growing process takes its pid between two ticks: the
    hunt must see the target exit, never measure the newcomer as the target."""
    if not is_root():
        pytest.skip("needs root to choose the next pid (ns_last_pid)")
    target = spawn([leaker_bin])  # flat
    out = tmp_path / "s"
    hunt = start_hunt(
        "--pid",
        target.pid,
        "--duration",
        "20",
        "--interval",
        "1",
        "--out",
        out,
        "--no-live",
        "--no-gdb",
        "--no-bpf",
        "--format",
        "json",
    )
    imposter = None
    try:
        assert wait_attached(out)
        assert wait_rollup(out, rows=2)  # the target measured at two ticks before it dies
        pid = target.pid
        target.kill()
        imposter = _spawn_with_pid(pid, [str(leaker_bin), "--leak-kib-per-s", "8192"])
        if imposter is None:
            pytest.skip("could not make the kernel reuse the pid")
        rc, _, stderr = stop_hunt(hunt, timeout=60)
    finally:
        if imposter is not None:
            imposter.kill()
            imposter.wait()
        if hunt.poll() is None:
            hunt.kill()
    assert rc == 0, stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["stop_reason"] == "all targets exited", meta["stop_reason"]
    rollup = SessionReader(out).table("rollup")
    # The flat target never exceeded a few MB; the imposter grows 8 MB/s.
    assert rollup["rss"].max() < rollup["rss"].min() + (4 << 20), rollup
    rep = json.loads((out / "report.json").read_text())
    # A flat target watched for a few seconds: too short for a no-leak verdict, nothing growing.
    assert rep["verdict"] == "inconclusive" and rep["culprits"] == [], (rep["verdict"], rep["verdict_reason"])


def test_two_hunts_on_one_target(tmp_path, spawn, leaker_bin):
    """A second hunt on a process being hunted is refused with one line and its own exit code; once
    the first hunt ends (even killed), hunting it again works."""
    target = spawn([leaker_bin, "--leak-kib-per-s", "256"])
    first = start_hunt(
        "--pid", target.pid, "--duration", "60", "--out", tmp_path / "a", "--no-live", "--no-gdb", "--no-bpf"
    )
    try:
        assert wait_attached(tmp_path / "a")
        r = run_cli(
            "hunt", "--pid", target.pid, "--duration", "2", "--out", tmp_path / "b", "--no-gdb", "--no-bpf"
        )
        assert r.returncode == 12, r.stderr
        line = one_error_line(r.stderr)
        assert f"pid {target.pid} is already being hunted by leaktrace pid {first.pid}" in line
        assert not (tmp_path / "b").exists()  # refused before anything was written
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    r = run_cli(
        "hunt",
        "--pid",
        target.pid,
        "--duration",
        "1",
        "--out",
        tmp_path / "c",
        "--no-gdb",
        "--no-bpf",
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr


FILL = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, b"x" * 4096)
except OSError:
    pass
"""


@pytest.fixture
def small_tmpfs(tmp_path):
    if not is_root():
        pytest.skip("needs root to mount a tmpfs")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_disk_full_while_writing(small_tmpfs, spawn, leaker_bin):
    """The session's filesystem fills mid-hunt: the hunt ends with one line and exit code 9, and what
    was written before stays readable (and reportable once there is room again)."""
    target = spawn([leaker_bin, "--leak-kib-per-s", "1024"])
    out = small_tmpfs / "s"
    hunt = start_hunt(
        "--pid",
        target.pid,
        "--duration",
        "6",
        "--interval",
        "0.25",
        "--out",
        out,
        "--no-live",
        "--no-gdb",
        "--no-bpf",
        "--format",
        "json",
    )
    assert wait_attached(out)
    assert wait_rollup(out, rows=4)  # ticks already on disk when it fills
    before_full = len(live_rollup(out))
    filler = small_tmpfs / "filler"
    subprocess.run([sys.executable, "-c", FILL, str(filler)], check=True)
    rc, _, stderr = stop_hunt(hunt)
    assert rc == 9, stderr
    line = one_error_line(stderr)
    assert "No space left on device" in line and "stays readable" in line, line
    assert not list(out.rglob(".*.tmp")), "half-written temporary files left on the full disk"
    reader = SessionReader(out)
    n = len(reader.table("rollup"))
    assert n >= before_full >= 4 and reader.skipped_parts == []
    filler.unlink()
    r = run_cli("report", out, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "report.json").read_text())["processes"][0]["samples"] == n


COMPACTING_WRITER = """
import sys, time
import leaktrace.session.parts
import leaktrace.session as s
leaktrace.session.parts.COMPACT_FANOUT = 4   # compact often: every 4 parts, and every 4 range files of a level
w = s.SessionWriter(sys.argv[1], flush_interval=0.01)
print("ready", flush=True)
i = 0
while True:
    w.append("rollup", {"t": float(i), "pid": 1, "rss": i, "pss": 0, "uss": 0, "anon": 0, "swap": 0,
                        "shared": 0})
    i += 1
    time.sleep(0.002)
"""


def test_compaction_is_sigkill_safe(tmp_path):
    """A writer compacting its parts every few flushes, read while it writes, then SIGKILLed at a random
    moment: every row written reads back exactly once, in order, and the number of files stays bounded."""
    rng = random.Random(8)
    for k in range(3):
        out = tmp_path / f"s{k}"
        p = subprocess.Popen(
            [sys.executable, "-c", COMPACTING_WRITER, str(out)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=str(REPO),
        )
        assert p.stdout is not None and p.stdout.readline().startswith("ready")
        # Killed at a random moment counted in rows written (≥ 100 flushes), not in wall-clock seconds.
        kill_at = rng.randint(100, 250)
        deadline = time.monotonic() + 120
        seen: list = []
        while len(seen) < kill_at:  # readers of a live, compacting session see no gap either
            assert time.monotonic() < deadline, f"run {k}: only {len(seen)} rows in 120 s"
            live = SessionReader(out)
            seen = live.table("rollup")["rss"].tolist()
            assert seen == list(range(len(seen))) and live.skipped_parts == [], f"run {k}: live read"
        p.kill()
        p.wait()
        files = parts(out)
        rows = SessionReader(out).table("rollup")["rss"].tolist()
        assert rows == list(range(len(rows))), f"run {k}: rows lost or duplicated"
        assert len(rows) >= len(seen) >= kill_at  # rows read before the kill were on disk: all still there
        # A flush every ≥ 2 ms row (flush_interval 0.01 s), merged by 4s on three levels: far fewer files
        # than flushes.
        assert len(files) < len(rows) / 4, (len(files), len(rows))


def test_interrupted_compaction_leftovers_read_once(tmp_path):
    """The state a SIGKILL between a range file's rename and its parts' unlinks leaves: the range file
    plus leftover parts. Rows read once; an unreadable range file falls back to the leftovers."""
    import shutil

    from leaktrace.session import SessionWriter
    from leaktrace.session.parts import compact_table

    w = SessionWriter(tmp_path / "s", flush_interval=60)
    for i in range(6):
        w.append("rollup", {"t": float(i), "pid": 1, "rss": i})
        w.flush()
    w.close(compact=False)
    d = tmp_path / "s" / "tables" / "rollup"
    saved = tmp_path / "saved"
    shutil.copytree(d, saved)
    compact_table(tmp_path / "s", "rollup")
    (merged,) = parts(tmp_path / "s")
    assert merged.name == "part-000000-000005.parquet"
    for p in sorted(saved.glob("part-00000[0-3].parquet")):  # unlinks interrupted after part 3
        shutil.copy(p, d / p.name)
    assert SessionReader(tmp_path / "s").table("rollup")["rss"].tolist() == list(range(6))
    merged.write_bytes(b"PAR1 truncated")
    r = SessionReader(tmp_path / "s")
    assert r.table("rollup")["rss"].tolist() == [0, 1, 2, 3]
    assert r.skipped_parts == ["tables/rollup/part-000000-000005.parquet"]


def test_a_stalled_hunt_skips_missed_ticks_and_says_so(tmp_path, spawn, leaker_bin):
    """The hunt not scheduled for 4 s (SIGSTOP: what a saturated machine does to it beside a vLLM pair): the
    ticks it missed are skipped, not run back to back when it resumes (a burst costs the target CPU and
    bunches the samples), and the report says how late ticks ran and what each probe's ticks cost."""
    target = spawn([leaker_bin, "--leak-kib-per-s", "512"])
    out = tmp_path / "s"
    hunt = start_hunt("--pid", target.pid, "--duration", "60", "--interval", "0.5", "--out", out, "--no-live",
                      "--no-bpf", "--no-gdb", "--no-pyheap", "--format", "json,md")
    try:
        assert wait_attached(out), hunt.stderr.read() if hunt.poll() is not None else "no attach"
        assert wait_rollup(out, span_s=2.0, timeout=60)
        os.kill(hunt.pid, signal.SIGSTOP)
        time.sleep(4.0)
        os.kill(hunt.pid, signal.SIGCONT)
        assert wait_rollup(out, span_s=float(live_rollup(out)["t"].max() - live_rollup(out)["t"].min()) + 2.5,
                           timeout=60)
    finally:
        if hunt.poll() is None:
            hunt.send_signal(signal.SIGINT)
        rc, _, err = stop_hunt(hunt)
    assert rc == 0, err
    rep = json.loads((out / "report.json").read_text())
    tc = rep["tick_costs"]
    assert tc["late_ticks"] >= 1 and tc["max_late_s"] >= 3.0, tc
    w = tc["probes"]["watcher"]
    assert w["ticks"] >= 8 and 0 < w["cpu_s"] <= w["wall_s"] + 0.05, w
    t = SessionReader(out).table("rollup")["t"].sort_values().reset_index(drop=True)
    gaps = t.diff()
    assert gaps.max() >= 3.0, f"no stall in the samples: {list(gaps.round(2))}"
    resumed = float(t[gaps.idxmax()])
    burst = t[(t >= resumed) & (t < resumed + 1.0)]
    # 2 ticks a second at 0.5 s; catching up the ~8 missed ones would put ~10 in the first second
    assert len(burst) <= 3, f"{len(burst)} ticks in the second after the stall: {list((burst - resumed).round(3))}"
    assert "What the hunt's ticks cost" in (out / "report.md").read_text()
