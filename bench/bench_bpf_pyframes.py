"""Can the eBPF path take the Python frames at the growth event? bpf/pyframes_probe.bpf.c reads, at each
sys_enter_mmap of a Python target, its thread state, current frame and up to PY_MAX_DEPTH frames (code object
and instruction pointer each) into the ring buffer; user space names them (leaktrace/pyframes.py) and checks
them against the target's known stack. Cost: the target's own time per mmap+munmap pair (ctypes, 4 KiB) with
the program attached against without it, in the same process, rounds alternating; and the walk's time in the
kernel (bpf_ktime_get_ns around it).

    .venv/bin/python bench/bench_bpf_pyframes.py [--depth 50] [--max-depth 32] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from leaktrace.probes.bpf.loader import load_program  # noqa: E402
from leaktrace.probes.pyheap.frames import frames_config  # noqa: E402
from leaktrace.procmem import ProcMem  # noqa: E402
from leaktrace.pyframes import PythonStacks, line_at  # noqa: E402

TARGET = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
def loop():
    print("ready", os.getpid(), flush=True)
    for _ in sys.stdin:  # one round a line, when the bench asks
        t = time.perf_counter_ns()
        for _ in range(20000):
            libc.munmap(libc.mmap(None, 4096, 3, 0x22, -1, 0), 4096)
        print((time.perf_counter_ns() - t) / 20000, flush=True)
def deep(n):
    return deep(n - 1) if n else loop()
deep(int(sys.argv[1]))
"""


def rounds(p: subprocess.Popen, n: int) -> list[float]:
    assert p.stdout is not None and p.stdin is not None
    out = []
    for _ in range(n):
        p.stdin.write("go\n")
        p.stdin.flush()
        out.append(float(p.stdout.readline()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--depth", type=int, default=50)
    ap.add_argument("--max-depth", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    p = subprocess.Popen([sys.executable, "-c", TARGET, str(args.depth)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().startswith("ready")
        cfg = frames_config(p.pid)
        o = cfg["offsets"]
        defines = {"PY_TGID": p.pid, "PY_RUNTIME": cfg["runtime"], "PY_MAX_DEPTH": args.max_depth,
                   "PY_INTERP_MAIN": o["interp_main"], "PY_THREADS_HEAD": o["threads_head"],
                   "PY_TS_NEXT": o["ts_next"], "PY_TS_NATIVE_TID": o["ts_native_tid"], "PY_IF_CODE": o["if_code"],
                   "PY_IF_INSTR": o["if_instr"], "PY_IF_PREVIOUS": o["if_previous"], "PY_IF_OWNER": o["if_owner"],
                   "PY_FRAME_WORDS": max(o["if_code"], o["if_instr"], o["if_previous"], o["if_owner"]) // 8 + 1}
        if "ts_current_frame" in o:
            defines["PY_TS_CURRENT_FRAME"] = o["ts_current_frame"]
        else:
            defines.update(PY_TS_CFRAME=o["ts_cframe"], PY_CFRAME_CURRENT=o["cframe_current"])
        rounds(p, 1)  # warm
        without = rounds(p, args.rounds)
        prog, _ = load_program("pyframes_probe.bpf.c", defines)
        seen: list[tuple[int, list[tuple[int, int, int]]]] = []

        class Event(ctypes.Structure):
            _fields_ = [("tid", ctypes.c_uint32), ("depth", ctypes.c_uint32), ("ns", ctypes.c_uint64),
                        ("code", ctypes.c_uint64 * args.max_depth), ("instr", ctypes.c_uint64 * args.max_depth),
                        ("owner", ctypes.c_uint8 * args.max_depth)]

        def on_event(_ctx, data, _size) -> None:
            if len(seen) < 50:
                e = ctypes.cast(data, ctypes.POINTER(Event)).contents
                seen.append((e.tid, [(e.code[i], e.instr[i], e.owner[i]) for i in range(e.depth)]))

        prog["py_events"].open_ring_buffer(on_event)
        with_ = []
        for _ in range(args.rounds):
            with_ += rounds(p, 1)
            prog.ring_buffer_consume()
        cost = prog["py_cost"]
        total_ns, events = cost[ctypes.c_int(0)].value, cost[ctypes.c_int(1)].value
        prog.cleanup()
        after = rounds(p, args.rounds)
        # name the frames of one event (the code objects are alive: the target is still in those calls)
        names: list[str] = []
        with ProcMem(p.pid) as mem:
            st = PythonStacks(mem, cfg["runtime"], cfg["version"], o)
            tid, frames = seen[-1]
            for code, instr, owner in frames:
                if owner == 3:
                    continue
                info = st.code(code)
                if info is None:
                    names.append("?")
                    continue
                lasti = (instr - code - o["co_code_adaptive"]) // 2
                names.append(f"{Path(info[1]).name}:{info[2]}:{line_at(info[4], info[3], lasti)}")
    finally:
        p.kill()
        p.wait()
    base = statistics.median(without + after)
    out = {"python": cfg["version"], "stack_depth": args.depth + 3, "max_depth": args.max_depth,
           "pair_ns_without": round(base, 1), "pair_ns_with": round(statistics.median(with_), 1),
           "ratio": round(statistics.median(with_) / base, 3), "events": events,
           "walk_ns_mean": round(total_ns / events, 1) if events else None, "frames_read": len(seen[-1][1]),
           "innermost": names[:3], "tid_matched": seen[-1][0] == p.pid}
    print(json.dumps(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
