"""How each target that ended during the hunt ended: exited with a status, killed by a signal, OOM-killed,
or unknown — from the kernel when the eBPF probe saw the exit (``ledger_exits``: the wait status and the OOM
killer's mark), else from /proc while the process was an unreaped zombie (the watcher's ``processes`` exit
row), else honestly unknown. A target that died while the eBPF program compiled (``bpf_missed``) says so,
with how long before the probe went live it was last seen alive.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from leaktrace.procfs.exits import describe_exit, exit_phrase
from leaktrace.session import TableSource


def _code(v: Any) -> int | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return None if int(v) < 0 else int(v)


def _last_alive(reader: TableSource, pid: int) -> float | None:
    """When the watcher last saw ``pid`` alive (its last /proc sample, else its first sighting)."""
    rollup = reader.table("rollup")
    if not rollup.empty and (rollup["pid"] == pid).any():
        return float(rollup.loc[rollup["pid"] == pid, "t"].max())
    procs = reader.table("processes")
    if not procs.empty:
        seen = procs[(procs["pid"] == pid) & (procs["event"] == "seen")]
        if not seen.empty:
            return float(seen["t"].min())
    return None


def process_exits(reader: TableSource) -> dict[int, dict[str, Any]]:
    """pid -> the ``exit`` block (``how``, ``status``, ``signal``, ``core``, ``source``, ``t``, and for a target
    the eBPF probe never saw alive, ``before_ebpf`` and a ``note``) of every process that ended."""
    exited = {int(k): float(v) for k, v in (reader.meta.get("exited", {}) or {}).items() if v is not None}
    out: dict[int, dict[str, Any]] = {}
    lx = reader.table("ledger_exits")
    if not lx.empty:
        for r in lx.itertuples():
            ex = describe_exit(_code(r.exit_code), oom=bool(r.oom) and not pd.isna(r.oom), source="ebpf")
            out[int(r.pid)] = {**ex, "t": round(float(r.t), 3)}
    procs = reader.table("processes")
    if not procs.empty:
        for r in procs[procs["event"] == "exit"].itertuples():
            code = _code(r.exit_code)
            if int(r.pid) not in out and code is not None:
                out[int(r.pid)] = {**describe_exit(code, source="proc"), "t": round(float(r.t), 3)}
                if out[int(r.pid)]["signal"] == "SIGKILL":
                    out[int(r.pid)]["note"] = ("/proc cannot tell the OOM killer's SIGKILL from anyone else's: "
                                               "the eBPF probe can")
    missed = reader.table("bpf_missed")
    missed_at = {int(r.pid): (float(r.t), _code(r.exit_code)) for r in missed.itertuples()} if not missed.empty else {}
    for pid, t in exited.items():
        if pid not in out:
            code = missed_at.get(pid, (0.0, None))[1]
            out[pid] = {**describe_exit(code, source="proc" if code is not None else None), "t": round(t, 3)}
    for pid, (live_t, _) in missed_at.items():
        ex = out.setdefault(pid, {**describe_exit(None), "t": None})
        alive = _last_alive(reader, pid)
        before = f"{live_t - alive:.1f} s" if alive is not None else "an unknown time"
        seen = f"last seen alive by the watcher at t={alive:.1f} s" if alive is not None else "never seen alive"
        ex.update(before_ebpf=True, ebpf_live_s=round(live_t, 3),
                  note=f"exited at most {before} before the eBPF probe was live (t={live_t:.1f} s; {seen}): "
                       "nothing it mapped was traced, only the watcher's /proc samples exist")
    return out


def describe(ex: dict[str, Any] | None) -> str:
    """One line for the reports: how it ended, when, and what is missing."""
    if not ex:
        return ""
    when = ""
    if ex.get("t") is not None:
        when = f" at t={ex['t']:.1f} s" if ex.get("source") == "ebpf" else f" (seen gone at t={ex['t']:.1f} s)"
    text = exit_phrase(ex) + when
    if ex.get("source") == "proc":
        text += " (wait status read from /proc)"
    return text + (f"; {ex['note']}" if ex.get("note") else "")
