"""Two real NIXL 1.5.1 agents in two processes doing DRAM transfers over UCX, loopback only.

``python nixl_pair.py [--rate N] [--size MiB]`` starts the *target* agent here and an *initiator* agent in a
child process (this file with ``--initiator``). Metadata goes over the child's stdin/stdout; then the
initiator READs the target's buffer and WRITEs it back, ``rate`` round trips per second, and checks the
bytes. Prints ``ready <target pid> <initiator pid>`` after the first verified round trip.

Needs nixl on PYTHONPATH and numpy. The caller must set UCX_NET_DEVICES=lo (never eth0) and
UCX_MODULES='^ib*,rdmacm'; we refuse to run without the first.
"""

from __future__ import annotations

import argparse
import base64
import os
import queue
import subprocess
import sys
import threading
import time


def _check_env() -> None:
    if os.environ.get("UCX_NET_DEVICES") != "lo":
        sys.exit("nixl_pair: refusing to run without UCX_NET_DEVICES=lo (loopback only)")


def _private_stdout():
    """Our protocol lines own the real stdout; NIXL logs to stdout, so point fd 1 at stderr."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto


def _agent(name: str):
    from nixl._api import nixl_agent, nixl_agent_config

    # No progress thread: on 2 cores its busy polling would eat a whole core.
    return nixl_agent(name, nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))


def _send(stream, tag: str, payload: bytes = b"") -> None:
    stream.write(f"{tag} {base64.b64encode(payload).decode()}\n")
    stream.flush()


def _recv(stream, tag: str) -> bytes:
    line = stream.readline()
    if not line:
        raise RuntimeError(f"peer closed while waiting for {tag}")
    got, _, payload = line.strip().partition(" ")
    if got != tag:
        raise RuntimeError(f"expected {tag}, got {line[:80]!r}")
    return base64.b64decode(payload)


def _wait(agent, handle, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    state = agent.transfer(handle)
    while state == "PROC":
        if time.monotonic() > deadline:
            raise RuntimeError("transfer timed out")
        state = agent.check_xfer_state(handle)
    if state != "DONE":
        raise RuntimeError(f"transfer failed: {state}")


def run_target(rate: float, size: int, launch_env: dict[str, str]) -> None:
    import numpy as np

    out = _private_stdout()
    agent = _agent("target")
    buf = np.arange(size, dtype=np.uint8)
    agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    child = subprocess.Popen([sys.executable, __file__, "--initiator", "--rate", str(rate), "--size", str(size)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=launch_env)
    _send(child.stdin, "META", agent.get_agent_metadata())
    _send(child.stdin, "DESC", f"{buf.ctypes.data} {buf.nbytes}".encode())
    peer_meta = _recv(child.stdout, "META")
    agent.add_remote_agent(peer_meta)
    # The initiator's wire-up needs this side's UCX worker to make progress, so poll it while a
    # thread waits for the initiator's first "ok" (no progress thread: see _agent).
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in child.stdout], daemon=True).start()
    announced = False
    try:
        while child.poll() is None:
            agent.get_new_notifs()
            try:
                line = lines.get(timeout=0.01).strip()
            except queue.Empty:
                continue
            if line.startswith("ok") and not announced:
                print(f"ready {os.getpid()} {child.pid}", file=out, flush=True)
                announced = True
            elif not line.startswith("ok"):
                sys.exit(f"nixl_pair: initiator failed: {line!r}")
    except KeyboardInterrupt:
        pass
    finally:
        if child.poll() is None:
            child.terminate()
    if not announced:
        sys.exit(f"nixl_pair: initiator exited with {child.returncode}")


def run_initiator(rate: float, size: int) -> None:
    import numpy as np

    out = _private_stdout()
    agent = _agent("initiator")
    peer_meta = _recv(sys.stdin, "META")
    addr_s, len_s = _recv(sys.stdin, "DESC").decode().split()
    remote_addr, remote_len = int(addr_s), int(len_s)
    name = agent.add_remote_agent(peer_meta)
    _send(out, "META", agent.get_agent_metadata())
    local = np.zeros(size, dtype=np.uint8)
    agent.register_memory([(local.ctypes.data, local.nbytes, 0, "")], "DRAM")
    local_descs = agent.get_xfer_descs([(local.ctypes.data, local.nbytes, 0)], "DRAM")
    remote_descs = agent.get_xfer_descs([(remote_addr, remote_len, 0)], "DRAM")
    expected = np.arange(size, dtype=np.uint8)
    n = 0
    while True:
        read = agent.initialize_xfer("READ", local_descs, remote_descs, name)
        _wait(agent, read)
        agent.release_xfer_handle(read)
        if not np.array_equal(local, expected):
            print("bad data after READ", file=out, flush=True)
            sys.exit(1)
        write = agent.initialize_xfer("WRITE", local_descs, remote_descs, name)
        _wait(agent, write)
        agent.release_xfer_handle(write)
        n += 1
        if n == 1:
            print(f"ok {n}", file=out, flush=True)
        time.sleep(1.0 / rate)


def main() -> None:
    _check_env()
    ap = argparse.ArgumentParser()
    ap.add_argument("--initiator", action="store_true")
    ap.add_argument("--rate", type=float, default=20.0, help="round trips per second")
    ap.add_argument("--size", type=int, default=4 << 20, help="buffer bytes")
    ap.add_argument("--inprocess-env", action="append", default=[], metavar="KEY=VALUE",
                    help="set in os.environ before importing nixl, as vLLM's nixl_utils does "
                         "(invisible in /proc/PID/environ)")
    a = ap.parse_args()
    launch_env = dict(os.environ)  # the child gets the launch environment, not our in-process changes
    for item in a.inprocess_env:
        key, _, value = item.partition("=")
        os.environ[key] = value
    if a.initiator:
        run_initiator(a.rate, a.size)
    else:
        run_target(a.rate, a.size, launch_env)


if __name__ == "__main__":
    main()
