"""The walker process's entry point: ``python -m leaktrace.probes.pyheap.worker --worker PPID``.

The pyheap probe runs its walks in this process (the hunt's side: leaktrace.probes.pyheap.client): a walk
is seconds of Python code on a vLLM process under load, and run in a thread of the hunt it would hold the
hunt's GIL against the tick thread and the eBPF ring's consumer (ticks 10-49 s late, ring overflows). The
worker reads one JSON request a line on stdin and answers one JSON line on stdout; it runs niced, dies with
the hunt (PR_SET_PDEATHSIG, and stdin's end) and keeps, per target, the walk of the frozen set (stable once
frozen) between walks. The walk's own state (its GIL yields, its cancel flag) stays in
leaktrace.probes.pyheap.walk, which this module sets."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

from leaktrace.probes.pyheap import walk
from leaktrace.probes.pyheap.interpreter import FROZEN_REWALK_S, Interpreter, read_python_heap


def _die_with_parent(ppid: int) -> bool:
    """PR_SET_PDEATHSIG(SIGKILL): the worker never outlives the hunt (the thread that started it).
    False when the hunt already ended (the parent is not ``ppid`` any more)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass
    return os.getppid() == ppid


def serve(requests: Any, answer: Any) -> None:
    """Answer each request line of ``requests``: ``{"id", "pid", "where": Interpreter fields, "budget": s,
    "frozen_max_age": s}``
    → ``{"id", "ok": read_python_heap(...), "cpu_s"}`` (``types`` as {name: [objects, frozen]}) or ``{"id",
    "error": exception class, "msg"}``; ``{"forget": pid}`` drops what is kept of a process. Ends at
    the end of ``requests``."""
    frozen: dict[int, dict[str, Any]] = {}  # pid -> its frozen set's last walk (read_python_heap's cache)
    for line in requests:
        try:
            req = json.loads(line)
        except ValueError:
            continue
        if "forget" in req:
            frozen.pop(int(req["forget"]), None)
            continue
        rid, pid = req.get("id"), int(req["pid"])
        walk.clear_cancel()
        c0 = time.process_time()
        try:
            st = read_python_heap(pid, walk=True, where=Interpreter(**req["where"]),
                                  frozen_cache=frozen.setdefault(pid, {}), budget=float(req.get("budget", walk.WALK_BUDGET_S)),
                                  frozen_max_age=float(req.get("frozen_max_age", FROZEN_REWALK_S)))
            # the walk's CPU seconds (its wall time on a busy node is mostly waiting: the worker is niced)
            msg: dict[str, Any] = {"id": rid, "ok": st, "cpu_s": round(time.process_time() - c0, 4)}
        except Exception as e:  # said to the hunt, which decides
            frozen.pop(pid, None)
            msg = {"id": rid, "error": type(e).__name__, "msg": str(e)}
        answer.write(json.dumps(msg, separators=(",", ":")) + "\n")
        answer.flush()


def worker_main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--worker":
        print("usage: python -m leaktrace.probes.pyheap.worker --worker PARENT_PID", file=sys.stderr)
        return 2
    if not _die_with_parent(int(argv[1])):
        return 0
    walk.YIELD_GIL = False
    try:
        os.nice(walk.WORKER_NICE)
    except OSError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the hunt's terminal: the hunt stops it
    signal.signal(walk.CANCEL_SIGNAL, walk.cancel)
    sys.stdout.write('{"ready":true}\n')
    sys.stdout.flush()
    serve(sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
