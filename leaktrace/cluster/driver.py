"""The driver side: connect to Ray, pin one hunt task per node, collect the answers (Ctrl-C included), write the cluster session."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from leaktrace.atomic import atomic_write_text
from leaktrace.cluster.merge import render_cluster
from leaktrace.cluster.node import run_node_hunt, stop_node_hunts
from leaktrace.cluster.request import (
    CLUSTER_META,
    CLUSTER_SCHEMA,
    INSTALL_HINT,
    NODES_DIR,
    STOP_GRACE_S,
    ClusterRequest,
    node_label,
)
from leaktrace.errors import ClusterError, UsageError


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
    except Exception as e:  # Ray raises many types for one meaning here
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
    wire = {"run_id": run_id, "hunt": asdict(request.hunt), "vllm": request.vllm,
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
            except Exception:  # best effort; the node-side hunt is bounded by its duration
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
            "no_targets": bool(a.get("no_targets")), "notes": list(a.get("notes") or []),
            "leaktrace": a.get("leaktrace"),
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
            except Exception as e:  # a task/node failure is that node's result
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


