"""The gdb stack sampler: full stacks at the mmap/munmap/mremap syscalls, bounded pause, always detaches.

gdb is started through pygdbmi and runs leaktrace's in-gdb program (gdb_scripts/sampler.py, gdb's own
Python: ~0.4 ms of pause per stop seen by the target, against ~1.5–4 ms when every stop is driven over MI;
bench/bench_gdb.py). The driver here only starts it, tails the JSON lines it writes, enforces the
deadline, and stops it.

Never harm the target:
- ``catch syscall`` in non-stop mode: no code is patched for sampling, and only the thread in the
  syscall stops. (gdb's own dynamic-linker event breakpoint, one byte in ld.so, exists while attached
  and goes at detach; the tests compare the target's code with its files after every end path.)
- A pause budget (default: stopped time ≤1% of the sampling time, counted over at least 30 s, so
  ≤300 ms at first, and ≤200 stops/s) ends sampling from inside gdb; every end path detaches (samples
  reached, time, budget, Ctrl-C/``stop()``, error, target exit). The first stack through large
  libraries costs gdb a one-off ~50–150 ms (unwind tables read lazily): the 30 s floor lets a process
  such as a vLLM worker give more than that one stack.
- What the budget does not see: under ``catch syscall`` the kernel stops a traced thread at *every*
  syscall (PTRACE_SYSCALL) and gdb resumes the non-matching ones itself, without running the
  sampler; a syscall-heavy target pays that for the whole window (``gdb_seconds``, 10 s by default).
  Rare call paths among frequent mmaps (seed 002's pool growth: one 148 KiB chunk per ~1,000 hooked
  munmaps) need a larger budget (``HuntOptions.extra["gdb_budget"]``) or the eBPF ledger.
- gdb runs in its own session (a Ctrl-C on the terminal reaches leaktrace only, which detaches
  cleanly). If leaktrace dies, even by SIGKILL, gdb reads EOF on its stdin, quits, and the sampler's
  ``gdb_exiting`` handler detaches first.
- After gdb is gone the driver checks /proc: a target left stopped (state T, no tracer) that was
  running before the attach gets SIGCONT.
- The attach stops the whole process briefly (``attach_s``, 0.1–0.2 s, torch loaded or not: symbols
  are read afterwards while it runs, ``symbols_s``); it is reported apart from the per-stop budget.
  The probe samples each process once per hunt.

Session tables written by :class:`GdbProbe`:

``gdb_samples`` — one row per recorded syscall exit:
    t (s since hunt start), pid, tid, run (index of the gdb_runs row), syscall ("mmap" | "mremap" |
    "munmap"), addr (mmap/mremap: the returned address; munmap: the address unmapped; 0 on error),
    length (bytes mapped / new length / bytes unmapped), old_addr, old_length (mremap only, else 0),
    result (raw return value, signed), error (errno, 0 on success), stop_us (time this stop spent in
    the in-gdb handler, µs), frames (JSON list, innermost first, of {pc, library, path, symbol, offset,
    file_offset, python?}: ``library`` is the mapped file's name from /proc/PID/maps, so stripped
    frames still have one; ``symbol``/``offset`` when gdb knows them (debug info or ELF symbols);
    ``file_offset`` the pc as an offset in that file; ``python`` the Python frames run by a
    _PyEval_EvalFrameDefault frame, as [{func, file, line}]), stack (JSON list of
    "libfoo.so!func+0x12" strings, the same frames formatted), python (bool: Python frames present).

``gdb_runs`` — one row per attach:
    t_start, t_end, pid, run, stops (catchpoint stops, 2 per syscall), samples (mmap/mremap
    recorded), paused_s (time stopped in handlers + a per-stop allowance for gdb's own work),
    handler_s, attach_s (whole-process stop during the attach), symbols_s (reading symbols afterwards,
    target running), threads, reason (why it ended:
    "samples", "time", "budget: …", "stopped", "interrupted", "target exited", "attach failed: …"),
    python (Python-frame support: "ok: …", "n/a: …", "unavailable: why"), state_after (/proc state
    letter after detach), tracer_after (TracerPid after), sigcont (bool: we had to resume it).
"""

from __future__ import annotations

import json
import os
import platform
import queue
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leaktrace import resources
from leaktrace.errors import GdbUnavailable, NoSuchProcess

# The installed copy or the checkout's (leaktrace/resources.py). Never fails at import: when absent,
# gdb_doctor_checks reports it and preflight stops the hunt with its remedy.
SCRIPTS_DIR = resources.GDB_SCRIPTS.located()
SAMPLER_SCRIPT = SCRIPTS_DIR / "sampler.py"
SEED002_SCRIPT = SCRIPTS_DIR / "seed002_syscall_mmap.gdb"

# The only MI commands the driver sends; everything else lives in gdb_scripts/.
MI_ASYNC_ON = "-gdb-set mi-async on"
MI_RUN_SAMPLER = '-interpreter-exec console "leaktrace-sample {config}"'
MI_STOP_SAMPLER = '-interpreter-exec console "leaktrace-stop {reason}"'
MI_EXIT = "-gdb-exit"

DEFAULT_SAMPLES_ON_GROWTH = 20  # --gdb-samples unset: this many per process, once it grows
DEFAULT_SECONDS_PER_PROCESS = 10.0
GROWTH_TRIGGER_BYTES = 8 << 20  # RSS above its first reading by this much → worth a few stacks
CAP_SYS_PTRACE = 19


@dataclass
class PauseBudget:
    """Limits on how much the sampler may stop the target. ``pause_fraction`` of the elapsed sampling
    time (counted over at least ``floor_s``), and ``max_stops_per_s`` over any second."""

    pause_fraction: float = 0.01
    floor_s: float = 30.0
    max_stops_per_s: float = 200.0
    # gdb's own work per stop outside the handler (ptrace, waitpid, frame cache): bench_gdb measures the
    # pause seen by the target at ~1.5–2× the handler time; this allowance keeps the budget honest.
    per_stop_overhead_us: float = 150.0


@dataclass
class GdbRun:
    pid: int
    reason: str = ""
    stops: int = 0
    samples: int = 0
    paused_s: float = 0.0
    handler_s: float = 0.0
    attach_s: float = 0.0
    symbols_s: float = 0.0
    threads: int = 0
    python: str = ""
    state_after: str | None = None
    tracer_after: int | None = None
    sigcont: bool = False
    t_start_mono: float = 0.0
    t_end_mono: float = 0.0
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def sample_records(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("type") == "sample"]


# ----------------------------------------------------------------------------- checks

def find_gdb() -> str | None:
    return os.environ.get("LEAKTRACE_GDB") or shutil.which("gdb")


def _read_first_line(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.readline().strip()
    except OSError:
        return None


def has_cap_sys_ptrace() -> bool:
    for line in (Path("/proc/self/status").read_text().splitlines()):
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    return False


def tracer_of(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("TracerPid:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def gdb_environment() -> dict[str, str]:
    # gdb embeds the system Python: leaktrace's venv settings must not leak into it.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONPATH", "PYTHONSTARTUP")}
    env["LC_ALL"] = "C"
    return env


def gdb_doctor_checks() -> list[dict[str, Any]]:
    """gdb present, its version, Python support, ptrace permission. Each: name, ok, detail, fix."""
    checks: list[dict[str, Any]] = []
    gdb = find_gdb()
    checks.append({"name": "gdb", "ok": gdb is not None, "detail": gdb or "gdb not found on PATH",
                   "fix": "" if gdb else "apt-get install gdb"})
    if gdb:
        try:
            out = subprocess.run([gdb, "-nx", "-batch", "-ex", "show version", "-ex",
                                  "python import sys; print('python', sys.version.split()[0])"],
                                 capture_output=True, text=True, timeout=20, env=gdb_environment())
            first = out.stdout.splitlines()[0] if out.stdout else out.stderr.strip()[:120]
            m = re.search(r"(\d+)\.(\d+)", first)
            major = int(m.group(1)) if m else 0
            checks.append({"name": "gdb version", "ok": major >= 12, "detail": first,
                           "fix": "" if major >= 12 else "the sampler needs gdb ≥ 12 (gdb.format_address, "
                                                         "gdb_exiting): upgrade gdb"})
            py = re.search(r"^python (\S+)", out.stdout, re.M)
            checks.append({"name": "gdb python", "ok": py is not None,
                           "detail": f"gdb's Python {py.group(1)}" if py else "gdb was built without Python",
                           "fix": "" if py else "install a gdb built with Python (Debian's gdb package is)"})
        except (OSError, subprocess.TimeoutExpired) as e:
            checks.append({"name": "gdb version", "ok": False, "detail": f"gdb did not run: {e}",
                           "fix": "reinstall gdb"})
    checks.append(resources.GDB_SCRIPTS.doctor_check("gdb sampler script", SAMPLER_SCRIPT))
    scope = _read_first_line("/proc/sys/kernel/yama/ptrace_scope")
    privileged = os.geteuid() == 0 or has_cap_sys_ptrace()
    if scope is None:
        ok, detail = True, "no Yama LSM: classic ptrace permissions (same uid, or CAP_SYS_PTRACE)"
    elif scope == "3":
        ok, detail = False, "kernel.yama.ptrace_scope=3: no process may attach"
    elif scope in ("1", "2") and not privileged:
        ok, detail = False, f"kernel.yama.ptrace_scope={scope} and no CAP_SYS_PTRACE: cannot attach"
    else:
        ok, detail = True, f"kernel.yama.ptrace_scope={scope}" + (" (privileged)" if privileged else "")
    checks.append({"name": "ptrace", "ok": ok, "detail": detail,
                   "fix": "" if ok else "run as root / with CAP_SYS_PTRACE, or sysctl kernel.yama.ptrace_scope=1 "
                                        "(3 needs a reboot)"})
    return checks


def preflight(pids: list[int]) -> None:
    """Raise GdbUnavailable with one line when gdb cannot sample these processes."""
    if platform.machine() != "x86_64":
        raise GdbUnavailable(f"gdb sampler supports x86-64 only (this is {platform.machine()})",
                             "pass --gdb-samples 0 or --no-gdb")
    for check in gdb_doctor_checks():
        if not check["ok"]:
            raise GdbUnavailable(f"gdb sampler unavailable: {check['detail']}",
                                 f"{check['fix']}; or pass --gdb-samples 0 or --no-gdb")
    privileged = os.geteuid() == 0 or has_cap_sys_ptrace()
    for pid in pids:
        tracer = tracer_of(pid)
        if tracer:
            raise GdbUnavailable(f"ptrace not permitted: pid {pid} is already traced by pid {tracer}",
                                 "detach the other debugger/tracer, or pass --gdb-samples 0 or --no-gdb")
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue
        if not privileged and uid != os.geteuid():
            raise GdbUnavailable(f"ptrace not permitted: pid {pid} belongs to uid {uid}",
                                 "run as root or with CAP_SYS_PTRACE, or pass --gdb-samples 0 or --no-gdb")


# ----------------------------------------------------------------------------- one attach

def _gdb_controller_class():
    from pygdbmi.gdbcontroller import GdbController

    class SessionGdbController(GdbController):
        """gdb in its own session: a terminal Ctrl-C goes to leaktrace, which detaches in order,
        instead of reaching gdb in the middle of a stop."""

        def spawn_new_gdb_subprocess(self) -> int:
            from pygdbmi.IoManager import IoManager

            self.gdb_process = subprocess.Popen(self.command, shell=False, stdout=subprocess.PIPE,
                                                stdin=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
                                                start_new_session=True, env=gdb_environment())
            self.io_manager = IoManager(self.gdb_process.stdin, self.gdb_process.stdout,
                                        self.gdb_process.stderr, self.time_to_check_for_additional_output_sec)
            return self.gdb_process.pid

    return SessionGdbController


class GdbAttach:
    """One gdb process sampling one pid. ``start()`` attaches (raises on failure), ``poll()`` returns
    new records, ``stop()`` detaches and waits for gdb to go. Use :func:`sample_process` for the loop."""

    def __init__(self, pid: int, max_samples: int = 0, max_seconds: float = 0.0,
                 budget: PauseBudget | None = None, workdir: str | None = None, gdb: str | None = None,
                 max_frames: int = 64, stacks_on_munmap: bool = True) -> None:
        self.pid = pid
        self.gdb = gdb or find_gdb()
        if not self.gdb:
            raise GdbUnavailable("gdb not found on PATH")
        self.budget = budget or PauseBudget()
        self._tmp = tempfile.TemporaryDirectory(prefix="leaktrace-gdb-", dir=workdir)
        self.out_path = Path(self._tmp.name) / f"samples-{pid}.jsonl"
        self.config_path = Path(self._tmp.name) / f"config-{pid}.json"
        self.config = {"pid": pid, "out": str(self.out_path), "max_samples": max_samples,
                       "max_seconds": max_seconds, "pause_fraction": self.budget.pause_fraction,
                       "budget_floor_s": self.budget.floor_s, "max_stops_per_s": self.budget.max_stops_per_s,
                       "per_stop_overhead_us": self.budget.per_stop_overhead_us, "max_frames": max_frames,
                       "stacks_on_munmap": stacks_on_munmap}
        self.controller = None
        self.run = GdbRun(pid=pid)
        self._offset = 0
        self._partial = b""
        self.state_before: str | None = None
        self.mi_errors: list[str] = []

    @property
    def gdb_pid(self) -> int | None:
        return self.controller.gdb_process.pid if self.controller and self.controller.gdb_process else None

    def start(self) -> None:
        self.state_before = proc_state(self.pid)
        if self.state_before is None:
            raise NoSuchProcess(self.pid)
        self.config_path.write_text(json.dumps(self.config))
        controller_cls = _gdb_controller_class()
        self.controller = controller_cls(command=[self.gdb, "--nx", "--quiet", "--interpreter=mi3",
                                                  "-x", str(SAMPLER_SCRIPT)])
        self._mi(MI_ASYNC_ON, timeout=20)
        self.run.t_start_mono = time.monotonic()
        error = self._mi(MI_RUN_SAMPLER.format(config=self.config_path), timeout=120)
        self.poll()
        if error:
            self.close()
            if proc_state(self.pid) is None:
                raise NoSuchProcess(self.pid, f"process {self.pid} exited before gdb attached")
            if "not permitted" in error or "already traced" in error:
                raise GdbUnavailable(f"ptrace not permitted on pid {self.pid}: {_one_line(error)}")
            raise GdbUnavailable(f"gdb could not attach to pid {self.pid}: {_one_line(error)}",
                                 "see `leaktrace doctor`, or pass --gdb-samples 0 or --no-gdb")

    def _mi(self, command: str, timeout: float) -> str | None:
        """Send one MI command and wait for its result record; returns the error message, if any.
        Async records read meanwhile are dropped (the samples travel through the JSON-lines file)."""
        assert self.controller is not None
        self.controller.write(command, read_response=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for r in self.controller.get_gdb_response(timeout_sec=0.2, raise_error_on_timeout=False):
                if r.get("type") == "result":
                    if r.get("message") == "error":
                        msg = (r.get("payload") or {}).get("msg", "error")
                        self.mi_errors.append(msg)
                        return msg
                    return None
            if self.controller.gdb_process.poll() is not None:
                return f"gdb exited with status {self.controller.gdb_process.returncode}"
        return f"gdb did not answer {command.split()[0]} within {timeout:.0f} s"

    def drain(self) -> None:
        """Read gdb's MI output so its pipe never fills (a full pipe would block gdb mid-stop)."""
        if self.controller and self.controller.gdb_process and self.controller.gdb_process.poll() is None:
            try:
                self.controller.get_gdb_response(timeout_sec=0.0, raise_error_on_timeout=False)
            except (OSError, ValueError):
                pass

    def poll(self) -> list[dict[str, Any]]:
        self.drain()
        try:
            with open(self.out_path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        new = []
        for line in lines:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            new.append(rec)
            self._absorb(rec)
        self.run.records.extend(new)
        return new

    def _absorb(self, rec: dict[str, Any]) -> None:
        kind = rec.get("type")
        if kind == "attached":
            self.run.attach_s = float(rec.get("attach_s", 0.0))
            self.run.symbols_s = float(rec.get("symbols_s", 0.0))
            self.run.threads = int(rec.get("threads", 0))
            self.run.python = rec.get("python", "")
        elif kind == "end":
            self.run.reason = rec.get("reason", "")
            self.run.stops = int(rec.get("stops", 0))
            self.run.samples = int(rec.get("samples", 0))
            self.run.paused_s = float(rec.get("paused_s", 0.0))
            self.run.handler_s = float(rec.get("handler_s", 0.0))
            self.run.sigcont = bool(rec.get("sigcont", False))
            self.run.t_end_mono = float(rec.get("t_mono", time.monotonic()))

    @property
    def ended(self) -> bool:
        return any(r.get("type") == "end" for r in self.run.records[-1:])

    def stop(self, reason: str = "stopped") -> GdbRun:
        """Detach (if still attached), let gdb exit, make sure the target runs. Idempotent."""
        if self.controller is not None and self.controller.gdb_process is not None:
            if self.controller.gdb_process.poll() is None and not self.ended:
                safe_reason = re.sub(r"[^\w .:()-]", "", reason)[:80]
                self._mi(MI_STOP_SAMPLER.format(reason=safe_reason), timeout=20)
            self.poll()
        self.close()
        self.poll()
        if not self.run.reason:
            self.run.reason = reason if self.controller is None else f"{reason} (gdb ended without a report)"
        if not self.run.t_end_mono:
            self.run.t_end_mono = time.monotonic()
        self._ensure_running()
        return self.run

    def close(self) -> None:
        """Let gdb exit: MI -gdb-exit (gdb detaches what it still holds), then SIGTERM, then SIGKILL."""
        c = self.controller
        if c is None or c.gdb_process is None:
            return
        proc = c.gdb_process
        if proc.poll() is None:
            try:
                c.write(MI_EXIT, read_response=False)
            except Exception:  # noqa: BLE001 - a dead pipe: go on to signals
                pass
            for sig, wait in ((None, 5.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                if sig is not None and proc.poll() is None:
                    proc.send_signal(sig)
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass
        c.gdb_process = None

    def _ensure_running(self, watch_s: float = 0.3) -> None:
        """A SIGSTOP gdb queued (attach, interrupt, detach in non-stop mode) can be delivered just after
        the detach and leave the whole process group-stopped with no tracer to resume it (seen when
        gdb quits right after an attach). Watch briefly, and resume what we stopped."""
        deadline = time.monotonic() + watch_s
        while True:
            state = proc_state(self.pid)
            tracer = tracer_of(self.pid) if state else None
            if state == "T" and not tracer and self.state_before not in ("T", "t"):
                try:
                    os.kill(self.pid, signal.SIGCONT)
                    self.run.sigcont = True
                except OSError:
                    pass
            if state is None or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        if self.run.sigcont:
            state = proc_state(self.pid)
            tracer = tracer_of(self.pid) if state else None
        self.run.state_after = state
        self.run.tracer_after = tracer

    def cleanup(self) -> None:
        self._tmp.cleanup()


def _one_line(text: str) -> str:
    return " ".join(text.split())[:200]


def sample_process(pid: int, max_samples: int = 20, max_seconds: float = 10.0, budget: PauseBudget | None = None,
                   stop_event: threading.Event | None = None, on_records=None, **kwargs: Any) -> GdbRun:
    """Attach to ``pid``, sample until ``max_samples`` mmap/mremap stacks, ``max_seconds``, the pause
    budget, ``stop_event`` or the target's exit, then detach. ``on_records(list)`` sees records as
    they come. Raises GdbUnavailable / NoSuchProcess when the attach fails."""
    attach = GdbAttach(pid, max_samples=max_samples, max_seconds=max_seconds, budget=budget, **kwargs)
    reason = "time"
    try:
        attach.start()
        if on_records:
            on_records(attach.run.records[:])
        deadline = time.monotonic() + max_seconds if max_seconds else None
        while not attach.ended:
            if stop_event is not None and stop_event.wait(0.05):
                reason = "stopped"
                break
            if stop_event is None:
                time.sleep(0.05)
            new = attach.poll()
            if new and on_records:
                on_records(new)
            if deadline is not None and time.monotonic() > deadline + 1.0:
                reason = "time"  # the in-gdb deadline is checked at stops only: a quiet target ends here
                break
            if proc_state(pid) is None:
                reason = "target exited"
                break
            if attach.controller and attach.controller.gdb_process and attach.controller.gdb_process.poll() is not None:
                reason = "gdb exited"
                break
    except KeyboardInterrupt:
        reason = "interrupted"
        raise
    finally:
        seen = len(attach.run.records)
        attach.stop(reason)
        if on_records and len(attach.run.records) > seen:
            on_records(attach.run.records[seen:])
        attach.cleanup()
    return attach.run


# ----------------------------------------------------------------------------- rows

def frame_string(frame: dict[str, Any]) -> str:
    """'libfoo.so!func+0x12', or 'libfoo.so+0x1138' (offset in the file) when the symbol is unknown."""
    lib = frame.get("library") or "?"
    sym = frame.get("symbol")
    if sym:
        off = frame.get("offset")
        return f"{lib}!{sym}+{off:#x}" if off else f"{lib}!{sym}"
    if frame.get("file_offset") is not None:
        return f"{lib}+{frame['file_offset']:#x}"
    return f"{lib}!{frame.get('pc', 0):#x}"


def stack_strings(frames: list[dict[str, Any]]) -> list[str]:
    out = []
    for fr in frames:
        out.append(frame_string(fr))
        for py in fr.get("python") or []:
            if "error" in py:
                out.append(f"python!<{py['error']}>")
            else:
                out.append(f"python!{py.get('func')} ({py.get('file')}:{py.get('line')})")
    return out


def sample_row(rec: dict[str, Any], t: float, run: int) -> dict[str, Any]:
    frames = rec.get("frames") or []
    result = int(rec.get("result") or 0)
    if result >= 1 << 63:
        result -= 1 << 64
    return {"t": t, "pid": int(rec["pid"]), "tid": int(rec.get("tid") or 0), "run": run,
            "syscall": rec.get("syscall", ""), "addr": int(rec.get("addr") or 0),
            "length": int(rec.get("length") or 0), "old_addr": int(rec.get("old_addr") or 0),
            "old_length": int(rec.get("old_length") or 0), "result": result,
            "error": int(rec.get("error") or 0), "stop_us": float(rec.get("stop_us") or 0.0),
            "frames": json.dumps(frames, separators=(",", ":")),
            "stack": json.dumps(stack_strings(frames)), "python": any("python" in f for f in frames)}


def run_row(run: GdbRun, index: int, t_of) -> dict[str, Any]:
    return {"t_start": t_of(run.t_start_mono) if run.t_start_mono else 0.0,
            "t_end": t_of(run.t_end_mono) if run.t_end_mono else 0.0, "pid": run.pid, "run": index,
            "stops": run.stops, "samples": run.samples, "paused_s": run.paused_s, "handler_s": run.handler_s,
            "attach_s": run.attach_s, "symbols_s": run.symbols_s, "threads": run.threads, "reason": run.reason, "python": run.python,
            "state_after": run.state_after or "", "tracer_after": int(run.tracer_after or 0),
            "sigcont": run.sigcont}


# ----------------------------------------------------------------------------- the probe

class GdbProbe:
    """Samples each process of the target tree in turn, in a background thread.

    ``--gdb-samples N`` (N>0): every live process once, N mmap/mremap stacks each (or 10 s, or the
    budget). Unset: only processes whose RSS or anonymous memory grew by ``GROWTH_TRIGGER_BYTES`` since
    first seen (the watcher's figures), ``DEFAULT_SAMPLES_ON_GROWTH`` stacks each, once. gdb unusable (missing, no
    Python, ptrace refused, target already traced) stops the hunt with one line (``GdbUnavailable``,
    exit code 6) unless the user turned gdb off (``--gdb-samples 0`` / ``--no-gdb``)."""

    name = "gdb"
    required = True  # asked-for gdb that cannot work is an error the user must see, not a warning

    def __init__(self, options: Any = None) -> None:
        self.options = options
        n = getattr(options, "gdb_samples", None)
        extra = getattr(options, "extra", None) or {}
        self.on_growth_only = n is None
        self.samples_per_process = DEFAULT_SAMPLES_ON_GROWTH if n is None else int(n)
        self.seconds_per_process = float(extra.get("gdb_seconds", DEFAULT_SECONDS_PER_PROCESS))
        self.budget = PauseBudget(**extra.get("gdb_budget", {}))
        self.ctx = None
        self._queue: queue.Queue[int] = queue.Queue()
        self._queued: set[int] = set()
        self._first_seen: dict[tuple[int, str], int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._runs: list[GdbRun] = []
        self._failures: list[str] = []
        self._lock = threading.Lock()

    def start(self, ctx: Any) -> None:
        self.ctx = ctx
        preflight(ctx.targets.live())
        self._thread = threading.Thread(target=self._loop, name="gdb-sampler", daemon=True)
        self._thread.start()
        self._enqueue_due()

    def tick(self, now: float) -> None:
        self._enqueue_due()

    def _enqueue_due(self) -> None:
        live = self.ctx.targets.live()
        if self.on_growth_only:
            rollup = self.ctx.live.get("rollup") or {}
            rss = dict(self.ctx.live.get("watcher") or {})
            for pid in live:
                figures = rollup.get(pid) or {"rss": rss.get(pid)}
                for key in ("rss", "anon"):
                    value = figures.get(key)
                    if value is None:
                        continue
                    first = self._first_seen.setdefault((pid, key), value)
                    if value - first >= GROWTH_TRIGGER_BYTES:
                        self._enqueue(pid)
        else:
            for pid in live:
                self._enqueue(pid)

    def _enqueue(self, pid: int) -> None:
        if pid in self._queued or pid == os.getpid():
            return
        self._queued.add(pid)
        self._queue.put(pid)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                pid = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if self._stop.is_set():
                break
            self._sample(pid)

    def _sample(self, pid: int) -> None:
        session = self.ctx.session
        t0_mono = session.meta["t0_monotonic"]
        index = len(self._runs)

        def t_of(mono: float) -> float:
            return mono - t0_mono

        def on_records(records: list[dict[str, Any]]) -> None:
            rows = [sample_row(r, t_of(r.get("t_mono", time.monotonic())), index)
                    for r in records if r.get("type") == "sample"]
            session.append("gdb_samples", rows)

        self.ctx.log(f"gdb: sampling pid {pid} (up to {self.samples_per_process} stacks, "
                     f"{self.seconds_per_process:.0f} s)")
        try:
            # gdb's config and JSON lines live in the session directory: removed after each run, left
            # there (with gdb's own end record) if leaktrace is killed mid-sampling.
            workdir = session.path / "gdb"
            workdir.mkdir(exist_ok=True)
            run = sample_process(pid, self.samples_per_process, self.seconds_per_process, self.budget,
                                 stop_event=self._stop, on_records=on_records, workdir=str(workdir))
        except NoSuchProcess:
            return
        except GdbUnavailable as e:
            self._failures.append(str(e))
            self.ctx.warn(f"gdb: {e}")
            run = GdbRun(pid=pid, reason=f"attach failed: {e.message}", t_start_mono=time.monotonic(),
                         t_end_mono=time.monotonic())
        with self._lock:
            self._runs.append(run)
        session.append("gdb_runs", run_row(run, index, t_of))
        self.ctx.live["gdb"] = {"runs": len(self._runs), "samples": sum(r.samples for r in self._runs),
                                "paused_s": sum(r.paused_s + r.attach_s for r in self._runs)}
        self.ctx.log(f"gdb: pid {pid} done: {run.samples} stacks, {run.stops} stops, "
                     f"paused {run.paused_s * 1000:.1f} ms + attach {run.attach_s * 1000:.0f} ms ({run.reason})")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def summary(self) -> dict[str, Any]:
        with self._lock:
            runs = list(self._runs)
        return {"runs": len(runs), "samples": sum(r.samples for r in runs),
                "stops": sum(r.stops for r in runs), "paused_s": sum(r.paused_s for r in runs),
                "attach_s": sum(r.attach_s for r in runs), "reasons": [r.reason for r in runs],
                "python": sorted({r.python for r in runs if r.python}), "failures": self._failures}
