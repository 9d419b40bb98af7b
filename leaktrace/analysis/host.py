"""Host memory that no hunted process holds: report.json's ``host.mem_available_mb_per_min`` and
``host.unattributed_mb_per_min``, and a culprit when the host loses memory the hunted processes do not
explain (tables ``host_memory`` and ``host_procs`` of the host probe, leaktrace/probes/host.py).

The host's loss is the fall of MemAvailable (its rate over the hunt, noise-aware as every rate:
analysis/growth.rate). What processes explain is the growth of every process's anonymous memory (meminfo's
AnonPages: the series judged is MemAvailable + AnonPages, in which a process's allocation cancels, so other
workloads of a shared host coming and going by hundreds of MB a second leave it alone; and + the free pages the
kernel parks in its per-CPU lists, out of MemAvailable, by hundreds of MB under an allocator's churn) and the hunted
processes' growth beyond their anonymous memory (PSS less anonymous: their shared and file pages). What is
left — ``unattributed`` — is host
memory no process holds: pinned host buffers a driver keeps (a GPU runtime's pinned staging pages, RDMA
registrations), tmpfs and shared-memory files nobody maps, kernel memory. The host's figures still carry
other noise (page cache, slab), so a culprit needs a rate well above the process leak rate that clears it
with its uncertainty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from leaktrace.analysis.candidates import Candidate
from leaktrace.analysis.growth import Rate, rate
from leaktrace.analysis.leaking import THRESHOLDS, clears
from leaktrace.session import TableSource

# A host loss counts from this rate (MB/min): the host's figures are noisier than one process's.
HOST_MB_PER_MIN = 10.0
# ... and from this much lost over the window (MB): a few MB a quarter of a minute come and go on an idle VM with
# no meminfo figure moving (a balloon driver, reclaimable caches resized), 19-37 MB/min over a 15 s hunt of a
# flat target; a driver's pinned-buffer leak loses hundreds of MB a minute.
HOST_MIN_LOSS_MB = 64.0
# A meminfo figure growing by this share of the unattributed loss says what holds it.
OTHERS_SHARE = 0.5
# meminfo figures stated in the evidence: (column, what it is).
BREAKDOWN = (("shmem", "Shmem (tmpfs and shared-memory files, mapped or not)"),
             ("unevictable", "Unevictable (pinned or locked pages)"), ("mlocked", "Mlocked"),
             ("anon_pages", "AnonPages (every process's anonymous memory)"), ("mapped", "Mapped"),
             ("vmalloc_used", "VmallocUsed (kernel: BPF maps, driver buffers)"),
             ("slab_unreclaimable", "SUnreclaim (kernel slab)"), ("kernel_stack", "KernelStack"),
             ("page_tables", "PageTables"))
KERNEL = ("vmalloc_used", "slab_unreclaimable", "kernel_stack", "page_tables")


@dataclass
class HostMemory:
    loss: Rate  # of the host's MemAvailable falling (per_s > 0: memory lost)
    # ... of MemAvailable + AnonPages falling: lost outside every process's anonymous memory (a process that
    # allocates moves both by the same bytes, so other workloads' swings cancel in it); ``loss`` without AnonPages
    unheld: Rate
    hunted_mb_per_min: float  # the hunted processes' PSS growth together
    hunted_anon_mb_per_min: float
    meminfo_mb_per_min: dict[str, float] = field(default_factory=dict)  # growth of each BREAKDOWN column
    pinned_mb_per_min: dict[str, float] = field(default_factory=dict)  # hunted VmPin / VmLck growth
    # the hunted processes' memory held by descriptors and not mapped (held_files): theirs, though no RSS shows it
    held_mb_per_min: float = 0.0

    @property
    def mem_available_mb_per_min(self) -> float:
        return -self.loss.mb_per_min

    @property
    def others_anon_mb_per_min(self) -> float:
        """Every other process's anonymous growth (0 when meminfo's AnonPages was not sampled)."""
        if "anon_pages" not in self.meminfo_mb_per_min:
            return 0.0
        return self.meminfo_mb_per_min["anon_pages"] - self.hunted_anon_mb_per_min

    @property
    def explained_mb_per_min(self) -> float:
        """What processes explain of ``unheld``: the hunted processes' growth beyond their anonymous memory
        (every process's anonymous memory is already out of it), or all of it when AnonPages is unknown."""
        if "anon_pages" not in self.meminfo_mb_per_min:
            return self.hunted_mb_per_min + self.held_mb_per_min
        return self.hunted_mb_per_min - self.hunted_anon_mb_per_min + self.held_mb_per_min

    @property
    def unattributed_mb_per_min(self) -> float:
        return self.unheld.mb_per_min - self.explained_mb_per_min


def _rate_of(df: pd.DataFrame, col: str) -> Rate | None:
    d = df[["t", col]].dropna()
    if len(d) < 3:
        return None
    return rate(d["t"].to_numpy(dtype=float), d[col].to_numpy(dtype=float))


def _sum_rate(df: pd.DataFrame, col: str) -> float:
    """MB/min of the sum over processes of ``col`` (host_procs): each process's own rate, added."""
    total = 0.0
    for _pid, g in df.groupby("pid"):
        r = _rate_of(g.sort_values("t"), col)
        total += r.mb_per_min if r is not None else 0.0
    return total


def host_memory(reader: TableSource, procs: pd.DataFrame) -> HostMemory | None:
    """The host's memory figures of a session whose host probe ran (None otherwise: too few samples)."""
    hm = reader.table("host_memory") if "host_memory" in reader.tables() else pd.DataFrame()
    if hm.empty:
        return None
    hm = hm.sort_values("t")
    avail = hm[["t", "mem_available"]].dropna()
    if len(avail) < 3:
        return None
    loss = rate(avail["t"].to_numpy(dtype=float), -avail["mem_available"].to_numpy(dtype=float))
    both = hm[["t", "mem_available", "anon_pages"]].dropna()
    # free pages parked in the per-CPU lists are out of MemAvailable: free memory, held by no one
    pcp = hm["pcp_free"] if "pcp_free" in hm and hm["pcp_free"].notna().all() else 0
    unheld = loss if len(both) < len(avail) else rate(
        both["t"].to_numpy(dtype=float),
        -(both["mem_available"] + both["anon_pages"] + pcp).to_numpy(dtype=float))
    hunted = float(procs["pss_mb_per_min"].sum()) if not procs.empty else 0.0
    hunted_anon = float(procs["anon_mb_per_min"].sum()) if not procs.empty else 0.0
    out = HostMemory(loss, unheld, hunted, hunted_anon)
    for col, _what in BREAKDOWN:
        r = _rate_of(hm, col)
        if r is not None:
            out.meminfo_mb_per_min[col] = r.mb_per_min
    hp = reader.table("host_procs") if "host_procs" in reader.tables() else pd.DataFrame()
    if not hp.empty:
        for col in ("vm_pin", "vm_lck"):
            out.pinned_mb_per_min[col] = _sum_rate(hp, col)
    held = reader.table("held_files") if "held_files" in reader.tables() else pd.DataFrame()
    if not held.empty:
        out.held_mb_per_min = _sum_rate(held, "bytes")
    return out


def host_block(h: HostMemory | None) -> dict[str, Any]:
    """report.json's ``host`` figures (none when the host probe did not run: sessions recorded without it)."""
    if h is None:
        return {}
    return {"mem_available_mb_per_min": round(float(h.mem_available_mb_per_min), 4),
            "unattributed_mb_per_min": round(float(h.unattributed_mb_per_min), 4)}


def is_unexplained_loss(h: HostMemory, th: dict[str, float] = THRESHOLDS) -> bool:
    """The host loses memory steadily that neither the hunted processes nor other processes' anonymous
    memory explain, above HOST_MB_PER_MIN with its uncertainty and HOST_MIN_LOSS_MB in all."""
    r = h.unheld
    lower = r.lower_mb_per_min - h.explained_mb_per_min if np.isfinite(r.lower_per_s) else None
    lost_mb = h.unattributed_mb_per_min * r.span_s / 60.0
    return (h.unattributed_mb_per_min >= HOST_MB_PER_MIN and clears(lower, HOST_MB_PER_MIN)
            and lost_mb >= HOST_MIN_LOSS_MB
            and r.confidence >= th["min_confidence"] and r.span_s >= th["min_span_s"] and not r.step
            and r.stop is None)


def _where(h: HostMemory) -> str:
    """What the meminfo figures say holds the lost memory."""
    u, m = h.unattributed_mb_per_min, h.meminfo_mb_per_min
    if m.get("shmem", 0.0) >= OTHERS_SHARE * u:
        return ("tmpfs or shared-memory files (meminfo's Shmem grows with it) that no hunted process maps: files "
                "kept in /dev/shm or another tmpfs after their users unmapped them")
    if max(m.get("unevictable", 0.0), m.get("mlocked", 0.0), *h.pinned_mb_per_min.values(), 0.0) >= OTHERS_SHARE * u:
        return "pinned or locked pages (meminfo's Unevictable/Mlocked or the hunted processes' VmPin/VmLck grow with it)"
    if sum(m.get(k, 0.0) for k in KERNEL) >= OTHERS_SHARE * u:
        return ("kernel memory (meminfo's VmallocUsed, SUnreclaim, KernelStack or PageTables grow with it): driver or "
                "BPF allocations, kernel objects")
    return ("memory outside every process's anonymous and shared pages and outside the kernel's counted memory: "
            "driver allocations (pinned host memory of a GPU or RDMA runtime, not mapped as process memory)")


def host_candidate(h: HostMemory | None, th: dict[str, float] = THRESHOLDS) -> Candidate | None:
    """A culprit candidate (kind other, no library, pid 0: the host) for a loss no hunted process explains."""
    if h is None or not is_unexplained_loss(h, th):
        return None
    r, u = h.loss, h.unheld
    breakdown = ", ".join(f"{what} {h.meminfo_mb_per_min[col]:+.1f}" for col, what in BREAKDOWN
                          if col in h.meminfo_mb_per_min)
    ev = [f"the host's MemAvailable falls {r.mb_per_min:.2f} MB/min; of it, {u.mb_per_min:.2f} MB/min outside every "
          f"process's anonymous memory (MemAvailable + AnonPages, Theil-Sen over {u.n} samples, {u.span_s:.0f} s, "
          f"confidence {u.confidence:.2f}); the hunted processes' memory (PSS, together) grows "
          f"{h.hunted_mb_per_min:.2f} MB/min, other processes' anonymous memory {h.others_anon_mb_per_min:.2f} MB/min: "
          f"{h.unattributed_mb_per_min:.2f} MB/min lost that no process holds",
          f"/proc/meminfo, MB/min: {breakdown}" if breakdown else ""]
    if h.held_mb_per_min >= HOST_MB_PER_MIN:
        ev.append(f"held open by descriptors of the hunted processes and not mapped: {h.held_mb_per_min:+.2f} MB/min, "
                  "counted as theirs (their shm culprits, held_by fd), not as lost")
    if h.pinned_mb_per_min:
        ev.append("pinned by the hunted processes (/proc/PID/status), MB/min: "
                  + ", ".join(f"{'VmPin' if k == 'vm_pin' else 'VmLck'} {v:+.2f}" for k, v in h.pinned_mb_per_min.items()))
    return Candidate(kind="other", pid=0, mb_per_min=h.unattributed_mb_per_min, source="host", cls="host",
                     title="host", evidence=[e for e in ev if e],
                     extra={"rule_fields": {"host_where": _where(h),
                                            "mem_available_mb_per_min": f"{h.mem_available_mb_per_min:.2f}"},
                            "raw_mb_per_min": h.unattributed_mb_per_min})



def add_host_culprit(findings: Any, h: HostMemory | None, reader: TableSource, verdict: str, why: str,
                     th: dict[str, float] = THRESHOLDS) -> tuple[str, str]:
    """Appends the host-level culprit to ``findings`` (analysis/culprits.Findings) when the host loses memory
    that no hunted process explains — after the processes' own culprits, explained by its rule — and returns
    the verdict and its reason with it (a leak, of the host's memory)."""
    from leaktrace.analysis.culprits import explain
    from leaktrace.analysis.rules import load_rules

    c = host_candidate(h, th)
    if c is None:
        return verdict, why
    if verdict != "leak":
        findings.culprits.clear()  # the processes' candidates did not make a leak: the host's is the culprit
    findings.candidates.append(c)
    findings.culprits.append(explain(c, load_rules(), reader))
    told = (f"the host loses {c.mb_per_min:.2f} MB/min of memory that no process holds (≥ {HOST_MB_PER_MIN} "
            f"MB/min steadily, clearing its noise, ≥ {HOST_MIN_LOSS_MB:.0f} MB in all)")
    return "leak", f"{why}; {told}" if verdict == "leak" else told
