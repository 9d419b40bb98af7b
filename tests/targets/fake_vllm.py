"""A stand-in vLLM process tree for discovery tests (no vLLM needed): ``vllm serve MODEL --port N ...``.

Installed as an executable named ``vllm`` by the tests, it behaves like the API server as far as /proc
shows: it sets VLLM_WORKER_MULTIPROC_METHOD in-process (as vLLM's CPU platform does: invisible in
/proc/PID/environ), then starts children that are "retitled" the way setproctitle leaves them: the
title as the whole command line and an empty environment (``VLLM::EngineCore`` → ``VLLM::Worker_TP0``).
Prints ``ready <api pid> <engine pid> <worker pid>``.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--engine":
        # The EngineCore: start the worker, then wait. Its environ is empty, like a retitled process.
        worker = os.fork()
        if worker == 0:
            os.execve("/bin/sleep", ["VLLM::Worker_TP0", "600"], {})
        print(f"{os.getpid()} {worker}", flush=True)
        os.execve("/bin/sleep", ["VLLM::EngineCore", "600"], {})
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"  # in-process only, as vLLM does
    r, w = os.pipe()
    engine = os.fork()
    if engine == 0:
        os.dup2(w, 1)
        os.execve(sys.executable, [sys.executable, __file__, "--engine"], {})
    line = os.read(r, 200).decode().split()
    print(f"ready {os.getpid()} {line[0]} {line[1]}", flush=True)
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
