"""The node side: the body of the Ray task that runs `leaktrace hunt` on one node and answers with its session."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from leaktrace import procfs
from leaktrace.cluster.request import node_label
from leaktrace.errors import BpfUnavailable, LeaktraceError
from leaktrace.huntspec import HuntSpec
from leaktrace.vllm.discover import vllm_targets


def _is_leaktrace(args: list[str], pattern: str) -> bool:
    """leaktrace's own processes: the driver (its argv holds the --match pattern itself, as do wrappers
    like sudo, nsenter or kubectl exec around it) and any leaktrace run."""
    if pattern in args:
        return True
    if args and os.path.basename(args[0]) == "leaktrace":
        return True
    return any(a == "-m" and b == "leaktrace" for a, b in zip(args, args[1:], strict=False))


def match_processes(pattern: str, exclude: set[int] | None = None) -> list[dict[str, Any]]:
    """Processes whose command line (arguments joined by spaces) matches ``pattern`` (re.search), minus
    this process and its ancestors (the Ray worker and raylet running the hunt) and leaktrace itself."""
    rx = re.compile(pattern)
    skip = procfs.ancestors(os.getpid()) | (exclude or set())
    found = []
    for pid in procfs.iter_pids():
        if pid in skip:
            continue
        try:
            raw = procfs.read_proc_bytes(pid, "cmdline")
        except LeaktraceError:  # gone, or not ours to read
            continue
        if not raw:  # kernel threads and zombies
            continue
        args = raw.rstrip(b"\0").decode(errors="replace").split("\0")
        cmdline = " ".join(args)
        if rx.search(cmdline) and not _is_leaktrace(args, pattern):
            found.append({"pid": pid, "cmdline": cmdline[:300]})
    return sorted(found, key=lambda p: p["pid"])


def _die_with_parent() -> None:
    """preexec_fn: the hunt gets SIGTERM (and so still writes its session) if the Ray worker dies."""
    import ctypes

    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _error_line(stderr: str) -> str | None:
    for line in reversed(stderr.splitlines()):
        if line.startswith("leaktrace: error:"):
            return line[len("leaktrace: error:"):].strip()
    return None


def _tar_dir(path: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=3) as tar:
        tar.add(str(path), arcname=".")
    return buf.getvalue()


def node_identity() -> dict[str, Any]:
    import leaktrace

    # Which leaktrace the node ran (a fleet mixing versions, or a node importing a stray checkout, shows here).
    installed = {"version": leaktrace.__version__, "path": str(Path(leaktrace.__file__).resolve().parent)}
    info: dict[str, Any] = {"hostname": socket.gethostname(), "node_id": None, "ip": None, "leaktrace": installed}
    try:
        import ray

        ctx = ray.get_runtime_context()
        info["node_id"] = ctx.get_node_id()
        info["ip"] = ray.util.get_node_ip_address()
    except Exception:  # also usable outside Ray (tests, a manual run)
        pass
    return info


def run_node_hunt(request: dict[str, Any], node_pids: list[int]) -> dict[str, Any]:
    """The body of the per-node Ray task: choose targets here, run `leaktrace hunt`, hand back the session.

    Returns a plain dict (status ok|failed, reason, targets, timings, and either ``session_tar`` bytes or
    ``session_path`` under the shared directory). Never raises for a failed hunt: the reason travels back."""
    t0 = time.monotonic()
    ident = node_identity()
    result: dict[str, Any] = {**ident, "status": "failed", "reason": None, "no_targets": False,
                              "targets": [], "rc": None, "notes": [],
                              "stderr_tail": "", "session_tar": None, "session_path": None}
    spec = HuntSpec(**request["hunt"])
    targets: dict[str, Any] = {}
    if request["vllm"]:
        found = _vllm_roots()
        if found == []:
            result["status"], result["no_targets"] = "ok", True  # nothing to hunt is not a failure
            result["reason"] = "no vLLM server on this node"
            return _finish(result, t0)
        result["targets"] = [{"pid": p} for p in found or []]
        targets["vllm"] = True
    elif request["match"] is not None:
        result["targets"] = match_processes(request["match"])
        if not result["targets"]:
            result["status"], result["no_targets"] = "ok", True  # nothing to hunt is not a failure
            result["reason"] = f"no process on this node matches --match {request['match']!r}"
            return _finish(result, t0)
        targets["pids"] = tuple(t["pid"] for t in result["targets"])
    else:
        result["targets"] = [{"pid": p} for p in node_pids]
        if not node_pids:
            result["status"], result["no_targets"] = "ok", True  # nothing to hunt is not a failure
            result["reason"] = "no --pid was given for this node"
            return _finish(result, t0)
        targets["pids"] = tuple(node_pids)

    label = node_label(ident["hostname"], ident["node_id"])
    if request.get("shared_dir"):
        # One folder per cluster hunt: two hunts sharing the directory never touch each other's sessions.
        out = Path(request["shared_dir"]) / f"leaktrace-{request['run_id']}" / label
        cleanup = None
    else:
        # The run id in the path lets stop_node_hunts() find this hunt by its command line.
        cleanup = Path(tempfile.mkdtemp(prefix=f"leaktrace-node-{request['run_id']}-"))
        out = cleanup / "session"
    argv = replace(spec, live=False, out=str(out), **targets).argv()
    timeout = float(request["timeout_s"]) - 5.0  # leave the task time to pack and answer
    try:
        rc, stderr, result["reason"] = _run_hunt(argv, timeout, max(1.0, timeout - (time.monotonic() - t0)))
        if rc == BpfUnavailable.exit_code and result["reason"] is None and "--no-bpf" not in argv:
            # A node without eBPF (no CAP_BPF, no BCC, a locked-down kernel) still has /proc: hunt again with
            # the watcher (and gdb) only, and say so, rather than lose the node. The refusal comes at start.
            why = _error_line(stderr) or "the eBPF probe could not start"
            result["notes"].append(f"no eBPF on this node ({why}): hunted with /proc only (--no-bpf)")
            shutil.rmtree(out, ignore_errors=True)
            argv.append("--no-bpf")
            rc, stderr, result["reason"] = _run_hunt(argv, timeout, max(1.0, timeout - (time.monotonic() - t0)))
        result["rc"] = rc
        result["stderr_tail"] = stderr[-4000:]
        if result["reason"] is None:
            if rc == 0:
                result["status"] = "ok"
            else:
                why = _error_line(stderr) or f"`leaktrace hunt` exited with code {rc}"
                result["reason"] = why
        if (out / "meta.json").exists():
            if request.get("shared_dir"):
                result["session_path"] = str(out)
            else:
                result["session_tar"] = _tar_dir(out)
    finally:
        if cleanup is not None:
            shutil.rmtree(cleanup, ignore_errors=True)
    return _finish(result, t0)


def _run_hunt(argv: list[str], timeout: float, left_s: float) -> tuple[int, str, str | None]:
    """Run one `leaktrace hunt` for at most ``left_s`` seconds: (exit status, stderr, why it was stopped)."""
    reason = None
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_die_with_parent)
    try:
        _stdout, stderr = proc.communicate(timeout=left_s)
    except KeyboardInterrupt:  # ray.cancel() of this task (Ctrl-C on the driver): stop the hunt first
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    except subprocess.TimeoutExpired:
        proc.terminate()  # the hunt stops cleanly on SIGTERM and still writes what it has
        try:
            _stdout, stderr = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            _stdout, stderr = proc.communicate()
        reason = f"hunt did not finish within {timeout:.0f}s (stopped; partial session kept)"
    return proc.returncode, stderr, reason


def stop_node_hunts(run_id: str) -> list[int]:
    """Ctrl-C of the driver, on one node: SIGINT every `leaktrace hunt` of cluster run ``run_id`` (its
    --out names the run), as a Ctrl-C would. Each stops cleanly and its task answers with the session."""
    stopped = []
    for pid in procfs.iter_pids():
        try:
            argv = procfs.read_cmdline(pid)
        except LeaktraceError:
            continue
        if "leaktrace" in argv[:3] and "hunt" in argv and any(run_id in a for a in argv):
            try:
                os.kill(pid, signal.SIGINT)
                stopped.append(pid)
            except OSError:
                pass
    return stopped


def _vllm_roots() -> list[int] | None:
    """The vLLM servers on this node (None: discovery failed; the hunt then decides and says why)."""
    try:
        return list(vllm_targets())
    except Exception:  # let `leaktrace hunt --vllm` report the problem in its own words
        return None


def _finish(result: dict[str, Any], t0: float) -> dict[str, Any]:
    result["elapsed_s"] = round(time.monotonic() - t0, 3)
    return result


