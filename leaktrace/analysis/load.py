"""Load correlation (pure: a SessionReader in, dicts out) for report.json ``instances`` and ``load``.

* ``instances(reader)``: one entry per vLLM server found by the vllm probe, with its role (and where the
  role came from), port, model and processes, plus the memory growth of its processes.
* ``load(reader)``: requests, generated tokens and KV transfers counted during the hunt from the /metrics
  scrapes (counter deltas, resets tolerated), the memory growth over the same time, MB per 1,000
  requests, and whether the growth follows load or time: memory is fitted against cumulative requests and
  against time; when the request rate varied during the hunt the better fit tells which (a leak per
  request grows only while requests flow; a timer- or poll-driven leak grows through idle time too). With
  a steady load both fit alike and the answer is ``undetermined``.
* ``python_heap(reader)``: first/last GC state per process from the pyheap probe (``processes[].python``).

Memory is the sum of the processes' RSS from the watcher's ``rollup`` table (each process counted once;
vLLM's CPU build spawns, so no copy-on-write sharing inflates the sum).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from leaktrace.analysis.growth import MB
from leaktrace.errors import SessionError
from leaktrace.session import TableSource
from leaktrace.slope import theil_sen

# Points of the pairwise slope of a load series (growth per request): what this analysis always used.
LOAD_SLOPE_POINTS = 400
COUNTERS = ("requests", "prompt_tokens", "generation_tokens", "nixl_transfers", "nixl_bytes",
            "kv_external_prompt_tokens", "nixl_failed")


def _table(reader: TableSource, name: str) -> pd.DataFrame:
    try:
        df = reader.table(name)
    except SessionError:
        raise  # columns that disagree with their declaration (session.tables): never "no data"
    except Exception:  # a missing or unreadable table is "no data", never a crash
        return pd.DataFrame()
    return df if df is not None else pd.DataFrame()


def _r2(x: np.ndarray, y: np.ndarray) -> float | None:
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    c = np.corrcoef(x, y)[0, 1]
    return float(c * c) if np.isfinite(c) else None


def memory_series(reader: TableSource, pids: list[int] | None = None, column: str = "rss") -> pd.DataFrame:
    """Sum of ``column`` (bytes) over ``pids`` per tick: DataFrame[t, bytes]. Ticks where a process of the
    set has no sample are dropped, so a late-born process does not look like growth."""
    roll = _table(reader, "rollup")
    if roll.empty:
        return pd.DataFrame(columns=["t", "bytes"])
    if pids is not None:
        roll = roll[roll["pid"].isin(pids)]
    if roll.empty:
        return pd.DataFrame(columns=["t", "bytes"])
    # Ticks are written per process with slightly different t: bucket them by tick order per pid.
    roll = roll.sort_values("t").copy()
    roll["tick"] = roll.groupby("pid").cumcount()
    present = roll.groupby("tick")["pid"].nunique()
    full = present[present == present.max()].index
    g = roll[roll["tick"].isin(full)].groupby("tick").agg(t=("t", "mean"), bytes=(column, "sum"))
    return g.reset_index(drop=True)


def _counter_delta(values: pd.Series) -> float:
    """Increase of a counter over the hunt; a reset (server restart) counts from zero."""
    v = values.dropna().to_numpy(dtype=float)
    if len(v) < 2:
        return 0.0
    d = np.diff(v)
    return float(np.where(d >= 0, d, v[1:]).sum())


def _cumulative(values: pd.Series) -> np.ndarray:
    v = values.ffill().fillna(0).to_numpy(dtype=float)
    d = np.diff(v, prepend=v[0])
    d = np.where(d >= 0, d, v)
    return np.cumsum(d)


def _growth(series: pd.DataFrame) -> tuple[float, float]:
    """(MB over the series' span, MB per minute) from the robust slope."""
    if len(series) < 2:
        return 0.0, 0.0
    t = series["t"].to_numpy(dtype=float)
    y = series["bytes"].to_numpy(dtype=float)
    s = theil_sen(t, y, max_points=LOAD_SLOPE_POINTS)[0]
    return s * (t[-1] - t[0]) / MB, s * 60 / MB


def _follows(series: pd.DataFrame, scrapes: pd.DataFrame, growth_mb: float, requests: float) -> dict[str, Any]:
    out: dict[str, Any] = {"follows": "undetermined", "r2_time": None, "r2_load": None}
    if len(series) < 3:
        out["why"] = "too few memory samples"
        return out
    if abs(growth_mb) < 1.0:
        out.update(follows="none", why="memory did not grow by 1 MB or more")
        return out
    if requests <= 0:
        out.update(follows="time", why="memory grew while no request completed")
        return out
    if scrapes.empty or len(scrapes) < 3:
        out["why"] = "too few /metrics scrapes"
        return out
    st = scrapes["t"].to_numpy(dtype=float)
    cum = _cumulative(scrapes["requests"])
    t = series["t"].to_numpy(dtype=float)
    y = series["bytes"].to_numpy(dtype=float)
    req_at = np.interp(t, st, cum)
    r2t, r2l = _r2(t, y), _r2(req_at, y)
    out.update(r2_time=r2t, r2_load=r2l)
    # Requests ~ time when the rate was steady: then the data cannot tell the two apart.
    steady = _r2(t, req_at)
    out["r2_requests_vs_time"] = steady
    if r2t is None or r2l is None:
        out["why"] = "flat series"
    elif steady is not None and steady > 0.98:
        out["why"] = "the request rate was steady during the hunt; vary it (pauses) to tell load from time"
    elif r2l > r2t + 0.05:
        out.update(follows="load", why="memory tracks cumulative requests better than time")
    elif r2t > r2l + 0.05:
        out.update(follows="time", why="memory tracks time better than cumulative requests (grows when idle)")
    else:
        out["why"] = "load and time fit alike"
    return out


def _metrics_by_url(reader: TableSource) -> dict[str, pd.DataFrame]:
    ms = _table(reader, "metrics_summary")
    if ms.empty:
        return {}
    ms = ms[ms["ok"].fillna(False).astype(bool)]
    return {url: g.sort_values("t") for url, g in ms.groupby("url")}


def _instances_meta(reader: TableSource) -> list[dict[str, Any]]:
    insts = (reader.meta or {}).get("instances") or []
    if insts:
        return insts
    vp = _table(reader, "vllm_processes")
    if vp.empty:
        return []
    out: dict[int, dict[str, Any]] = {}
    for r in vp.sort_values("t").itertuples():
        if pd.isna(r.instance):
            continue
        i = out.setdefault(int(r.instance), {"instance": int(r.instance), "role": r.role, "port": r.port,
                                             "model": r.model, "role_source": r.role_source, "pids": [],
                                             "processes": []})
        if int(r.pid) not in i["pids"]:
            i["pids"].append(int(r.pid))
            i["processes"].append({"pid": int(r.pid), "ppid": int(r.ppid), "label": r.label, "title": r.title})
    return list(out.values())


def instances(reader: TableSource) -> list[dict[str, Any]]:
    """report.json ``instances``: one per vLLM server, with role, processes and their memory growth."""
    out = []
    vp = _table(reader, "vllm_processes")
    for inst in _instances_meta(reader):
        pids = list(inst.get("pids") or [])
        if not vp.empty:
            pids = sorted(set(pids) | set(vp.loc[vp["instance"] == inst["instance"], "pid"].astype(int)))
        growth_mb, per_min = _growth(memory_series(reader, pids))
        kv = inst.get("kv_transfer_config")
        out.append({
            "instance": int(inst["instance"]), "role": inst.get("role", "unknown"),
            "role_source": inst.get("role_source"), "port": inst.get("port"), "model": inst.get("model"),
            "kv_connector": kv.get("kv_connector") if isinstance(kv, dict) else None,
            "pids": pids, "processes": inst.get("processes", []),
            "rss_growth_mb": round(growth_mb, 3), "rss_mb_per_min": round(per_min, 3),
        })
    return out


def requests_by_pid(reader: TableSource) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Each process of a scraped vLLM server: (times, cumulative requests) of its server from /metrics,
    on the session's clock (the work a leak per request follows; growth.rate's ``work``)."""
    by_url = _metrics_by_url(reader)
    if not by_url:
        return {}
    urls = (reader.meta or {}).get("metrics_urls") or {}
    pids = {i["instance"]: i["pids"] for i in instances(reader)}
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for url, g in by_url.items():
        inst = urls.get(url)
        if inst is None or inst not in pids or len(g) < 2:
            continue
        series = (g["t"].to_numpy(dtype=float), _cumulative(g["requests"]))
        out.update(dict.fromkeys(pids[inst], series))
    return out


def load(reader: TableSource) -> dict[str, Any] | None:
    """report.json ``load``; None when no /metrics scrape succeeded."""
    by_url = _metrics_by_url(reader)
    if not by_url:
        return None
    insts = {i["instance"]: i for i in instances(reader)}
    urls = (reader.meta or {}).get("metrics_urls") or {}
    per: list[dict[str, Any]] = []
    totals = dict.fromkeys(COUNTERS, 0.0)
    for url, g in by_url.items():
        inst = urls.get(url)
        if inst is None and g["instance"].notna().any():
            inst = int(g["instance"].dropna().iloc[0])
        deltas = {c: _counter_delta(g[c]) for c in COUNTERS}
        for c in COUNTERS:
            totals[c] += deltas[c]
        entry: dict[str, Any] = {"url": url, "instance": inst, "scrapes": int(len(g)),
                                 "span_s": round(float(g["t"].iloc[-1] - g["t"].iloc[0]), 3),
                                 **_counts(deltas)}
        if inst is not None and inst in insts:
            i = insts[inst]
            series = memory_series(reader, i["pids"])
            growth_mb, per_min = _growth(series)
            entry.update(role=i["role"], growth_mb=round(growth_mb, 3), mb_per_min=round(per_min, 3),
                         mb_per_1k_requests=_per_1k(growth_mb, deltas["requests"]),
                         **_follows(series, g, growth_mb, deltas["requests"]))
        per.append(entry)
    # In P/D serving each user request is counted twice, once by prefill (max_tokens=1) and once by
    # decode: count the requests and tokens of the instances that produce the answers.
    answering = [e for e in per if e.get("role") in ("decode", "both")]
    if answering and len(answering) < len(per):
        for c in ("requests", "generation_tokens", "prompt_tokens"):
            key = {"generation_tokens": "generated_tokens"}.get(c, c)
            totals[c] = float(sum(e[key] for e in answering))
        prefill_requests = sum(e["requests"] for e in per if e.get("role") == "prefill")
    else:
        prefill_requests = None
    series = memory_series(reader, None)
    growth_mb, per_min = _growth(series)
    all_scrapes = pd.concat(by_url.values()).sort_values("t")
    # Cumulative requests over all URLs: each URL's own cumulative series summed on a common clock.
    merged = _merged_requests(by_url)
    follow = _follows(series, merged if not merged.empty else all_scrapes, growth_mb, totals["requests"])
    # (the merged cumulative series may include prefill's requests: the fit is scale-free, so it
    # still tells load from time)
    span = float(all_scrapes["t"].iloc[-1] - all_scrapes["t"].iloc[0]) if len(all_scrapes) > 1 else 0.0
    return {
        "source": "/metrics", "span_s": round(span, 3), **_counts(totals),
        "counted_on": "decode/both instances" if prefill_requests is not None else "every scraped server",
        "prefill_requests": prefill_requests,
        "growth_mb": round(growth_mb, 3), "mb_per_min": round(per_min, 3),
        "mb_per_1k_requests": _per_1k(growth_mb, totals["requests"]),
        **follow, "per_instance": per,
    }


def leak_per_load(load_block: dict[str, Any], culprits: list[dict[str, Any]]) -> None:
    """Add what the leak costs per unit of work to ``load_block`` (in place): bytes leaked per request and per
    KV-transfer token, overall and per instance. "Leaked" is the culprits' rate (what leaktrace attributes,
    not the RSS slope, which includes warm-up), over the rate of requests and of tokens whose KV moved by
    the connector during the same scrapes. A token's KV is sent by prefill and received by decode: each side's
    per-token figure divides by the tokens that moved (decode's ``external_kv_transfer`` prompt tokens)."""
    def rates(entries: list[dict[str, Any]], span_s: float) -> tuple[float | None, float | None]:
        if span_s <= 0:
            return None, None
        per_min = 60.0 / span_s
        return (sum(e.get("requests", 0) for e in entries) * per_min or None,
                sum(e.get("kv_external_prompt_tokens", 0) for e in entries) * per_min or None)

    def per(leak_mb_min: float, req_min: float | None, tok_min: float | None) -> dict[str, Any]:
        b = leak_mb_min * MB
        return {"leak_mb_per_min": round(leak_mb_min, 4),
                "leak_bytes_per_request": round(b / req_min, 1) if req_min else None,
                "leak_bytes_per_kv_token": round(b / tok_min, 1) if tok_min else None}

    per_inst = load_block.get("per_instance") or []
    # The tokens that moved: counted where they arrive (decode/both); else wherever they were counted.
    arriving = [e for e in per_inst if e.get("kv_external_prompt_tokens", 0) > 0] or per_inst
    span = float(load_block.get("span_s") or 0.0)
    _, tok_min = rates(arriving, span)
    req_min = load_block.get("requests", 0) * 60.0 / span if span > 0 and load_block.get("requests") else None
    load_block.update(per(sum(c.get("mb_per_min", 0.0) for c in culprits), req_min, tok_min))
    for e in per_inst:
        mine = [c for c in culprits if e.get("instance") is not None and c.get("instance") == e["instance"]]
        e_req, e_tok = rates([e], float(e.get("span_s") or 0.0))
        if not e_tok:  # prefill: the tokens it sent are those the decode side received
            e_tok = tok_min
        e.update(per(sum(c.get("mb_per_min", 0.0) for c in mine), e_req, e_tok))


def _merged_requests(by_url: dict[str, pd.DataFrame]) -> pd.DataFrame:
    frames = []
    for url, g in by_url.items():
        if len(g) < 2:
            continue
        frames.append(pd.DataFrame({"t": g["t"].to_numpy(), "url": url, "cum": _cumulative(g["requests"])}))
    if not frames:
        return pd.DataFrame()
    allt = np.unique(np.concatenate([f["t"].to_numpy() for f in frames]))
    total = sum(np.interp(allt, f["t"].to_numpy(), f["cum"].to_numpy()) for f in frames)
    # A running total is its own cumulative series, so _follows may cumulate it again unchanged.
    return pd.DataFrame({"t": allt, "requests": total})


def _counts(d: dict[str, float]) -> dict[str, Any]:
    return {"requests": int(round(d["requests"])), "generated_tokens": int(round(d["generation_tokens"])),
            "prompt_tokens": int(round(d["prompt_tokens"])), "kv_transfers": int(round(d["nixl_transfers"])),
            "kv_bytes": int(round(d["nixl_bytes"])),
            "kv_external_prompt_tokens": int(round(d["kv_external_prompt_tokens"])),
            "kv_failed_transfers": int(round(d["nixl_failed"]))}


def _per_1k(growth_mb: float, requests: float) -> float | None:
    return round(growth_mb / requests * 1000, 3) if requests > 0 else None


def python_heap(reader: TableSource) -> dict[int, dict[str, Any]]:
    """First and last Python GC state per pid (``processes[].python``), from the pyheap table."""
    ph = _table(reader, "pyheap")
    if ph.empty:
        return {}
    out: dict[int, dict[str, Any]] = {}
    for pid, g in ph.sort_values("t").groupby("pid"):
        first, last = g.iloc[0], g.iloc[-1]

        def val(row: pd.Series, k: str) -> Any:
            v = row.get(k)
            return None if v is None or (isinstance(v, float) and np.isnan(v)) else (
                v.item() if hasattr(v, "item") else v)

        walked = g[g["tracked"].notna()]
        out[int(pid)] = {
            "version": val(last, "version"), "gc_enabled": val(last, "gc_enabled"),
            "frozen": val(last, "frozen"), "frozen_first": val(first, "frozen"),
            # None: never walked (the frozen set is counted only by a walk of it)
            "heap_frozen": None if val(last, "frozen") is None else bool(val(last, "frozen")),
            "tracked_first": val(walked.iloc[0], "tracked") if len(walked) else None,
            "tracked_last": val(walked.iloc[-1], "tracked") if len(walked) else None,
            "gen_counts": [val(last, f"gen{i}_count") for i in range(3)],
            "gen2_collections": val(last, "gen2_collections"),
            "gen2_collections_during_hunt": (val(last, "gen2_collections") or 0) - (val(first, "gen2_collections") or 0),
            "error": val(last, "error"),
        }
    return out


def dumps(obj: Any) -> str:  # convenience for debugging a session by hand
    return json.dumps(obj, indent=2, default=str)
