"""The demo's Python host: sends "transfers" through libxfer_demo at a steady rate.

usage: python -m leaktrace.demo.host LIB [--mb-per-min N] [--buffer-kib N]
Prints "ready <pid>" once the library is loaded, then runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("lib")
    ap.add_argument("--mb-per-min", type=float, default=120.0, help="leak rate (MiB/min) of the send path")
    ap.add_argument("--buffer-kib", type=int, default=256)
    args = ap.parse_args()
    lib = ctypes.CDLL(args.lib)
    lib.xfer_send.restype = ctypes.c_long
    lib.xfer_send.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t]
    lib.xfer_recv.restype = ctypes.c_long
    lib.xfer_recv.argtypes = [ctypes.c_size_t]
    lib.xfer_init()
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    buffer_len = args.buffer_kib * 1024
    sends_per_s = args.mb_per_min * 1024 * 1024 / 60.0 / buffer_len
    payload = os.urandom(4096)
    print(f"ready {os.getpid()}", flush=True)
    t0 = time.monotonic()
    sent = 0
    while not stop:
        due = int((time.monotonic() - t0) * sends_per_s)
        while sent < due and not stop:
            lib.xfer_send(payload, len(payload), buffer_len)
            lib.xfer_recv(buffer_len)  # the innocent path: mapped and unmapped at once
            sent += 1
        time.sleep(0.02)


if __name__ == "__main__":
    main()
