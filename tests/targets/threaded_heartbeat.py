"""A many-threaded Python process whose progress needs its other threads, like a vLLM worker's steps
need their helper threads: the main thread hands a token to a helper thread and waits for it back, then
appends a CLOCK_MONOTONIC timestamp to argv[1] (every ~20 ms). 40 more threads idle. Large shared
libraries (pyarrow, pandas) make gdb's symbol reading take about a second. Prints "ready" once running.

If an attach leaves any thread stopped, the heartbeat stops with it: its largest gap is the longest
time the process could not make progress."""

import queue
import sys
import threading
import time

import pandas  # noqa: F401 - large shared libraries for gdb to read
import pyarrow  # noqa: F401

out = open(sys.argv[1], "w", buffering=1)  # lives as long as the process
ask: queue.Queue = queue.Queue()
answer: queue.Queue = queue.Queue()


def helper() -> None:
    while True:
        answer.put(ask.get())


def idle() -> None:
    while True:
        time.sleep(0.01)


threading.Thread(target=helper, daemon=True).start()
for _ in range(40):
    threading.Thread(target=idle, daemon=True).start()
print("ready", flush=True)
while True:
    ask.put(1)
    answer.get()
    out.write(f"{time.monotonic():.4f}\n")
    time.sleep(0.02)
