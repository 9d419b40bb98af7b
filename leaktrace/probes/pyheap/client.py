"""The pyheap probe's walker process, seen from the hunt: starts ``python -m leaktrace.probes.pyheap.worker
--worker`` and asks it for walks (one JSON line each way)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from leaktrace.errors import LeaktraceError, ProcessGone
from leaktrace.probes.pyheap.walk import CANCEL_SIGNAL
from leaktrace.sched import helper_group

if TYPE_CHECKING:
    from leaktrace.probes.pyheap.interpreter import Interpreter


class WalkerGone(LeaktraceError):
    """The walker process did not answer (did not start, died, or ran past its time)."""


class WalkerProcess:
    """The walks, run out of the hunt's interpreter: ``python -m leaktrace.probes.pyheap.worker --worker``
    (see that module). A walk is seconds of Python on a vLLM process under load; in a thread of the hunt
    it would hold the GIL against the tick thread and the eBPF ring's consumer (ticks 10-49 s late, the ring
    overflowing). Here the hunt's thread only waits on a pipe (no GIL held), the worker runs niced, dies
    with the thread that started it (PR_SET_PDEATHSIG) and at :meth:`close`, and keeps each target's frozen
    set walk between walks. One request at a time (the caller's lock); an answer that comes too late is
    dropped by its id."""

    READY_S = 20.0  # the worker's start (an interpreter and leaktrace's imports), on a loaded machine
    SLACK_S = 10.0  # beyond a walk's budget: naming the types, writing the answer, a busy CPU

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self._buf = bytearray()
        self._ready = False
        self._next_id = 0
        self._answered = 0  # the id of the last answer read: below _next_id, a walk is under way
        self.lock = threading.Lock()
        self.starts = 0
        self.dropped: dict[str, Any] | None = None  # the last answer that came after it was given up on
        self.spawned_in: threading.Thread | None = None

    def spawn(self) -> None:
        """Start the worker (not waiting for it: the first request does)."""
        self.close()
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.pop("PYTHONSTARTUP", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "leaktrace.probes.pyheap.worker", "--worker", str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, close_fds=True,
            start_new_session=True)
        helper_group(self.proc.pid, 0)  # a walk is heavy: never at the hunt's raised weight
        self._buf.clear()
        self._ready = False
        self._answered = self._next_id
        self.starts += 1
        self.spawned_in = threading.current_thread()  # its PR_SET_PDEATHSIG fires when this thread ends

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _line(self, deadline: float, stop: threading.Event | None = None) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or (stop is not None and stop.is_set()):
                raise WalkerGone("the walker process did not answer in time")
            r, _, _ = select.select([fd], [], [], min(left, 0.2))
            if r:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise WalkerGone(f"the walker process ended (exit code {self.proc.poll()})")
                self._buf += chunk
        i = self._buf.index(b"\n")
        line = bytes(self._buf[:i])
        del self._buf[:i + 1]
        msg = json.loads(line)
        if isinstance(msg.get("id"), int):
            self._answered = msg["id"]
        return msg

    def _send(self, msg: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise WalkerGone(f"the walker process ended ({e})") from e

    def walk(self, pid: int, where: Interpreter, budget: float, stop: threading.Event | None = None,
             wait: float | None = None, frozen_max_age: float | None = None) -> dict[str, Any]:
        """read_python_heap(pid, walk=True, where=where) in the worker, with its frozen-set cache. Raises
        what the walk raised there when it is one of the errors a target's end gives (ProcessGone,
        OSError), WalkerGone when no answer came in ``budget`` + SLACK_S (or ``wait``; or ``stop`` set: the
        answer, when it comes, is dropped). ``frozen_max_age``: the worker's frozen-set walk is reused while its
        ends did not move and it is younger than this (None: FROZEN_REWALK_S)."""
        if not self.alive():
            self.spawn()
        if not self._ready:
            hello = self._line(time.monotonic() + (self.READY_S if wait is None else min(wait, self.READY_S)), stop)
            if not hello.get("ready"):
                raise WalkerGone(f"the walker process said {hello!r}")
            self._ready = True
        self._next_id += 1
        rid = self._next_id
        self._send({"id": rid, "pid": pid, "budget": budget,
                    **({} if frozen_max_age is None else {"frozen_max_age": frozen_max_age}),
                    "where": {"path": where.path, "version": where.version, "runtime": where.runtime,
                              "offs": where.offs, "source": where.source}})
        deadline = time.monotonic() + (budget + self.SLACK_S if wait is None else wait)
        while True:
            ans = self._line(deadline, stop)
            if ans.get("id") == rid:
                break
            self.dropped = ans  # earlier ids: answers given up on (stop, timeout, cancel)
        if stop is not None and stop.is_set():
            # it came after the stop, perhaps cut short by the stop's cancel (lists counted -1)
            self.dropped = ans
            raise WalkerGone("the walk was stopped")
        if "ok" in ans:
            st = ans["ok"]
            if "cpu_s" in ans:
                st["cpu_s"] = float(ans["cpu_s"])  # the walk's CPU time in the worker (popped by the probe)
            if isinstance(st.get("types"), dict):
                st["types"] = {k: (v[0], v[1]) for k, v in st["types"].items()}
            return st
        err, msg = ans.get("error", "?"), ans.get("msg", "")
        if err in ("ProcessGone", "AccessDenied", "NoSuchProcess"):
            raise ProcessGone(pid)
        if err in ("OSError", "FileNotFoundError", "PermissionError", "ProcessLookupError"):
            raise OSError(msg)
        if err in ("ValueError", "KeyError", "error"):
            raise ValueError(msg)
        raise WalkerGone(f"walk of pid {pid} failed in the walker process: {err}: {msg}")

    def busy(self) -> bool:
        """A walk was asked and its answer not read (given up on: it still runs in the worker)."""
        return self.alive() and self._answered < self._next_id

    def cancel(self) -> None:
        """The walk under way gives up at once (CANCEL_SIGNAL); the worker and what it keeps of
        each target's frozen set stay. Its answer, when read, is dropped by its id."""
        if self.busy() and self.proc is not None:
            try:
                os.kill(self.proc.pid, CANCEL_SIGNAL)
            except OSError:
                pass

    def forget(self, pid: int) -> None:
        if self.alive() and self._ready:
            try:
                self._send({"forget": pid})
            except WalkerGone:
                pass

    def close(self) -> None:
        """End the worker: its stdin closed (it ends at once between walks), killed after 1 s."""
        p, self.proc = self.proc, None
        if p is None:
            return
        try:
            if p.stdin is not None:
                p.stdin.close()
        except OSError:
            pass
        try:
            p.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        if p.stdout is not None:
            p.stdout.close()
