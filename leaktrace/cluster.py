"""Cluster hunt: the same `leaktrace hunt` on every selected node of a Ray cluster, merged into one report.

Ray is the transport (the engine vLLM deployments already run), nothing more: one task per node, pinned
there with hard node affinity, runs ``python -m leaktrace hunt`` as a subprocess with the same options
everywhere, and hands the node's session directory back (tar bytes through the object store, or written
to a path shared by every node). The caller unpacks each into ``OUT/nodes/<node>/`` (an ordinary session
that ``leaktrace report`` re-renders) and merges the node reports into ``OUT/report.json`` and
``OUT/report.md``. A node that fails (no target, target gone, task or node died, no answer in time) is
listed with its reason; the other nodes' results stay.

Cluster session layout::

    OUT/cluster.json          what was asked (address, targets, hunt options) and what each node answered
    OUT/nodes/<node>/         one session directory per node that answered with one
    OUT/report.json, .md      the merged report (schema leaktrace.report/1 plus ``nodes`` and more)

Ray is imported only on the driver side of ``cluster hunt``; merging and ``cluster report`` work without it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from leaktrace import procfs
from leaktrace.atomic import atomic_write_text
from leaktrace.discover import vllm_targets
from leaktrace.errors import ClusterError, LeaktraceError, SessionError, UsageError

CLUSTER_SCHEMA = "leaktrace.cluster/1"
CLUSTER_META = "cluster.json"
NODES_DIR = "nodes"
INSTALL_HINT = "pip install 'leaktrace[cluster]'"
# Seconds a node may take beyond --duration: Ray worker start, probe attach, report rendering, transfer.
DEFAULT_GRACE_S = 120.0
# After Ctrl-C: how long the driver waits for the stopped node hunts to answer with their sessions.
STOP_GRACE_S = 60.0


# --------------------------------------------------------------------------------------------- request
@dataclass
class PidSpec:
    """``--pid [NODE=]PID``: a PID means nothing without its node, so it may name one (IP, hostname or
    node-id prefix); an unqualified PID is hunted on every selected node."""

    pid: int
    node: str | None = None

    @classmethod
    def parse(cls, text: str) -> PidSpec:
        node, _, pid = text.rpartition("=")
        try:
            value = int(pid)
        except ValueError as e:
            raise UsageError(f"--pid {text!r}: expected PID or NODE=PID (NODE: IP, hostname or node id)") from e
        if value <= 0:
            raise UsageError(f"--pid {text!r}: a PID is a positive integer")
        return cls(pid=value, node=node or None)


@dataclass
class ClusterRequest:
    address: str
    vllm: bool = False
    match: str | None = None
    pids: list[PidSpec] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)  # selectors; empty: every alive node (see select_nodes)
    duration: float = 60.0
    hunt_args: list[str] = field(default_factory=list)  # passed to `leaktrace hunt` unchanged, on every node
    shared_dir: str | None = None
    node_timeout: float | None = None  # None: duration + DEFAULT_GRACE_S
    node_ip_address: str | None = None  # the driver's own node IP, when Ray cannot tell it

    def targets_desc(self) -> str:
        if self.vllm:
            return "--vllm"
        if self.match is not None:
            return f"--match {self.match!r}"
        return " ".join(f"--pid {p.node + '=' if p.node else ''}{p.pid}" for p in self.pids)

    def validate(self) -> None:
        modes = sum([self.vllm, self.match is not None, bool(self.pids)])
        if modes != 1:
            raise UsageError("choose the targets with exactly one of --vllm, --match REGEX or --pid [NODE=]PID")
        if self.match is not None:
            try:
                re.compile(self.match)
            except re.error as e:
                raise UsageError(f"--match {self.match!r} is not a valid regular expression: {e}") from e
        if self.duration <= 0:
            raise UsageError("--duration must be positive")
        if self.shared_dir is not None and not os.path.isabs(self.shared_dir):
            raise UsageError("--shared-dir must be an absolute path, the same on every node")

    @property
    def timeout_s(self) -> float:
        return self.node_timeout if self.node_timeout is not None else self.duration + DEFAULT_GRACE_S


# ------------------------------------------------------------------------------------------ node side
def _ancestors(pid: int) -> set[int]:
    out: set[int] = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return out


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
    skip = _ancestors(os.getpid()) | (exclude or set())
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            raw = Path(entry.path, "cmdline").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if not raw:  # kernel threads and zombies
            continue
        args = raw.rstrip(b"\0").decode(errors="replace").split("\0")
        cmdline = " ".join(args)
        if rx.search(cmdline) and not _is_leaktrace(args, pattern):
            found.append({"pid": int(entry.name), "cmdline": cmdline[:300]})
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
    info: dict[str, Any] = {"hostname": socket.gethostname(), "node_id": None, "ip": None}
    try:
        import ray

        ctx = ray.get_runtime_context()
        info["node_id"] = ctx.get_node_id()
        info["ip"] = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - also usable outside Ray (tests, a manual run)
        pass
    return info


def run_node_hunt(request: dict[str, Any], node_pids: list[int]) -> dict[str, Any]:
    """The body of the per-node Ray task: choose targets here, run `leaktrace hunt`, hand back the session.

    Returns a plain dict (status ok|failed, reason, targets, timings, and either ``session_tar`` bytes or
    ``session_path`` under the shared directory). Never raises for a failed hunt: the reason travels back."""
    t0 = time.monotonic()
    ident = node_identity()
    result: dict[str, Any] = {**ident, "status": "failed", "reason": None, "no_targets": False,
                              "targets": [], "rc": None,
                              "stderr_tail": "", "session_tar": None, "session_path": None}
    argv = [sys.executable, "-m", "leaktrace", "hunt", "--duration", str(request["duration"]), "--no-live",
            *request["hunt_args"]]
    if request["vllm"]:
        found = _vllm_roots()
        if found == []:
            result["no_targets"] = True
            result["reason"] = "no vLLM server on this node"
            return _finish(result, t0)
        result["targets"] = [{"pid": p} for p in found or []]
        argv.append("--vllm")
    elif request["match"] is not None:
        targets = match_processes(request["match"])
        result["targets"] = targets
        if not targets:
            result["no_targets"] = True
            result["reason"] = f"no process on this node matches --match {request['match']!r}"
            return _finish(result, t0)
        for t in targets:
            argv += ["--pid", str(t["pid"])]
    else:
        result["targets"] = [{"pid": p} for p in node_pids]
        if not node_pids:
            result["no_targets"] = True
            result["reason"] = "no --pid was given for this node"
            return _finish(result, t0)
        for p in node_pids:
            argv += ["--pid", str(p)]

    label = node_label(ident["hostname"], ident["node_id"])
    if request.get("shared_dir"):
        # One folder per cluster hunt: two hunts sharing the directory never touch each other's sessions.
        out = Path(request["shared_dir"]) / f"leaktrace-{request['run_id']}" / label
        cleanup = None
    else:
        # The run id in the path lets stop_node_hunts() find this hunt by its command line.
        cleanup = Path(tempfile.mkdtemp(prefix=f"leaktrace-node-{request['run_id']}-"))
        out = cleanup / "session"
    argv += ["--out", str(out)]
    timeout = float(request["timeout_s"]) - 5.0  # leave the task time to pack and answer
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=_die_with_parent)
        try:
            stdout, stderr = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
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
                stdout, stderr = proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, stderr = proc.communicate()
            result["reason"] = f"hunt did not finish within {timeout:.0f}s (stopped; partial session kept)"
        result["rc"] = proc.returncode
        result["stderr_tail"] = stderr[-4000:]
        if result["reason"] is None:
            if proc.returncode == 0:
                result["status"] = "ok"
            else:
                why = _error_line(stderr) or f"`leaktrace hunt` exited with code {proc.returncode}"
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


def stop_node_hunts(run_id: str) -> list[int]:
    """Ctrl-C of the driver, on one node: SIGINT every `leaktrace hunt` of cluster run ``run_id`` (its
    --out names the run), as a Ctrl-C would. Each stops cleanly and its task answers with the session."""
    stopped = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = procfs.read_cmdline(int(entry.name))
        except LeaktraceError:
            continue
        if "leaktrace" in argv[:3] and "hunt" in argv and any(run_id in a for a in argv):
            try:
                os.kill(int(entry.name), signal.SIGINT)
                stopped.append(int(entry.name))
            except OSError:
                pass
    return stopped


def _vllm_roots() -> list[int] | None:
    """The vLLM servers on this node (None: discovery failed; the hunt then decides and says why)."""
    try:
        return list(vllm_targets())
    except Exception:  # noqa: BLE001 - let `leaktrace hunt --vllm` report the problem in its own words
        return None


def _finish(result: dict[str, Any], t0: float) -> dict[str, Any]:
    result["elapsed_s"] = round(time.monotonic() - t0, 3)
    return result


# ---------------------------------------------------------------------------------------- driver side
def import_ray():
    try:
        import ray
    except ImportError as e:
        raise ClusterError(f"the cluster hunt needs Ray, which is not installed ({e.name or 'ray'})",
                           f"{INSTALL_HINT} (on the driver and on every node)") from e
    return ray


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """ray.init retries an unreachable address for minutes; a plain TCP connect answers in seconds."""
    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--address {address!r}: expected HOST:PORT (the Ray head's GCS), ray://HOST:PORT or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise ClusterError(f"no Ray head answers at {address} ({e.strerror or e})",
                           "check --address (the head's `ray start --head --port`, default 6379)") from e


def connect(request: ClusterRequest, log: Callable[[str], None]):
    ray = import_ray()
    _check_reachable(request.address)
    import logging

    kwargs: dict[str, Any] = {"address": request.address, "logging_level": logging.ERROR,
                              "log_to_driver": False, "namespace": "leaktrace"}
    if request.node_ip_address and "://" not in request.address:
        kwargs["_node_ip_address"] = request.node_ip_address
    t0 = time.monotonic()
    try:
        ray.init(**kwargs)
    except Exception as e:  # noqa: BLE001 - Ray raises many types for one meaning here
        raise ClusterError(f"cannot connect to the Ray cluster at {request.address}: {_one_line(e)}",
                           "check --address; run on a node of the cluster or use ray://HEAD:10001") from e
    log(f"connected to Ray at {request.address} in {time.monotonic() - t0:.1f}s")
    return ray


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".strip()


def node_matches(node: dict[str, Any], selector: str) -> bool:
    """A node is named by its IP, its hostname, a node-id prefix (6+ hex digits) or a custom resource it
    was started with (``ray start --resources '{"gpu-node-7": 1}'``: on Kubernetes, the k8s node name)."""
    sel = selector.strip()
    return bool(sel) and (sel == node.get("NodeManagerAddress") or sel == node.get("NodeManagerHostname")
                          or (len(sel) >= 6 and str(node.get("NodeID", "")).startswith(sel))
                          or sel in (node.get("Resources") or {}))


def select_nodes(all_nodes: list[dict[str, Any]], request: ClusterRequest) -> list[dict[str, Any]]:
    alive = [n for n in all_nodes if n.get("Alive")]
    selectors = list(request.nodes)
    if not selectors and request.pids and all(p.node for p in request.pids):
        # Every PID names its node: hunt exactly those nodes.
        selectors = [p.node for p in request.pids if p.node]
    if not selectors:
        return alive
    chosen = []
    for sel in selectors:
        hits = [n for n in alive if node_matches(n, sel)]
        if not hits:
            names = ", ".join(f"{n.get('NodeManagerHostname')} ({n.get('NodeManagerAddress')})" for n in alive)
            raise UsageError(f"no alive Ray node matches {sel!r}; alive: {names or 'none'}")
        chosen += [n for n in hits if n not in chosen]
    return chosen


def pids_for(node: dict[str, Any], request: ClusterRequest) -> list[int]:
    return [p.pid for p in request.pids if p.node is None or node_matches(node, p.node)]


def node_label(hostname: str | None, node_id: str | None) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", hostname or "node")
    return f"{safe}-{(node_id or 'unknown')[:8]}"


def _task_failure_reason(e: BaseException) -> str:
    text = str(e)
    if "ModuleNotFoundError" in text and "leaktrace" in text:
        return "leaktrace is not installed in this node's Ray Python (pip install leaktrace on every node)"
    name = type(e).__name__
    if "NodeDied" in name or "node" in text.lower() and "died" in text.lower():
        return f"the node died during the hunt ({_one_line(e)})"
    if "WorkerCrashed" in name:
        return f"the Ray worker running the hunt crashed ({_one_line(e)})"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return f"{name}: {lines[-1] if lines else ''}"[:500]


def cluster_hunt(request: ClusterRequest, out: str | os.PathLike[str],
                 log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Fan the hunt out over the cluster, collect every node's session, write the merged report."""
    request.validate()
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / NODES_DIR).mkdir(exist_ok=True)
    except OSError as e:
        from leaktrace.errors import OutputNotWritable

        raise OutputNotWritable(f"cannot write {out}: {e.strerror or e}") from e
    ray = connect(request, log)
    try:
        return _fan_out(ray, request, out, log)
    finally:
        ray.shutdown()


def _fan_out(ray, request: ClusterRequest, out: Path, log: Callable[[str], None]) -> dict[str, Any]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    started_wall = time.time()
    nodes = select_nodes(ray.nodes(), request)
    if not nodes:
        raise ClusterError("the Ray cluster has no alive node", "check `ray status` on the head")
    log(f"hunting on {len(nodes)} node(s): " + ", ".join(
        f"{n.get('NodeManagerHostname')} ({n.get('NodeManagerAddress')})" for n in nodes))
    run_id = time.strftime("%Y%m%d-%H%M%S-") + os.urandom(3).hex()
    wire = {"run_id": run_id, "duration": request.duration, "hunt_args": list(request.hunt_args), "vllm": request.vllm,
            "match": request.match, "shared_dir": request.shared_dir, "timeout_s": request.timeout_s}
    # num_cpus=0: a node whose CPUs are all claimed by vLLM's own actors must still run the hunt.
    # max_retries=0: a hunt that died is a result to report, not something to start over.
    remote = ray.remote(num_cpus=0, max_retries=0)(run_node_hunt)
    pending: dict[Any, dict[str, Any]] = {}
    for n in nodes:
        ref = remote.options(scheduling_strategy=_affinity(NodeAffinitySchedulingStrategy, n),
                             name=f"leaktrace-hunt-{n['NodeManagerHostname']}").remote(wire, pids_for(n, request))
        pending[ref] = n
    answers: dict[str, dict[str, Any]] = {}
    # The node stops its own hunt at timeout_s and still answers with what it has; the driver waits a
    # little longer so that answer (and its partial session) can arrive.
    deadline = time.monotonic() + request.timeout_s + 30.0
    missing_reason = f"no answer within {request.timeout_s + 30.0:.0f}s"
    interrupted = False
    try:
        try:
            _collect(ray, pending, answers, deadline, log)
        except KeyboardInterrupt:
            # Ctrl-C: as for `hunt`, stop every node's hunt cleanly (SIGINT there), then collect the
            # sessions they write. A second Ctrl-C stops waiting.
            interrupted = True
            missing_reason = "interrupted (Ctrl-C) before this node answered"
            log(f"interrupted: stopping the hunts on {len(pending)} node(s) (Ctrl-C again to stop waiting)")
            stop = ray.remote(num_cpus=0, max_retries=0)(stop_node_hunts)
            stops = {stop.options(scheduling_strategy=_affinity(NodeAffinitySchedulingStrategy, n)).remote(run_id): n
                     for n in pending.values()}
            with contextlib.suppress(KeyboardInterrupt):
                grace = time.monotonic() + STOP_GRACE_S
                done, _ = ray.wait(list(stops), num_returns=len(stops), timeout=STOP_GRACE_S / 2)
                for ref in done:
                    with contextlib.suppress(Exception):
                        log(f"node {stops[ref].get('NodeManagerHostname')}: stopped {len(ray.get(ref))} hunt(s)")
                _collect(ray, pending, answers, grace, log)
    finally:
        for ref, n in pending.items():
            answers.setdefault(n["NodeID"], {"status": "failed", "reason": missing_reason})
            try:
                # Not force: the task gets KeyboardInterrupt and stops its hunt with SIGTERM.
                ray.cancel(ref, force=False)
            except Exception:  # noqa: BLE001 - best effort; the node-side hunt is bounded by its duration
                pass
    node_entries = []
    for n in nodes:
        a = answers[n["NodeID"]]
        label = node_label(a.get("hostname") or n.get("NodeManagerHostname"), n["NodeID"])
        session = None
        if a.get("session_tar"):
            dest = out / NODES_DIR / label
            _untar(a["session_tar"], dest)
            session = f"{NODES_DIR}/{label}"
        elif a.get("session_path"):
            session = a["session_path"]
        node_entries.append({
            "node_id": n["NodeID"], "hostname": a.get("hostname") or n.get("NodeManagerHostname"),
            "ip": n.get("NodeManagerAddress"), "status": a["status"], "reason": a.get("reason"),
            "no_targets": bool(a.get("no_targets")),
            "targets": a.get("targets", []), "rc": a.get("rc"), "elapsed_s": a.get("elapsed_s"),
            "session": session, "stderr_tail": a.get("stderr_tail", ""),
        })
    meta = {
        "schema": CLUSTER_SCHEMA, "run_id": run_id, "address": request.address, "targets": request.targets_desc(),
        "request": {k: v for k, v in asdict(request).items() if k != "pids"} | {
            "pids": [asdict(p) for p in request.pids]},
        "argv": sys.argv, "start_wall": started_wall, "end_wall": time.time(), "nodes": node_entries,
        "stop_reason": "interrupted (Ctrl-C)" if interrupted else "completed",
    }
    atomic_write_text(out / CLUSTER_META, json.dumps(meta, indent=2, default=str))
    # Stopped by Ctrl-C is a completed hunt, as for `hunt`: the report is written, exit status 0.
    return render_cluster(out)


def _affinity(strategy_cls: Any, node: dict[str, Any]) -> Any:
    try:  # fail at once (not wait) when the node died between listing and scheduling
        return strategy_cls(node_id=node["NodeID"], soft=False, _fail_on_unavailable=True)
    except TypeError:  # older Ray
        return strategy_cls(node_id=node["NodeID"], soft=False)


def _collect(ray: Any, pending: dict[Any, dict[str, Any]], answers: dict[str, dict[str, Any]], deadline: float,
             log: Callable[[str], None]) -> None:
    """Wait for node answers until ``pending`` is empty or ``deadline`` (monotonic) passes."""
    while pending and time.monotonic() < deadline:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=min(5.0, max(0.1, deadline - time.monotonic())))
        for ref in ready:
            n = pending.pop(ref)
            try:
                answers[n["NodeID"]] = ray.get(ref, timeout=60)
            except Exception as e:  # noqa: BLE001 - a task/node failure is that node's result
                answers[n["NodeID"]] = {"status": "failed", "reason": _task_failure_reason(e)}
            a = answers[n["NodeID"]]
            log(f"node {n.get('NodeManagerHostname')}: {a['status']}"
                + (f" ({a.get('reason')})" if a.get("reason") else ""))


def _untar(data: bytes, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")  # refuses absolute paths, links out of dest, devices
        else:  # Python without extraction filters: check the names ourselves
            for m in tar.getmembers():
                if m.name.startswith("/") or ".." in Path(m.name).parts or not (m.isfile() or m.isdir()):
                    raise ClusterError(f"refusing a node session with entry {m.name!r}")
            tar.extractall(dest)


# ---------------------------------------------------------------------------------------------- merge
def read_cluster_meta(path: Path) -> dict[str, Any]:
    meta_path = Path(path) / CLUSTER_META
    if not Path(path).is_dir():
        raise SessionError(f"no cluster session at {path}")
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError as e:
        raise SessionError(f"{path} has no {CLUSTER_META}: not a cluster session",
                           "point at the --out directory of `leaktrace cluster hunt`") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SessionError(f"{meta_path} is corrupt ({e.__class__.__name__})") from e
    if not isinstance(meta, dict) or meta.get("schema") != CLUSTER_SCHEMA:
        raise SessionError(f"{meta_path} is not a {CLUSTER_SCHEMA} session")
    return meta


def _node_report(base: Path, entry: dict[str, Any], rerender: bool) -> tuple[dict[str, Any] | None, str | None]:
    """The node's report: re-rendered from its session (``cluster report``), or the one the node wrote."""
    if not entry.get("session"):
        return None, None
    d = Path(entry["session"])
    d = d if d.is_absolute() else base / d
    try:
        if rerender:
            from leaktrace.report import render_session

            return render_session(d), None
        return json.loads((d / "report.json").read_text()), None
    except (SessionError, OSError, json.JSONDecodeError) as e:
        return None, f"session {entry['session']} unreadable: {e}"


def render_cluster(path: str | os.PathLike[str], rerender: bool = False,
                   formats: tuple[str, ...] | list[str] = ("json", "md")) -> dict[str, Any]:
    base = Path(path)
    meta = read_cluster_meta(base)
    node_reports = []
    for entry in meta["nodes"]:
        rep, problem = _node_report(base, entry, rerender)
        entry = dict(entry)
        if problem and entry["status"] == "ok":
            entry["status"], entry["reason"] = "failed", problem
        node_reports.append((entry, rep))
    report = merge_reports(meta, node_reports)
    from leaktrace.report import json_report

    if "json" in formats:
        json_report.write(report, base)
    if "md" in formats:
        atomic_write_text(base / "report.md", render_markdown(report))
    return report


def _tag(item: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    return {**item, "node_id": entry["node_id"], "hostname": entry["hostname"]}


def _culprit_key(c: dict[str, Any]) -> str:
    # Same kind and library on several nodes is the same bug; without a library, the same kind in the
    # same kind of process (label) is the best available match.
    return f"{c.get('kind')}|{c.get('library') or 'label:' + str(c.get('process_label') or '?')}"


def merge_reports(meta: dict[str, Any], node_reports: list[tuple[dict[str, Any], dict[str, Any] | None]]
                  ) -> dict[str, Any]:
    nodes_out, processes, culprits, instances, warnings = [], [], [], [], []
    growth: dict[str, float] = {}
    ledger = {"outstanding_bytes": 0, "events": 0, "lost_events": 0, "available": False}
    durations, attach = [], []
    for entry, rep in node_reports:
        ok = entry["status"] == "ok" and rep is not None
        node = {"node_id": entry["node_id"], "hostname": entry["hostname"], "ip": entry.get("ip"),
                "status": "ok" if ok else "failed",
                "reason": entry.get("reason") if not ok else None,
                "verdict": rep.get("verdict") if ok else None,
                "culprits": [_tag(c, entry) for c in rep.get("culprits", [])] if ok else [],
                "no_targets": bool(entry.get("no_targets")) and not ok,
                "session": entry.get("session"), "targets": entry.get("targets", []),
                "duration_s": rep.get("duration_s") if rep else None,
                "stop_reason": rep.get("stop_reason") if rep else None}
        if not ok and node["reason"] is None:
            node["reason"] = "no report came back"
        nodes_out.append(node)
        if not ok:
            continue
        processes += [_tag(p, entry) for p in rep.get("processes", [])]
        culprits += node["culprits"]
        for inst in rep.get("instances", []) or []:
            instances.append(_tag(inst, entry))
        for cls, v in (rep.get("growth_by_class") or {}).items():
            growth[cls] = round(growth.get(cls, 0.0) + float(v or 0.0), 4)
        led = rep.get("ledger") or {}
        for k in ("outstanding_bytes", "events", "lost_events"):
            ledger[k] += int(led.get(k) or 0)
        ledger["available"] = ledger["available"] or bool(led.get("available"))
        warnings += [f"{entry['hostname']}: {w}" for w in rep.get("warnings", [])]
        if rep.get("duration_s") is not None:
            durations.append(float(rep["duration_s"]))
        if rep.get("attach_s") is not None:
            attach.append(float(rep["attach_s"]))
    culprits.sort(key=lambda c: (-(c.get("mb_per_min") or 0.0), -(c.get("outstanding_bytes") or 0)))

    verdicts = [n["verdict"] for n in nodes_out if n["status"] == "ok"]
    # A node with nothing to hunt (no vLLM there, no match) does not make a clean cluster doubtful; a node
    # whose hunt failed does.
    hunted = [n for n in nodes_out if not n["no_targets"]]
    if "leak" in verdicts:
        verdict = "leak"
    elif verdicts and len(verdicts) == len(hunted) and all(v == "no-leak" for v in verdicts):
        verdict = "no-leak"
    else:
        verdict = "inconclusive"
    failed = [n for n in nodes_out if n["status"] == "failed"]
    return {
        "schema": "leaktrace.report/1",
        "kind": "cluster",
        "verdict": verdict,
        "duration_s": round(max(durations), 3) if durations else 0.0,
        "attach_s": round(max(attach), 3) if attach else None,
        "stop_reason": (f"{meta['stop_reason']}; " if meta.get("stop_reason", "completed") != "completed" else "")
        + f"cluster: {len(nodes_out) - len(failed)} node(s) ok, {len(failed)} failed",
        "address": meta.get("address"),
        "targets": meta.get("targets"),
        "processes": processes,
        "growth_by_class": growth,
        "culprits": culprits,
        "ledger": ledger,
        "instances": instances,
        "roles": _roles(instances, processes),
        "recurring_culprits": _recurring(culprits),
        "nodes": nodes_out,
        "warnings": warnings,
    }


def _recurring(culprits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in culprits:
        groups.setdefault(_culprit_key(c), []).append(c)
    out = []
    for cs in groups.values():
        hosts = sorted({c["hostname"] for c in cs})
        if len(hosts) < 2:
            continue
        out.append({"kind": cs[0].get("kind"), "library": cs[0].get("library"),
                    "process_label": cs[0].get("process_label"), "nodes": hosts,
                    "mb_per_min_total": round(sum(c.get("mb_per_min") or 0.0 for c in cs), 4),
                    "occurrences": len(cs)})
    return sorted(out, key=lambda r: (-len(r["nodes"]), -r["mb_per_min_total"]))


def _instance_pids(inst: dict[str, Any]) -> list[int]:
    pids = inst.get("pids")
    if pids is None:
        pids = [p.get("pid") if isinstance(p, dict) else p for p in inst.get("processes", []) or []]
    return [int(p) for p in pids if p is not None]


def _roles(instances: list[dict[str, Any]], processes: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """vLLM instances grouped by role (prefill, decode, both, unknown), each with its growth summed over
    its processes, so the two sides of a P/D deployment read side by side."""
    by_node_pid = {(p["node_id"], p["pid"]): p for p in processes}
    roles: dict[str, list[dict[str, Any]]] = {}
    for inst in instances:
        procs = [by_node_pid[(inst["node_id"], pid)] for pid in _instance_pids(inst)
                 if (inst["node_id"], pid) in by_node_pid]
        roles.setdefault(str(inst.get("role") or "unknown"), []).append({
            "node_id": inst["node_id"], "hostname": inst["hostname"], "instance": inst.get("instance"),
            "port": inst.get("port"), "pids": _instance_pids(inst),
            "rss_mb_per_min": round(sum(p.get("rss_mb_per_min") or 0.0 for p in procs), 4),
            "anon_mb_per_min": round(sum(p.get("anon_mb_per_min") or 0.0 for p in procs), 4),
            "uss_mb_per_min": round(sum(p.get("uss_mb_per_min") or 0.0 for p in procs), 4),
        })
    order = {"prefill": 0, "decode": 1, "both": 2}
    return dict(sorted(roles.items(), key=lambda kv: order.get(kv[0], 9)))


def render_markdown(report: dict[str, Any]) -> str:
    lines = [f"# leaktrace cluster report — verdict: **{report['verdict']}**", "",
             f"Ray at `{report.get('address')}`, targets `{report.get('targets')}`; "
             f"{report['stop_reason']}; longest node hunt {report['duration_s']:.1f} s.", "",
             "## Nodes", "", "| node | IP | node id | status | verdict | top culprit | reason |",
             "|---|---|---|---|---|---|---|"]
    for n in report["nodes"]:
        top = n["culprits"][0] if n["culprits"] else None
        top_s = (f"{top['kind']} {top.get('library') or ''} pid {top['pid']} {top['mb_per_min']:.2f} MB/min"
                 if top else "—")
        status = n["status"] + (" (no targets)" if n.get("no_targets") else "")
        lines.append(f"| {n['hostname']} | {n.get('ip') or ''} | `{str(n['node_id'])[:12]}` | {status} | "
                     f"{n['verdict'] or '—'} | {top_s} | {n['reason'] or ''} |")
    if report["roles"]:
        lines += ["", "## vLLM instances by role (prefill vs decode)", "",
                  "| role | node | instance | pids | RSS MB/min | anon MB/min | USS MB/min |",
                  "|---|---|---|---|---:|---:|---:|"]
        for role, insts in report["roles"].items():
            for i in insts:
                lines.append(f"| {role} | {i['hostname']} | {i.get('instance')} | "
                             f"{', '.join(map(str, i['pids']))} | {i['rss_mb_per_min']:.2f} | "
                             f"{i['anon_mb_per_min']:.2f} | {i['uss_mb_per_min']:.2f} |")
    if report["recurring_culprits"]:
        lines += ["", "## Culprits recurring across nodes", ""]
        for r in report["recurring_culprits"]:
            lines.append(f"- {r['kind']} {r.get('library') or '(library unknown, ' + str(r['process_label']) + ')'}"
                         f" on {', '.join(r['nodes'])}: {r['mb_per_min_total']:.2f} MB/min in total")
    lines += ["", "## Processes", "", "| node | pid | label | RSS MB/min | anon MB/min | USS MB/min |",
              "|---|---:|---|---:|---:|---:|"]
    for p in report["processes"]:
        lines.append(f"| {p['hostname']} | {p['pid']} | {p['label']} | {p['rss_mb_per_min']:.2f} | "
                     f"{p['anon_mb_per_min']:.2f} | {p['uss_mb_per_min']:.2f} |")
    lines += ["", "## Culprits", ""]
    if not report["culprits"]:
        lines.append("None.")
    for i, c in enumerate(report["culprits"], 1):
        lines.append(f"### {i}. {c['hostname']}: {c['kind']} — {c.get('library') or 'unknown library'} "
                     f"(pid {c['pid']}, {c.get('process_label') or '?'}): {c['mb_per_min']:.2f} MB/min")
        lines += [f"- {e}" for e in c.get("evidence", [])]
        if c.get("stack"):
            lines += ["", "```", *c["stack"], "```"]
        if c.get("remedy"):
            lines += ["", f"**Remedy:** {c['remedy']}"]
        lines.append("")
    failed = [n for n in report["nodes"] if n["status"] == "failed"]
    if failed:
        lines += ["", "## Failed nodes", ""]
        lines += [f"- {n['hostname']} (`{str(n['node_id'])[:12]}`): {n['reason']}" for n in failed]
    lines += ["", "Per-node sessions: `nodes/<node>/` (re-render one with `leaktrace report`)."]
    return "\n".join(lines) + "\n"
