"""Labelled windows of a recorded split and their offline replay through the analysis.

A window is one process over [a, b] (30, 60, 90 or 300 s). Its label comes from the generator's truth log:
``leak`` when the bytes given to the leak grew inside the window (``truth_mb_per_min``: the least-squares
slope of those bytes over the window), else the class of the generator's noise (``clean``: nothing kept;
``bounded``: memory kept up to a bound). The replay is `build_report` (the hunt's verdict, culprits and
rates) over a view of the session holding that process and that time span only."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.verdict_corpus.plan import LEAK_LIBRARY

DATA = Path(__file__).resolve().parent / "data"
LENGTHS = (30, 60, 90, 300)
# Windows per process and length, their starts spread evenly over its recording (the whole corpus must
# replay in under 2 minutes: each window is one build_report).
PER_PROCESS = {30: 4, 60: 4, 90: 2, 300: 2}
MB = 1024 * 1024
CLEAN_NOISES = ("none", "churn", "server")


class Split:
    """A split's tables in memory, split by pid once (a window's view is then a cheap time cut)."""

    def __init__(self, name: str, root: Path = DATA) -> None:
        self.name = name
        self.path = root / name
        self.meta: dict[str, Any] = json.loads((self.path / "meta.json").read_text())
        self.specs: list[dict[str, Any]] = json.loads((self.path / "specs.json").read_text())
        self.truth = pd.read_parquet(self.path / "truth.parquet")
        self.by_pid: dict[int, dict[str, pd.DataFrame]] = {}
        self.table_names = sorted(d.name for d in (self.path / "tables").iterdir())
        for d in sorted((self.path / "tables").iterdir()):
            df = pd.read_parquet(d / "part-0.parquet")
            if "t" in df.columns:
                df = df.sort_values("t", kind="stable")
            if "pid" in df.columns:
                for pid, g in df.groupby("pid"):
                    self.by_pid.setdefault(int(pid), {})[d.name] = g.reset_index(drop=True)
            else:  # host-wide (bpf_counters): every process's view holds it
                for s in self.specs:
                    self.by_pid.setdefault(int(s["pid"]), {})[d.name] = df

    def series(self, pid: int) -> pd.DataFrame:
        return self.by_pid.get(pid, {}).get("rollup", pd.DataFrame(columns=["t", "rss", "anon"]))


@functools.cache
def _empty(name: str) -> pd.DataFrame:
    from leaktrace.session.tables import SCHEMAS

    return SCHEMAS[name].empty_table().to_pandas() if name in SCHEMAS else pd.DataFrame()


class WindowReader:
    """A TableSource: one process of a split over [a, b]."""

    def __init__(self, split: Split, pid: int, a: float, b: float) -> None:
        self.path = split.path
        self.meta = {**split.meta, "duration_s": b - a, "exited": {}, "warnings": []}
        self.skipped_parts: list[str] = []
        self.complete = True
        self._tables = split.by_pid.get(pid, {})
        self._names = split.table_names
        self.a, self.b = a, b
        self._cache: dict[str, pd.DataFrame] = {}

    def tables(self) -> list[str]:
        return list(self._names)

    def table(self, name: str) -> pd.DataFrame:
        if name not in self._cache:
            self._cache[name] = self._cut(name)
        return self._cache[name]

    def _cut(self, name: str) -> pd.DataFrame:
        df = self._tables.get(name)
        if df is None:
            return _empty(name).copy()
        if "t" in df.columns:  # sorted by t when loaded
            t = df["t"].to_numpy()
            inside = df.iloc[np.searchsorted(t, self.a, "left"):np.searchsorted(t, self.b, "right")]
            if name == "processes":  # a hunt sees its targets at attach: the window's start
                seen = df[(df["t"] < self.a) & (df["event"] == "seen")].assign(t=self.a)
                return pd.concat([seen, inside], ignore_index=True) if len(seen) else inside
            return inside
        if name == "ledger_regions":  # held at the stop: those born by the window's end, born before it: preexisting
            df = df[df["t_born"].isna() | (df["t_born"] <= self.b)].copy()
            df["preexisting"] = df["preexisting"].astype(bool) | (df["t_born"] < self.a)
            return df
        return df


@dataclass
class Window:
    split: str
    pid: int
    name: str
    length: int
    a: float
    b: float
    label: str  # clean | bounded | leak
    truth_mb_per_min: float
    filling: bool = False  # a clean or bounded window whose held memory rose through it (see held_filling)


def _slope(t: np.ndarray, y: np.ndarray) -> float:
    if len(t) < 2 or np.ptp(t) <= 0:
        return 0.0
    return float(np.polyfit(t, y, 1)[0])


TRUTH_GAP_S = 3.0  # truth lines come every second: a longer gap is a lapse of the bookkeeping


def _covered(t: np.ndarray, a: float, b: float) -> bool:
    """Whether the truth log covers [a, b]: lines near both ends and no gap longer than TRUTH_GAP_S."""
    if len(t) < 2:
        return False
    return bool(t[0] - a <= TRUTH_GAP_S and b - t[-1] <= TRUTH_GAP_S and np.diff(t).max() <= TRUTH_GAP_S)


FILLING_MB_PER_MIN = 1.0  # the verdict's leak rate


def held_filling(t: np.ndarray, held: np.ndarray) -> bool:
    """Whether the memory a noise holds rose through the window: its slope over the window clears the leak rate
    and its last third still rises at half that slope or more (no plateau, no drop reached inside the window).
    Such a window of a bounded noise (a cache still filling, a sawtooth's rise, a live set still growing) shows
    nothing that tells it from a leak that starts and stops with it: its false alarms are counted apart."""
    if len(t) < 6 or np.ptp(t) <= 0:
        return False
    whole = _slope(t, held) * 60 / MB
    tail = t >= t[0] + 2 * np.ptp(t) / 3
    return whole >= FILLING_MB_PER_MIN and _slope(t[tail], held[tail]) * 60 / MB >= 0.5 * whole


def noise_label(spec: dict[str, Any]) -> str:
    if spec["noise"] == "pyheap":
        return "bounded" if float(spec["args"].get("freeze_at", -1)) >= 0 else "clean"
    return "clean" if spec["noise"] in CLEAN_NOISES else "bounded"


def cut(split: Split, lengths: tuple[int, ...] = LENGTHS) -> Iterator[Window]:
    truth = {int(p): g.sort_values("t") for p, g in split.truth.groupby("pid")}
    for spec in split.specs:
        pid = int(spec["pid"])
        ser = split.series(pid)
        tr = truth.get(pid)
        if ser.empty or tr is None or len(ser) < 10:
            continue
        t0, t1 = float(ser["t"].min()), float(ser["t"].max())
        for length in lengths:
            if t1 - t0 + 0.5 < length:
                continue
            for a in np.linspace(t0, max(t0, t1 - length), PER_PROCESS[length]):
                a = float(a)
                b = a + length
                inside = tr[(tr["t"] >= a) & (tr["t"] <= b)]
                if not _covered(inside["t"].to_numpy(float), a, b):
                    continue  # the generator's bookkeeping lapsed (a stalled loop): no label, no window
                before = tr[tr["t"] <= a]
                start = float(before["leaked"].iloc[-1]) if not before.empty else 0.0
                grew = not inside.empty and float(inside["leaked"].max()) > start
                rate = _slope(inside["t"].to_numpy(float), inside["leaked"].to_numpy(float)) * 60 / MB
                filling = not grew and held_filling(inside["t"].to_numpy(float), inside["held"].to_numpy(float))
                yield Window(split.name, pid, spec["name"], length, a, b,
                             "leak" if grew else noise_label(spec), rate if grew else 0.0, filling)


def replay(split: Split, w: Window) -> dict[str, Any]:
    """The analysis's answer on one window: verdict, the culprit of the leak library (else the first), the
    report's confidence (and the process's slope confidence, the largest of its RSS's and anonymous memory's)."""
    from leaktrace.analysis.summary import build_report

    rep = build_report(WindowReader(split, w.pid, w.a, w.b), with_first_named=False)
    mine = [c for c in rep["culprits"] if c["pid"] == w.pid]
    ours = [c for c in mine if c.get("library") == LEAK_LIBRARY]
    top = mine[0] if mine else None
    pick = ours[0] if ours else top
    proc = next((p for p in rep["processes"] if p["pid"] == w.pid), {})
    return {"split": w.split, "pid": w.pid, "name": w.name, "length": w.length, "a": w.a, "b": w.b,
            "label": w.label, "truth_mb_per_min": w.truth_mb_per_min, "filling": w.filling, "verdict": rep["verdict"],
            "called": rep["verdict"] == "leak" and bool(mine),
            "library": top.get("library") if top else None,
            "library_right": bool(top and top.get("library") == LEAK_LIBRARY),
            "mb_per_min": float(pick["mb_per_min"]) if pick else None,
            "confidence": float(rep["confidence"]),
            "slope_confidence": max(float(proc.get("rss_confidence", 0.0)), float(proc.get("anon_confidence", 0.0))),
            "reason": rep["verdict_reason"][:200]}


def _replay_split(name: str) -> list[dict[str, Any]]:
    split = Split(name)
    return [replay(split, w) for w in cut(split)]


def replay_all(names: tuple[str, ...] = ("frozen", "tuning"), workers: int = 2) -> pd.DataFrame:
    """Every window of the named splits, replayed (one worker per split)."""
    names = tuple(n for n in names if (DATA / n / "meta.json").exists())
    if workers > 1 and len(names) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(workers, len(names))) as ex:
            parts = list(ex.map(_replay_split, names))
    else:
        parts = [_replay_split(n) for n in names]
    return pd.DataFrame([r for p in parts for r in p])


def content_hash(name: str, root: Path = DATA) -> str:
    """sha256 over a split's files (relative path and bytes, in path order): pinned for the frozen split."""
    import hashlib

    h = hashlib.sha256()
    base = root / name
    for p in sorted(q for q in base.rglob("*") if q.is_file()):
        h.update(str(p.relative_to(base)).encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()
