"""Targets that ended while the eBPF program compiled: nothing of theirs was traced, and the session says so."""

from __future__ import annotations

from leaktrace import procfs
from leaktrace.errors import AccessDenied, ProcessGone
from leaktrace.probes import HuntContext


def missed_at_attach(ctx: HuntContext, attach_s: float | None) -> None:
    """Targets that ended while the program compiled (seconds under load): nothing of theirs was traced.
    Said plainly (``bpf_missed`` rows: t = when the probe went live, pid, exit_code when still a zombie)."""
    rows = []
    for pid in ctx.targets.live():
        try:
            text = procfs.read_proc_text(pid, "stat")
            if procfs.stat_field(text, 3) != "Z":
                continue
            code = int(procfs.stat_field(text, 52))
        except (ProcessGone, AccessDenied, OSError, ValueError):
            code = -1
        rows.append({"t": ctx.session.now(), "pid": pid, "exit_code": code})
        ctx.warn(f"pid {pid} exited before the eBPF probe was live (compiling and attaching took "
                 f"{attach_s or 0.0:.1f}s): none of its mappings were traced; the watcher's rows are all there is")
    if rows:
        ctx.session.append("bpf_missed", rows)
