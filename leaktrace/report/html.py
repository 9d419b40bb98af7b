"""report.html: one self-contained file (inline SVG plots, CSS and scripts; nothing from the network).

Plots: RSS and anonymous memory over time per process, growth by memory class, top growing regions,
an interactive flame graph of outstanding bytes by stack (leaktrace.report.flamegraph: per culprit and per
process, searchable) with a static one under it for readers without scripts; culprit cards. Copes with any
subset of tables.
"""

from __future__ import annotations

import io
from typing import Any

import pandas as pd

from leaktrace.analysis.exits import describe as describe_exit
from leaktrace.analysis.figures import Figures
from leaktrace.analysis.growth import MB
from leaktrace.analysis.report_types import Report
from leaktrace.report import culprit_figures, flamegraph
from leaktrace.report.flame_svg import flame_svg
from leaktrace.report.reporter import TextReporter
from leaktrace.report.stacks import call_path, collect_stacks

MAX_POINTS_PER_LINE = 600
MAX_LINES = 12


def _svg(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE: the SVG is inlined in HTML


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
    return plt


def memory_over_time_svg(rollup: pd.DataFrame, labels: dict[int, str], attach_s: float | None) -> str:
    if rollup.empty:
        return ""
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 5.6), sharex=True)
    last = rollup.sort_values("t").groupby("pid")["rss"].last().sort_values(ascending=False)
    growth = rollup.groupby("pid")["rss"].agg(lambda s: s.iloc[-1] - s.iloc[0]).sort_values(ascending=False)
    pids = list(dict.fromkeys(list(growth.index[:MAX_LINES // 2]) + list(last.index)))[:MAX_LINES]
    for pid, g in rollup[rollup["pid"].isin(pids)].groupby("pid"):
        g = g.sort_values("t")
        if len(g) > MAX_POINTS_PER_LINE:
            g = g.iloc[:: len(g) // MAX_POINTS_PER_LINE + 1]
        name = f"{labels.get(int(pid), '?')} ({pid})"
        ax1.plot(g["t"], g["rss"] / MB, label=name, lw=1.3)
        ax2.plot(g["t"], g["anon"] / MB, label=name, lw=1.3)
    for ax, what in ((ax1, "RSS (MB)"), (ax2, "anonymous (MB)")):
        ax.set_ylabel(what)
        if attach_s:
            ax.axvline(attach_s, color="#888", ls=":", lw=1)
    ax2.set_xlabel("seconds since hunt start")
    ax1.legend(loc="upper left", fontsize=8, ncol=2)
    if rollup["pid"].nunique() > len(pids):
        ax1.set_title(f"{len(pids)} of {rollup['pid'].nunique()} processes (largest and fastest growing)",
                      fontsize=9)
    return _svg(fig)


def growth_by_class_svg(growth: dict[str, float]) -> str:
    items = [(k, v) for k, v in growth.items() if abs(v) >= 0.005]
    if not items:
        return ""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 0.4 * len(items) + 1.0))
    names = [k for k, _ in items][::-1]
    vals = [v for _, v in items][::-1]
    ax.barh(names, vals, color=["#d9534f" if v > 0 else "#5b9bd5" for v in vals])
    ax.set_xlabel("MB/min (RSS, summed over processes)")
    ax.axvline(0, color="#444", lw=0.8)
    return _svg(fig)


def regions_svg(regions: list[dict[str, Any]]) -> str:
    if not regions:
        return ""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(regions) + 1.0))
    names = [f"{r['pid']} {r['start']} {r['path'][-28:]}" + (" ↻" if r["moves"] else "") for r in regions][::-1]
    vals = [r["growth_mb"] for r in regions][::-1]
    ax.barh(names, vals, color=["#e8743b" if r["moves"] else "#f2a541" for r in regions][::-1])
    ax.set_xlabel("MB grown during the hunt (↻ = moved)")
    return _svg(fig)


def _ledger_over_time_svg(df: pd.DataFrame | None) -> str:
    if df is None or len(df) == 0 or not {"t", "bytes"} <= set(df.columns):
        return ""
    key = "library" if "library" in df.columns else None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 3.2))
    for name, g in (df.groupby(key) if key else [("all", df)]):
        g = g.sort_values("t")
        ax.plot(g["t"], g["bytes"] / MB, label=str(name), lw=1.3)
    ax.set_ylabel("outstanding (MB)")
    ax.set_xlabel("seconds since hunt start")
    ax.legend(loc="upper left", fontsize=8)
    return _svg(fig)


def render(report: Report, figures: Figures | None = None) -> str:
    from jinja2 import Environment, PackageLoader, select_autoescape

    env = Environment(loader=PackageLoader("leaktrace.report", "templates"),
                      autoescape=select_autoescape(["html", "j2"]))
    rollup = figures.rollup if figures is not None else pd.DataFrame()
    labels = {p["pid"]: p["label"] for p in report.get("processes", [])}
    stacks, flame_source = collect_stacks(report, figures)
    regions = report.get("regions", {}) or {}
    plots = {
        "memory": memory_over_time_svg(rollup, labels, report.get("attach_s")),
        "classes": growth_by_class_svg(report.get("growth_by_class", {})),
        "regions": regions_svg((regions.get("growing") or [])[:10]),
        "ledger": _ledger_over_time_svg(figures.ledger_by_library if figures is not None else None),
        "flame": flame_svg(stacks),
    }
    views = flamegraph.views(report, figures)
    tpl = env.get_template("report.html.j2")
    ended = {p["pid"]: describe_exit(p.get("exit")) for p in report.get("processes", []) if p.get("exit")}
    call_paths = [call_path(c) for c in report.get("culprits", [])]
    return tpl.render(r=report, plots=plots, flame_source=flame_source, mb=MB, ended=ended, call_paths=call_paths,
                      rates=culprit_figures.rates, held=culprit_figures.held,
                      flame_assets=flamegraph.assets() if views else "", flame_widget=flamegraph.widget("flamegraph", views))


REPORTER = TextReporter("html", "report.html", render)
