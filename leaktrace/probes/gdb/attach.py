"""One gdb attach: start gdb, run the in-gdb sampler on one process, tail its records, always detach.

gdb is started through pygdbmi and runs leaktrace's in-gdb program (gdb_scripts/sampler.py, gdb's own
Python: ~0.4 ms of pause per stop seen by the target, against ~1.5–4 ms when every stop is driven over MI;
bench/bench_gdb.py). The driver only starts it, tails the JSON lines it writes, enforces the deadline, stops it.

Never harm the target:
- ``catch syscall`` in non-stop mode: no code is patched for sampling (a site's breakpoint is deleted before
  every detach), only the stopped thread waits. (gdb's own dynamic-linker event breakpoint, in ld.so, goes
  at detach; the tests compare the target's code with its files after every end path.)
- A pause budget (default: stopped time ≤1% of the sampling time, counted over at least 30 s, so
  ≤300 ms at first, and ≤200 stops/s) ends sampling from inside gdb; every end path detaches (samples
  reached, time, budget, Ctrl-C/``stop()``, error, target exit). The first stack through large
  libraries costs gdb a one-off ~50–150 ms (unwind tables read lazily): the 30 s floor lets a process
  such as a vLLM worker give more than that one stack.
- What the budget does not see: under ``catch syscall`` the kernel stops a traced thread at *every*
  syscall (PTRACE_SYSCALL) and gdb resumes the non-matching ones itself; a syscall-heavy target pays that
  for the whole window (``gdb_seconds``). Rare call paths among frequent mmaps (seed 002's pool growth)
  are caught at their call site instead (``site``: a breakpoint where the eBPF ledger saw growth).
- gdb runs in its own session (a Ctrl-C on the terminal reaches leaktrace only, which detaches
  cleanly). If leaktrace dies, even by SIGKILL, gdb reads EOF on its stdin, quits, and the sampler's
  ``gdb_exiting`` handler detaches first.
- After gdb is gone the driver checks /proc: a target left stopped (state T, no tracer) that was
  running before the attach gets SIGCONT.
- The symbols are read before the attach (``symbols_s``: ``add-symbol-file`` of each library the target
  maps, at the load bias read here from /proc/PID/maps), never while attached: gdb's event loop does not
  run during a command, and a thread of the target that meets a ptrace event meanwhile (created, signalled)
  stays stopped until the command ends (read while attached, a loaded vLLM worker's 50-70 s symbol read
  stops its traffic for 20-35 s). A stop during the read kills gdb, which holds nothing of the target yet.
- The attach stops the whole process briefly (``attach_s``, 0.1–0.2 s, torch loaded or not); it is
  reported apart from the per-stop budget. Sampling begins by a second command, once /proc shows no
  thread of the target in a ptrace stop: gdb resumes the threads whose attach stops it sees from its
  event loop. The probe samples each process once per hunt.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from leaktrace import procfs
from leaktrace.errors import GdbUnavailable, LeaktraceError, NoSuchProcess
from leaktrace.probes.gdb.budget import GdbRun, PauseBudget
from leaktrace.probes.gdb.checks import SAMPLER_SCRIPT, find_gdb, gdb_environment, proc_state, tracer_of
from leaktrace.probes.gdb.sitecheck import restore_breakpoints
from leaktrace.probes.gdb.symbolfiles import SYMBOLS_TIMEOUT_S, site_symbol_files, symbol_files, symbols_niced
from leaktrace.probes.pyheap.frames import PYFRAMES_MODULE, frames_config
from leaktrace.sched import helper_group

# The only MI commands the driver sends; everything else lives in gdb_scripts/.
MI_ASYNC_ON = "-gdb-set mi-async on"
MI_LOAD_SYMBOLS = '-interpreter-exec console "leaktrace-symbols {config}"'
MI_RUN_SAMPLER = '-interpreter-exec console "leaktrace-sample {config}"'
MI_BEGIN_SAMPLER = '-interpreter-exec console "leaktrace-begin"'
MI_STOP_SAMPLER = '-interpreter-exec console "leaktrace-stop {reason}"'
MI_EXIT = "-gdb-exit"


def _gdb_controller_class():
    from pygdbmi.gdbcontroller import GdbController

    class SessionGdbController(GdbController):
        """gdb in its own session: a terminal Ctrl-C goes to leaktrace, which detaches in order."""

        def spawn_new_gdb_subprocess(self) -> int:
            from pygdbmi.IoManager import IoManager

            self.gdb_process = subprocess.Popen(self.command, shell=False, stdout=subprocess.PIPE,
                                                stdin=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
                                                start_new_session=True, env=gdb_environment())
            helper_group(self.gdb_process.pid, 0)  # raised once its symbols are read
            self.io_manager = IoManager(self.gdb_process.stdin, self.gdb_process.stdout,
                                        self.gdb_process.stderr, self.time_to_check_for_additional_output_sec)
            return self.gdb_process.pid

    return SessionGdbController


CANCELLED = "stopped while gdb read the symbols (before the attach)"


class GdbAttach:
    """One gdb process sampling one pid. ``start()`` attaches (raises on failure), ``poll()`` returns
    new records, ``stop()`` detaches and waits for gdb to go. Use :func:`sample_process` for the loop."""

    def __init__(self, pid: int, max_samples: int = 0, max_seconds: float = 0.0,
                 budget: PauseBudget | None = None, workdir: str | None = None, gdb: str | None = None,
                 max_frames: int = 64, stacks_on_munmap: bool = True,
                 cancel: threading.Event | None = None, site: dict[str, Any] | None = None,
                 libraries: set[str] | None = None) -> None:
        self.pid = pid
        self.cancel = cancel  # set: give up the symbol read (not attached then: gdb is simply killed)
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
                       "stacks_on_munmap": stacks_on_munmap, "site": site}
        self.libraries = libraries  # only these files' symbols (a site's stack names them; torch's all: a minute)
        self.controller = None
        self.run = GdbRun(pid=pid, site=int((site or {}).get("address") or 0))
        self._offset = 0
        self._partial = b""
        self.state_before: str | None = None
        self.mi_errors: list[str] = []

    def start(self) -> None:
        self.state_before = proc_state(self.pid)
        if self.state_before is None:
            raise NoSuchProcess(self.pid)
        files = symbol_files(self.pid) if self.libraries is None else site_symbol_files(self.pid, self.libraries)
        # Where the interpreter's frames are (read at each stop from its memory): found now, not attached.
        python_frames = {**frames_config(self.pid), "module": PYFRAMES_MODULE}
        self.config_path.write_text(json.dumps({**self.config, "symbol_files": files,
                                                "python_frames": python_frames}))
        controller_cls = _gdb_controller_class()
        self.controller = controller_cls(command=[self.gdb, "--nx", "--quiet", "--interpreter=mi3",
                                                  "-x", str(SAMPLER_SCRIPT)])
        self._mi(MI_ASYNC_ON, timeout=20)
        self.run.t_start_mono = time.monotonic()
        with symbols_niced(self.controller.gdb_process.pid):
            error = self._mi(MI_LOAD_SYMBOLS.format(config=self.config_path), timeout=SYMBOLS_TIMEOUT_S,
                             cancel=self.cancel)
        if error == CANCELLED:
            self.controller.gdb_process.kill()  # attached to nothing: no detach owed
            self.close()
            self.run.reason = CANCELLED
            return
        if error is None:
            error = self._mi(MI_RUN_SAMPLER.format(config=self.config_path), timeout=120)
        if not error:
            self._wait_threads_running()
            error = self._mi(MI_BEGIN_SAMPLER, timeout=120)
        self.poll()
        if error:
            self.close()
            if proc_state(self.pid) is None:
                raise NoSuchProcess(self.pid, f"process {self.pid} exited before gdb attached")
            if "not permitted" in error or "already traced" in error:
                raise GdbUnavailable(f"ptrace not permitted on pid {self.pid}: {_one_line(error)}")
            raise GdbUnavailable(f"gdb could not attach to pid {self.pid}: {_one_line(error)}",
                                 "see `leaktrace doctor`, or pass --gdb-samples 0 or --no-gdb")

    def _wait_threads_running(self, timeout: float = 5.0) -> None:
        """Until no thread of the target is in a ptrace stop (state ``t``): gdb resumes each as its
        attach stop comes in. Bounded: a thread stopped for another reason must not hold the attach."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if "t" not in procfs.read_task_states(self.pid).values():
                    return
            except LeaktraceError:
                return  # gone or unreadable: the next command says so
            time.sleep(0.01)

    def _mi(self, command: str, timeout: float, cancel: threading.Event | None = None) -> str | None:
        """Send one MI command and wait for its result record; returns the error message, if any.
        Async records read meanwhile are dropped (the samples travel through the JSON-lines file)."""
        assert self.controller is not None
        self.controller.write(command, read_response=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cancel is not None and cancel.is_set():
                return CANCELLED
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
        if (self.run.site or "without a report" in self.run.reason) and restore_breakpoints(self.pid, self.run.site):
            self.run.reason += " (breakpoints gdb left were removed)"
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
            except Exception:  # a dead pipe: go on to signals
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
    """Attach to ``pid``, sample until ``max_samples`` mmap/mremap stacks (with ``site={"address", "label"}``:
    stacks at that call site), ``max_seconds``, the pause budget, ``stop_event`` or the target's exit, then
    detach. ``on_records(list)`` sees records as
    they come. Raises GdbUnavailable / NoSuchProcess when the attach fails."""
    attach = GdbAttach(pid, max_samples=max_samples, max_seconds=max_seconds, budget=budget, cancel=stop_event,
                       **kwargs)
    reason = "time"
    try:
        attach.start()
        if attach.run.reason == CANCELLED:
            return attach.run
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
