"""What a cluster hunt was asked: targets per node, node selectors, hunt options, time limits."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from leaktrace.errors import UsageError
from leaktrace.huntspec import HuntSpec

CLUSTER_SCHEMA = "leaktrace.cluster/1"
CLUSTER_META = "cluster.json"
NODES_DIR = "nodes"
INSTALL_HINT = "pip install 'leaktrace[cluster]'"
# Seconds a node may take beyond --duration: Ray worker start, probe attach, report rendering, transfer.
DEFAULT_GRACE_S = 120.0
# After Ctrl-C: how long the driver waits for the stopped node hunts to answer with their sessions. As long
# as DEFAULT_GRACE_S and more: a stopped hunt on a loaded node still joins its gdb and Python-heap threads,
# makes its last walks, drains eBPF and renders its report, and the stop task needs a Ray worker of its own
# first. A second Ctrl-C stops waiting.
STOP_GRACE_S = 180.0


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
    hunt: HuntSpec = field(default_factory=HuntSpec)  # every node's hunt; there it gets its targets and --out
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
    def duration(self) -> float:
        return self.hunt.duration

    @property
    def timeout_s(self) -> float:
        return self.node_timeout if self.node_timeout is not None else self.duration + DEFAULT_GRACE_S

def node_label(hostname: str | None, node_id: str | None) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", hostname or "node")
    return f"{safe}-{(node_id or 'unknown')[:8]}"
