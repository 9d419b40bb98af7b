"""Which process trees the watch follows, chosen again at every tick: the --pid roots (one that ended stays
gone: its pid may be reused), every vLLM server (--vllm), or every process whose command line matches
--match (the selection of `cluster hunt --match`: leaktrace's own processes and this one's ancestors
excluded). Each process also gets its label, P/D role and instance for the metrics."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from leaktrace import procfs
from leaktrace.cluster.node import match_processes
from leaktrace.errors import AccessDenied, ProcessGone
from leaktrace.vllm.labels import classify_argv


@dataclass
class Info:
    label: str = "other"
    role: str = "unknown"
    instance: str = ""


@dataclass
class Selector:
    pids: list[int] = field(default_factory=list)
    vllm: bool = False
    match: str | None = None
    _starttime: dict[int, int] = field(default_factory=dict)
    _gone: set[int] = field(default_factory=set)
    info: dict[int, Info] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.match is not None:
            re.compile(self.match)  # the command checked it: fails here only for library callers

    def roots(self) -> list[int]:
        """The roots to follow now."""
        found: list[int] = []
        for pid in self.pids:
            if pid not in self._gone and self._same(pid):
                found.append(pid)
            else:
                self._gone.add(pid)
        if self.match is not None:
            found += [p["pid"] for p in match_processes(self.match)]
        if self.vllm:
            found += self._vllm()
        return sorted(set(found))

    def _vllm(self) -> list[int]:
        from leaktrace.vllm.discover import instance_members

        roots = []
        for pid, (label, role, inst) in instance_members().items():
            self.info[pid] = Info(label or "other", role or "unknown", str(inst))
            if pid == inst:
                roots.append(pid)
        return roots

    def _same(self, pid: int) -> bool:
        try:
            st = int(procfs.read_stat(pid)["starttime"])  # type: ignore[call-overload]
        except (ProcessGone, AccessDenied, procfs.ParseError, IndexError, ValueError):
            return False
        return self._starttime.setdefault(pid, st) == st

    def describe(self, pid: int, root: int) -> Info:
        """label, role and instance of ``pid`` (a process of the tree rooted at ``root``)."""
        if pid in self.info:
            return self.info[pid]
        try:
            label = classify_argv(procfs.read_cmdline(pid))[0]
        except (ProcessGone, AccessDenied):
            label = "other"
        info = Info(label, "unknown", str(root))
        self.info[pid] = info
        return info

    def forget(self, pid: int) -> None:
        self.info.pop(pid, None)


def selection(options: Any) -> str:
    parts = [f"--pid {p}" for p in options.pids]
    if options.vllm:
        parts.append("--vllm")
    if options.match is not None:
        parts.append(f"--match {options.match!r}")
    return " ".join(parts)
