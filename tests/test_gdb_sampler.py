"""The gdb stack sampler on real processes with real gdb: stacks through a stripped hook chain, the
pause budget, and the target left running (not stopped, not traced) on every way sampling can end."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, run_cli, wait_for
from fixtures.gdb_target import HOOK_LIB, LEAK_LIB, build_gdb_target

from leaktrace import procfs
from leaktrace.analysis.gdbjoin import gdb_stack_for, join_regions, libraries_in_order
from leaktrace.probes.gdb.attach import sample_process
from leaktrace.probes.gdb.budget import PauseBudget
from leaktrace.probes.gdb.checks import proc_state, tracer_of
from leaktrace.session import SessionReader

pytestmark = [pytest.mark.gdb,
              pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb not installed (apt-get install gdb)")]


@pytest.fixture(scope="module")
def gdb_target_bin() -> Path:
    return build_gdb_target()


def test_the_target_runs_on_while_gdb_reads_the_symbols() -> None:
    """gdb reads the symbols before it attaches: a target that starts a thread every ~10 ms (a ptrace event
    while traced) is kept stopped for the attach only. Were they read after the attach, a thread that meets
    an event would wait for the whole read (a loaded vLLM worker's traffic: 20-35 s) while the pause budget
    counts 0.3 s."""
    target = subprocess.Popen([sys.executable, str(REPO / "tests" / "fixtures" / "thread_maker.py"), "12"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
        time.sleep(0.5)
        run = sample_process(target.pid, max_samples=3, max_seconds=3)
        out = target.communicate(timeout=30)[0]
    finally:
        if target.poll() is None:
            target.kill()
    gap = float(out.split()[-1])
    assert run.samples >= 1 and run.symbols_s > 0.3, run  # a read long enough to tell
    assert gap < run.attach_s + 0.5 * run.symbols_s, (gap, run.attach_s, run.symbols_s)


def test_a_stop_during_the_symbol_read_ends_it_at_once() -> None:
    """A hunt stopped while gdb reads the symbols (50-70 s for a vLLM worker on a loaded box) does not
    wait for the read: gdb holds nothing of the target yet and is killed; the target never stopped."""
    import threading

    from leaktrace.probes.gdb.attach import CANCELLED

    target = subprocess.Popen([sys.executable, str(REPO / "tests" / "fixtures" / "thread_maker.py"), "8"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
        stop = threading.Event()
        threading.Timer(0.3, stop.set).start()
        t0 = time.monotonic()
        run = sample_process(target.pid, max_samples=3, max_seconds=3, stop_event=stop)
        took = time.monotonic() - t0
        assert run.reason == CANCELLED and run.samples == 0 and run.attach_s == 0.0, run
        assert proc_state(target.pid) in ("R", "S") and not tracer_of(target.pid)
        gap = float(target.communicate(timeout=30)[0].split()[-1])
    finally:
        if target.poll() is None:
            target.kill()
    assert took < 3.0 and gap < 0.5, (took, gap)  # the read alone takes ~1 s idle: cut short, nothing stopped


def patched_code(pid: int) -> list[tuple[str, int]]:
    """(file, differing bytes) for every executable file mapping whose bytes in memory differ from the
    file: a breakpoint left behind (gdb's own dynamic-linker event breakpoint is one byte in ld.so
    while attached; catch syscall adds none)."""
    diffs = []
    with open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for m in procfs.read_maps(pid):
            if "x" not in m.perms or not m.path.startswith("/"):
                continue
            try:
                with open(m.path, "rb") as f:
                    f.seek(m.offset)
                    want = f.read(m.end - m.start)
            except OSError:
                continue
            mem.seek(m.start)
            got = mem.read(len(want))
            if got != want:
                diffs.append((m.path, sum(a != b for a, b in zip(got, want, strict=True))))
    return diffs


def assert_running_untraced(pid: int, timeout: float = 15.0) -> None:
    """The target is alive, not stopped, no tracer holds it (within ``timeout``), its code is as
    in its files, and it keeps running."""
    ok = wait_for(lambda: tracer_of(pid) == 0 and proc_state(pid) not in (None, "T", "t"), timeout=timeout)
    assert ok, f"pid {pid}: state {proc_state(pid)!r}, TracerPid {tracer_of(pid)}"
    assert patched_code(pid) == []
    # Still making progress: the fixtures keep mapping, so the total mapped size grows (adjacent
    # anonymous chunks merge into one mapping, so the number of mappings need not change).
    def mapped() -> int:
        return sum(m.end - m.start for m in procfs.read_maps(pid))

    before = mapped()
    assert wait_for(lambda: mapped() != before, timeout=5), f"pid {pid} made no progress"


def region_of(pid: int, addr: int) -> procfs.Mapping | None:
    for m in procfs.read_maps(pid):
        if m.start <= addr < m.end:
            return m
    return None


def test_stacks_name_hook_then_stripped_library_and_addresses_match_regions(spawn, gdb_target_bin):
    target = spawn([gdb_target_bin, "--threads", "4", "--per-thread-per-s", "20"])
    run = sample_process(target.pid, max_samples=12, max_seconds=20)
    assert run.reason == "samples", run.reason
    samples = [r for r in run.sample_records if r["syscall"] == "mmap"]
    assert len(samples) >= 12
    threads = {int(t) for t in os.listdir(f"/proc/{target.pid}/task")}
    assert len({s["tid"] for s in samples}) >= 2, "expected samples from several threads"
    for s in samples:
        assert s["tid"] in threads
        libs = libraries_in_order(s["frames"])
        # syscall() in libc, called by the stripped library, called by the hook library, called by the app.
        assert libs[:4] == ["libc.so.6", LEAK_LIB, HOOK_LIB, "gdb_target"], libs
        stripped = [f for f in s["frames"] if f["library"] == LEAK_LIB]
        assert stripped[0]["symbol"] is None and stripped[0]["file_offset"] > 0  # static, stripped: no name
        assert any(f["symbol"] == "gdbhook_event_dispatch" for f in s["frames"])
        assert s["length"] == 64 * 1024
        m = region_of(target.pid, s["addr"])  # leaked chunks stay mapped
        assert m is not None and m.path == "" and m.end - s["addr"] >= s["length"], hex(s["addr"])
    assert run.attach_s > 0 and run.stops >= 2 * len(samples)
    assert run.state_after not in ("T", "t") and run.tracer_after == 0 and not run.sigcont
    assert_running_untraced(target.pid)


def test_attach_pauses_a_many_threaded_process_only_briefly(spawn, tmp_path):
    """The attach stops every thread; gdb must resume them all before it reads the shared libraries'
    symbols (seconds for large libraries), not after. A process whose progress needs its other threads
    (a vLLM worker's step) makes no progress for the whole symbol reading otherwise: seconds for a torch
    process, 20 s for a loaded vLLM worker (whose UCX leak then looks flat in the ledger)."""
    beats = tmp_path / "heartbeat"
    target = spawn([sys.executable, REPO / "tests" / "targets" / "threaded_heartbeat.py", beats])
    assert wait_for(lambda: beats.exists() and len(beats.read_text().split()) > 20, timeout=30)
    t0 = time.monotonic()
    run = sample_process(target.pid, max_samples=1, max_seconds=3)
    t1 = time.monotonic()
    assert run.threads >= 40 and run.symbols_s > 0, run
    assert wait_for(lambda: tracer_of(target.pid) == 0 and proc_state(target.pid) not in (None, "T", "t"), 15)
    time.sleep(0.5)
    ts = [float(x) for x in beats.read_text().split()]
    during = [b - a for a, b in zip(ts, ts[1:], strict=False) if b >= t0 and a <= t1 + 0.5]
    assert during and ts[-1] > t1, "the heartbeat stopped"
    # Stopped for the attach (attach_s) at most, not for the symbol reading that follows it.
    assert max(during) <= run.attach_s + 0.5 * run.symbols_s + 0.2, (max(during), run.attach_s, run.symbols_s)


def test_pause_budget_ends_sampling_and_detaches(spawn, gdb_target_bin):
    target = spawn([gdb_target_bin, "--threads", "4", "--per-thread-per-s", "200"])
    t0 = time.monotonic()
    run = sample_process(target.pid, max_samples=0, max_seconds=30,
                         budget=PauseBudget(pause_fraction=0.01, floor_s=2.0, max_stops_per_s=10_000))
    assert run.reason.startswith("budget: paused"), run.reason
    assert time.monotonic() - t0 < 15
    # The handler stops the budget right after it is exceeded: one stop past it at most.
    assert run.paused_s < 0.01 * max(2.0, run.t_end_mono - run.t_start_mono) + 0.05
    run2 = sample_process(target.pid, max_samples=0, max_seconds=30, budget=PauseBudget(max_stops_per_s=50))
    assert run2.reason == "budget: more than 50 stops/s", run2.reason
    assert_running_untraced(target.pid)


PY_TARGET = "import mmap, sys, time\nkeep = []\ndef grow_python_side():\n    keep.append(mmap.mmap(-1, 1 << 16))\n" \
            "print('ready', flush=True)\nwhile True:\n    grow_python_side(); time.sleep(0.01)\n"


def test_python_frames_from_the_interpreters_memory(spawn):
    """At each stop the stopped thread's Python stack, read from the interpreter's memory (no debug info or gdb
    extension needed): the function whose line mapped, then its caller."""
    target = spawn([sys.executable, "-c", PY_TARGET])
    run = sample_process(target.pid, max_samples=3, max_seconds=20, budget=PauseBudget(pause_fraction=0.1))
    assert run.reason == "samples", run.reason
    assert run.python.startswith("ok: Python 3."), run.python
    for s in run.sample_records:
        if s["syscall"] == "mmap":
            assert s["python_stack"][:2] == ["<string>:grow_python_side:4", "<string>:<module>:7"], s["python_stack"]
    assert proc_state(target.pid) not in (None, "T", "t") and tracer_of(target.pid) == 0


def test_without_the_memory_reader_python_frames_or_a_reason(spawn, monkeypatch):
    from leaktrace.probes.gdb import attach

    monkeypatch.setattr(attach, "frames_config", lambda pid: {"error": "unavailable: turned off by the test"})
    target = spawn([sys.executable, "-c", PY_TARGET])
    # The first stop through a new code path expands debug info (~15 ms, more on a loaded machine):
    # a roomier budget keeps this test about frames, not about the budget.
    run = sample_process(target.pid, max_samples=3, max_seconds=20, budget=PauseBudget(pause_fraction=0.1))
    assert run.reason == "samples", run.reason
    # Which of the two it must be is known here: the sampler loads the interpreter's own gdb extension
    # (python3.X-gdb.py next to it, or under /usr/share/gdb/auto-load with Debian's python3.X-dbg).
    extensions = python_gdb_extensions(target.pid)
    if extensions:
        assert run.python.startswith("ok: ") and run.python[4:] in extensions, (run.python, extensions)
        pyframes = [p for s in run.sample_records for f in s["frames"] for p in f.get("python", [])]
        assert any(p.get("func") == "grow_python_side" for p in pyframes), pyframes[:5]
    else:
        assert run.python.startswith("unavailable: "), run.python
    assert all(s.get("python_stack", []) == [] for s in run.sample_records)
    assert proc_state(target.pid) not in (None, "T", "t") and tracer_of(target.pid) == 0


def python_gdb_extensions(pid: int) -> list[str]:
    """The gdb extensions (``…python3.X-gdb.py``) that exist for the interpreter files mapped by ``pid``."""
    import re

    found = []
    for m in procfs.read_maps(pid):
        if m.offset == 0 and re.search(r"(^|/)(lib)?python3[.\d]*[dmu]*(\.so[.\d]*)?$", m.path):
            real = os.path.realpath(m.path)
            for candidate in (real + "-gdb.py", "/usr/share/gdb/auto-load" + real + "-gdb.py", m.path + "-gdb.py"):
                if os.path.isfile(candidate) and candidate not in found:
                    found.append(candidate)
    return found


def start_hunt(pid: int, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "leaktrace", "hunt", "--pid", str(pid), "--no-bpf",
                             "--duration", "60", "--out", str(out), "--format", "json", *extra],
                            cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def samples_so_far(out: Path) -> int:
    """gdb's own JSON lines in a session while it samples."""
    return sum(p.read_text().count('"type":"sample"') for p in out.glob("gdb/*/samples-*"))


def test_hunt_ctrl_c_detaches_and_session_joins_stacks(spawn, gdb_target_bin, tmp_path):
    target = spawn([gdb_target_bin, "--threads", "2", "--per-thread-per-s", "3"])
    hunt = start_hunt(target.pid, tmp_path / "s", "--gdb-samples", "100000")
    try:
        assert wait_for(lambda: tracer_of(target.pid) != 0, timeout=30), "gdb never attached"
        # While attached the code check sees gdb's one breakpoint (so it would see one left behind).
        assert wait_for(lambda: any("ld-linux" in path for path, _ in patched_code(target.pid)), timeout=10)
        assert wait_for(lambda: samples_so_far(tmp_path / "s") >= 4, timeout=20)
        hunt.send_signal(signal.SIGINT)
        out, err = hunt.communicate(timeout=60)
    finally:
        hunt.kill()
    assert hunt.returncode == 0, err
    assert_running_untraced(target.pid)
    reader = SessionReader(tmp_path / "s")
    runs = reader.table("gdb_runs")
    assert list(runs["pid"]) == [target.pid] and runs["reason"].iloc[0] == "stopped", runs.to_dict("records")
    assert runs["state_after"].iloc[0] not in ("T", "t") and runs["tracer_after"].iloc[0] == 0
    samples = reader.table("gdb_samples")
    assert len(samples) >= 3
    assert samples["t"].between(0, reader.meta["duration_s"] + reader.meta["attach_s"] + 1).all()
    stack = gdb_stack_for(reader, target.pid, LEAK_LIB)
    assert stack[0].startswith("libc.so.6!syscall") and stack[1].startswith(f"{LEAK_LIB}+0x"), stack
    assert any(s.startswith(f"{HOOK_LIB}!gdbhook_event_dispatch") for s in stack), stack
    # Each sampled address lies in a region of the watcher's last smaps; that region gets the stack.
    joined = join_regions(reader)
    hit = joined[joined["gdb_samples"] > 0]
    assert hit["gdb_samples"].sum() == (samples["syscall"] == "mmap").sum()
    assert all(LEAK_LIB in "".join(s) for s in hit["gdb_stack"])


def test_sigkill_of_leaktrace_mid_sampling_leaves_target_running(spawn, gdb_target_bin, tmp_path):
    target = spawn([gdb_target_bin, "--threads", "2", "--per-thread-per-s", "3"])
    hunt = start_hunt(target.pid, tmp_path / "s", "--gdb-samples", "100000")
    try:
        assert wait_for(lambda: tracer_of(target.pid) != 0, timeout=30), "gdb never attached"
        gdb_pid = tracer_of(target.pid)
        # Killed mid-sampling: once gdb has sampled (the target stops and resumes under it), not after a sleep.
        assert wait_for(lambda: samples_so_far(tmp_path / "s") >= 2, timeout=30), "gdb took no sample"
        assert tracer_of(target.pid) == gdb_pid  # still attached: sampling goes on when leaktrace dies
        hunt.send_signal(signal.SIGKILL)
        hunt.wait(timeout=10)
    finally:
        hunt.kill()
    assert_running_untraced(target.pid)
    assert wait_for(lambda: proc_state(gdb_pid) in (None, "Z"), timeout=15), "gdb outlived leaktrace"


def test_each_process_of_the_tree_in_turn(spawn, leaker_bin, tmp_path):
    parent = spawn([leaker_bin, "--leak-kib-per-s", "640", "--chunk-kib", "64", "--fork-after", "0"])
    assert wait_for(lambda: len(procfs.process_tree([parent.pid])) == 2, timeout=10)
    res = run_cli("hunt", "--pid", parent.pid, "--no-bpf", "--duration", "6", "--interval", "0.5",
                  "--gdb-samples", "3", "--out", tmp_path / "s", "--format", "json", timeout=120)
    assert res.returncode == 0, res.stderr
    runs = SessionReader(tmp_path / "s").table("gdb_runs")
    tree = set(procfs.process_tree([parent.pid]))
    assert set(runs["pid"]) == tree, runs.to_dict("records")
    assert (runs["reason"] == "samples").all() and (runs["samples"] >= 3).all(), runs.to_dict("records")
    for pid in tree:
        assert proc_state(pid) not in (None, "T", "t") and tracer_of(pid) == 0


def test_default_policy_samples_only_what_grows(spawn, leaker_bin, tmp_path):
    grower = spawn([leaker_bin, "--leak-kib-per-s", "8192", "--chunk-kib", "1024"])  # 8 MiB/s, touched
    quiet = spawn(["sleep", "60"], ready=None)
    res = run_cli("hunt", "--pid", grower.pid, "--pid", quiet.pid, "--no-bpf", "--duration", "5",
                  "--interval", "0.5", "--out", tmp_path / "s", "--format", "json", timeout=120)
    assert res.returncode == 0, res.stderr
    runs = SessionReader(tmp_path / "s").table("gdb_runs")
    assert list(runs["pid"]) == [grower.pid], runs.to_dict("records")
    assert runs["samples"].iloc[0] >= 1 and runs["state_after"].iloc[0] not in ("T", "t")


def test_hunt_without_gdb_says_so_in_one_line(spawn, gdb_target_bin, tmp_path):
    target = spawn([gdb_target_bin, "--threads", "1", "--per-thread-per-s", "5"])
    env = {"PATH": "/nonexistent", "LEAKTRACE_GDB": ""}
    res = run_cli("hunt", "--pid", target.pid, "--no-bpf", "--duration", "1", "-q",
                  "--gdb-samples", "5", "--out", tmp_path / "a", env=env, timeout=60)
    assert res.returncode == 6, (res.returncode, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "gdb" in lines[0] and "--gdb-samples 0" in lines[0], res.stderr
    res = run_cli("hunt", "--pid", target.pid, "--no-bpf", "--duration", "1", "-q", "--gdb-samples", "0",
                  "--out", tmp_path / "b", "--format", "json", env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert tracer_of(target.pid) == 0


SEIZE_TRACER = """
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_SEIZE = 0x4206
if libc.ptrace(PTRACE_SEIZE, int(sys.argv[1]), None, None) != 0:
    print("seize failed", ctypes.get_errno(), flush=True); sys.exit(1)
print("ready", flush=True)
time.sleep(600)
"""


def test_hunt_when_ptrace_is_refused(spawn, gdb_target_bin, tmp_path):
    target = spawn([gdb_target_bin, "--threads", "1", "--per-thread-per-s", "5"])
    # Another tracer holds the target (PTRACE_SEIZE does not stop it): attaching is refused by the kernel.
    other = spawn([sys.executable, "-c", SEIZE_TRACER, target.pid])
    assert tracer_of(target.pid) == other.pid
    res = run_cli("hunt", "--pid", target.pid, "--no-bpf", "--duration", "1", "-q", "--gdb-samples", "5",
                  "--out", tmp_path / "a", timeout=60)
    assert res.returncode == 6, (res.returncode, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "ptrace not permitted" in lines[0] and str(other.pid) in lines[0], res.stderr
    other.kill()
    assert wait_for(lambda: tracer_of(target.pid) == 0, timeout=10)
    assert proc_state(target.pid) not in (None, "T", "t")


def test_target_whose_name_is_not_utf8(spawn, gdb_target_bin, tmp_path):
    """A process name is bytes (cut at 15, maybe mid-character): the driver reads /proc through procfs,
    so its state and tracer are still known and the preflight passes (a strict UTF-8 read would raise)."""
    from leaktrace.probes.gdb.checks import preflight

    exe = tmp_path / os.fsdecode(b"gdbtgt-\xc3\x28")  # the name becomes the process's comm
    exe.symlink_to(gdb_target_bin)
    target = spawn([exe, "--threads", "1", "--per-thread-per-s", "20"])
    assert procfs.read_proc_bytes(target.pid, "comm") == b"gdbtgt-\xc3(\n"
    assert proc_state(target.pid) in ("R", "S") and tracer_of(target.pid) == 0
    preflight([target.pid])
    # The in-gdb sampler reads the same files (gdb_scripts/sampler.py): it samples, then detaches.
    run = sample_process(target.pid, max_samples=3, max_seconds=20)
    assert run.samples == 3 and run.reason == "samples", run
    assert run.state_after not in ("T", "t") and run.tracer_after == 0


def test_direct_attach_refused_is_typed(spawn, gdb_target_bin):
    """Without the preflight (a race: traced between the check and the attach) gdb's refusal is typed too."""
    from leaktrace.errors import GdbUnavailable
    from leaktrace.probes.gdb.attach import GdbAttach

    target = spawn([gdb_target_bin, "--threads", "1", "--per-thread-per-s", "5"])
    other = spawn([sys.executable, "-c", SEIZE_TRACER, target.pid])
    attach = GdbAttach(target.pid, max_samples=1, max_seconds=5)
    with pytest.raises(GdbUnavailable, match="ptrace not permitted|already traced"):
        attach.start()
    attach.cleanup()
    assert tracer_of(target.pid) == other.pid and proc_state(target.pid) not in (None, "T", "t")
    other.kill()  # first: a dead tracee is reaped only once its tracer lets go


UCX_LEAK_BIN = REPO / ".cache" / "ucx_munmap_leak"  # built by tests/targets/setup_ucx.sh (test_ucx_leak.py)


@pytest.mark.nixl
@pytest.mark.skipif(not (REPO / ".cache/ucx-1.20.1/.complete").exists() or not UCX_LEAK_BIN.exists(),
                    reason="real UCX 1.20.1 target not built (tests/targets/setup_ucx.sh)")
def test_real_ucx_pool_growth_stack_through_the_hooks(spawn):
    """Seed 002 for real: the raw-syscall mmap of UCX's invalidation-queue pool, reached through libucm's
    munmap hook. It is rare (one 148 KiB chunk per ~1,000 munmaps), so the budget is opened up and
    sampling stops as soon as it is seen."""
    import threading

    target = spawn([UCX_LEAK_BIN, "500"], env={"UCX_NET_DEVICES": "lo", "UCX_MODULES": "^ib*,rdmacm"})
    found = threading.Event()
    hits: list = []
    ucx_patches = patched_code(target.pid)  # UCX's own bistro hooks: jumps written into libc's mmap & co.
    assert any("libc.so" in path for path, _ in ucx_patches)

    def on_records(records):
        for r in records:
            if r.get("type") == "sample" and r["syscall"] == "mmap" and any(
                    f.get("symbol") == "ucs_rcache_mp_chunk_alloc" for f in r["frames"]):
                hits.append(r)
                found.set()

    run = sample_process(target.pid, max_samples=0, max_seconds=30, stop_event=found, on_records=on_records,
                         budget=PauseBudget(pause_fraction=1.0, max_stops_per_s=1e6))
    assert hits, f"no pool-growth mmap seen ({run.reason}, {run.samples} samples)"
    libs = libraries_in_order(hits[0]["frames"])
    assert libs[:3] == ["libc.so.6", "libucm.so.0", "libucs.so.0"], libs
    symbols = [f["symbol"] for f in hits[0]["frames"]]
    assert symbols.index("ucs_rcache_mp_chunk_alloc") < symbols.index("ucs_rcache_unmapped_callback")
    assert "ucm_event_dispatch" in symbols and hits[0]["length"] >= 128 * 1024
    assert region_of(target.pid, hits[0]["addr"]) is not None  # the chunk is never returned
    assert run.state_after not in ("T", "t") and run.tracer_after == 0
    assert patched_code(target.pid) == ucx_patches  # nothing of gdb's left


def test_seed002_manual_script(spawn, gdb_target_bin):
    """The documented manual recipe finds the raw syscall(SYS_mmap) caller and leaves the target intact."""
    from leaktrace.probes.gdb.checks import SEED002_SCRIPT, find_gdb

    target = spawn([gdb_target_bin, "--threads", "2", "--per-thread-per-s", "20"])
    res = subprocess.run([find_gdb(), "-nx", "-batch", "-p", str(target.pid), "-x", str(SEED002_SCRIPT)],
                         capture_output=True, text=True, timeout=120)
    assert "=== seed002 done: 20 hits" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
    returned = [ln for ln in res.stdout.splitlines() if ln.startswith("=== seed002 mmap returned 0x")]
    assert returned and region_of(target.pid, int(returned[0].split()[-1], 16)) is not None
    bt = res.stdout.split(returned[0], 1)[1]
    assert bt.index(LEAK_LIB) < bt.index("gdbhook_event_dispatch")  # the stripped library, then the hook
    assert_running_untraced(target.pid)


@pytest.mark.bpf
@pytest.mark.skipif(os.geteuid() != 0, reason="BPF needs root")
def test_hunt_samples_a_process_whose_ledger_grows_while_its_rss_does_not(tmp_path, spawn, leaker_bin) -> None:
    """gdb follows the eBPF ledger, not only RSS: mappings made since attach and never touched (RSS flat, so
    the watcher's 8 MB trigger never fires) grow the ledger's count, and the process gets its gdb stacks."""
    from leaktrace.probes.gdb.probe import GROWTH_TRIGGER_BYTES, LEDGER_TRIGGER_BYTES

    leak = spawn([leaker_bin, "--leak-kib-per-s", "1024", "--chunk-kib", "256", "--touch", "0"])
    out = tmp_path / "hunt"
    r = run_cli("hunt", "--pid", leak.pid, "--duration", "25", "--out", out, timeout=300)
    assert r.returncode == 0, r.stderr
    reader = SessionReader(out)
    roll = reader.table("rollup")
    roll = roll[roll["pid"] == leak.pid]
    assert int(roll["rss"].max() - roll["rss"].min()) < GROWTH_TRIGGER_BYTES  # not the RSS trigger
    snaps = reader.table("ledger_snapshots")
    held = snaps[snaps["pid"] == leak.pid].groupby("t")["outstanding_bytes"].sum()
    assert held.iloc[-1] - held.iloc[0] >= LEDGER_TRIGGER_BYTES, held
    runs = reader.table("gdb_runs")
    assert leak.pid in set(runs["pid"]), (runs, r.stderr)
    samples = reader.table("gdb_samples")
    mine = samples[(samples["pid"] == leak.pid) & (samples["syscall"] == "mmap")]
    assert len(mine) >= 1, runs


@pytest.mark.bpf
@pytest.mark.nixl
@pytest.mark.skipif(os.geteuid() != 0, reason="BPF needs root")
@pytest.mark.skipif(not (REPO / ".cache/ucx-1.20.1/.complete").exists() or not UCX_LEAK_BIN.exists(),
                    reason="real UCX 1.20.1 target not built (tests/targets/setup_ucx.sh)")
def test_hunt_stops_gdb_on_the_growing_call_path(spawn, tmp_path):
    """Seed 002 as a hunt finds it: the ledger names the call site that grows (libucm's raw mmap, reached for
    UCX's own pool chunks from libucs), and gdb stops only on that path (a breakpoint at the site's own caller,
    past the hook every mapping of the process goes through), reading the symbols of that stack's libraries
    only. Its DWARF stacks join the culprit, the pause stays in budget, and no breakpoint is left behind."""
    env = {"UCX_NET_DEVICES": "lo", "UCX_MODULES": "^ib*,rdmacm",
           "LD_LIBRARY_PATH": str(REPO / ".cache/ucx-1.20.1/libucx/lib")}
    target = spawn([UCX_LEAK_BIN, "3000"], env=env)
    ucx_patches = patched_code(target.pid)  # UCX's own bistro hooks in libc
    out = tmp_path / "hunt"
    r = run_cli("hunt", "--pid", target.pid, "--duration", "16", "--interval", "1", "--out", out,
                "--format", "json", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "at its growing call site" in r.stderr, r.stderr[-3000:]
    reader = SessionReader(out)
    runs = reader.table("gdb_runs")
    run = runs[runs["pid"] == target.pid].iloc[0]
    assert run["samples"] >= 1, (run["reason"], [ln for ln in r.stderr.splitlines() if "gdb" in ln])
    budget = PauseBudget()
    assert run["paused_s"] <= budget.pause_fraction * max(run["t_end"] - run["t_start"], budget.floor_s), run
    assert run["symbols_s"] < 5.0 and run["state_after"] not in ("T", "t") and run["tracer_after"] == 0
    samples = reader.table("gdb_samples")
    mine = samples[(samples["pid"] == target.pid) & (samples["syscall"] == "mmap")]
    stacks = [json.loads(s) for s in mine["stack"]]
    # stopped past the hook, in libucs (not at libc's syscall), on the rcache's pool growth
    assert stacks and all(st[0].startswith("libucs.so.0!") for st in stacks), stacks[:2]
    assert any("ucs_mpool_grow" in f for f in stacks[0]) and any("ucm_event_dispatch" in f for f in stacks[0])
    ledger = reader.table("ledger_regions")
    held = ledger[(ledger["pid"] == target.pid) & (ledger["library"] == "libucm.so.0")]
    assert any(((held["start"] <= a) & (a < held["end"])).any() for a in mine["addr"]), "no sample in a held chunk"
    report = json.loads((out / "report.json").read_text())
    ucm = next(c for c in report["culprits"] if c["pid"] == target.pid and c["library"] == "libucm.so.0")
    assert any("gdb" in e and "DWARF" in e for e in ucm["evidence"]), ucm["evidence"]
    assert any("ucm_event_dispatch" in f for f in ucm["stack"]), ucm["stack"]
    assert patched_code(target.pid) == ucx_patches  # the breakpoint went with gdb
    assert tracer_of(target.pid) == 0 and proc_state(target.pid) not in (None, "T", "t")


def test_a_site_breakpoint_left_by_a_killed_gdb_is_taken_out(spawn, gdb_target_bin):
    """gdb killed outright while its call-site breakpoint is in the target: the int3 it leaves would kill the
    target at the next call; the driver puts the file's byte back. (The site is the return address of a call
    the target makes only at its start, main's pthread_create, so the target cannot meet the int3 first.)"""
    import threading

    from leaktrace.probes.bpf.stackscan import StackScanner
    from leaktrace.probes.bpf.symbolizer import MapEntry, Symbolizer

    target = spawn([gdb_target_bin, "--threads", "1", "--per-thread-per-s", "5", "--churn", "0"])
    sym = Symbolizer()
    sym.set_maps(target.pid, [MapEntry(m.start, m.end, m.offset, m.perms, m.path)
                              for m in procfs.read_maps(target.pid)])
    scan = StackScanner(sym)
    code = next(m for m in procfs.read_maps(target.pid) if m.path == str(gdb_target_bin) and "x" in m.perms)
    site = next(a for a in range(code.start + 5, code.end) if scan.is_return_address(target.pid, a)
                and sym.frame(target.pid, scan.call_target(target.pid, a) or 0).symbol == "pthread_create")
    killed: list[int] = []

    def on_records(records):
        if any(r.get("type") == "attached" for r in records):
            gdb_pid = tracer_of(target.pid)
            with open(f"/proc/{target.pid}/mem", "rb", 0) as mem:
                mem.seek(site)
                assert mem.read(1) == b"\xcc"  # gdb's breakpoint is in
            os.kill(gdb_pid, signal.SIGKILL)
            killed.append(gdb_pid)

    t = threading.Timer(60, lambda: None)  # bounded: sampling ends on its own at max_seconds
    t.start()
    try:
        run = sample_process(target.pid, max_samples=0, max_seconds=20, site={"address": site, "label": "mmap"},
                             libraries={HOOK_LIB}, on_records=on_records)
    finally:
        t.cancel()
    assert killed, run.reason
    assert "breakpoints gdb left were removed" in run.reason, run.reason
    assert_running_untraced(target.pid)
