"""report.html: one self-contained file (inline SVG plots, CSS and scripts; nothing from the network).

Plots (pygal, static SVG): RSS and anonymous memory over time per process, growth by memory class, top
growing regions, an interactive flame graph of outstanding bytes by stack (leaktrace.report.flamegraph: per
culprit and per process, searchable) with a static one under it for readers without scripts; culprit cards.
Copes with any subset of tables.
"""

from __future__ import annotations

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


# matplotlib's tab10, the order lines take their colours in
_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
            "#17becf", "#393b79", "#637939")


def _chart(kind: str, chart_id: str, **config: Any) -> Any:
    """A pygal chart drawn as static SVG for inlining: no script from the network (pygal's tooltips load one by
    default), no XML prolog, and a fixed id (pygal draws a random one), so one session renders one page."""
    import pygal
    from pygal.style import Style

    style = Style(background="white", plot_background="white", font_family="sans-serif", label_font_size=11,
                  major_label_font_size=11, legend_font_size=11, title_font_size=12, colors=_COLOURS,
                  guide_stroke_color="#ddd", major_guide_stroke_color="#ccc", guide_stroke_dasharray="1,0",
                  major_guide_stroke_dasharray="1,0", stroke_width="1.6", stroke_opacity="1", opacity=".85")
    chart = getattr(pygal, kind)(js=[], disable_xml_declaration=True, explicit_size=True, style=style,
                                 truncate_legend=-1, truncate_label=-1, show_x_guides=True, max_scale=8, **config)
    chart.uuid = chart_id
    return chart


def _svg(chart: Any) -> str:
    return chart.render(is_unicode=True)


def _points(x: pd.Series, y: pd.Series) -> list[tuple[float, float]]:
    return [(round(float(a), 2), round(float(b), 3)) for a, b in zip(x, y, strict=True)]


def _attach_line(chart: Any, attach_s: float | None, lo: float, hi: float) -> None:
    """The hunt's attach time as a dotted vertical line (its own series, last in the legend)."""
    if attach_s:
        chart.add("attached", [(attach_s, lo), (attach_s, hi)], stroke_style={"dasharray": "3, 4", "width": 1},
                  show_dots=False)


def memory_over_time_svg(rollup: pd.DataFrame, labels: dict[int, str], attach_s: float | None) -> str:
    """Two panels, RSS then anonymous memory, of the largest and fastest growing processes."""
    if rollup.empty:
        return ""
    last = rollup.sort_values("t").groupby("pid")["rss"].last().sort_values(ascending=False)
    growth = rollup.groupby("pid")["rss"].agg(lambda s: s.iloc[-1] - s.iloc[0]).sort_values(ascending=False)
    pids = list(dict.fromkeys(list(growth.index[:MAX_LINES // 2]) + list(last.index)))[:MAX_LINES]
    title = None
    if rollup["pid"].nunique() > len(pids):
        title = f"{len(pids)} of {rollup['pid'].nunique()} processes (largest and fastest growing)"
    lines = []  # (legend, the process's samples in time order, thinned), drawn in both panels
    for pid, g in rollup[rollup["pid"].isin(pids)].groupby("pid"):
        g = g.sort_values("t")
        if len(g) > MAX_POINTS_PER_LINE:
            g = g.iloc[:: len(g) // MAX_POINTS_PER_LINE + 1]
        lines.append((f"{labels.get(int(pid), '?')} ({pid})", g))
    panels = []
    for col, what in (("rss", "RSS (MB)"), ("anon", "anonymous (MB)")):
        chart = _chart("XY", f"memory-{col}", width=1000, height=300, show_dots=False, title=title if col == "rss" else None,
                       y_title=what, x_title="seconds since hunt start", legend_at_bottom=True, legend_at_bottom_columns=3)
        lo, hi = float("inf"), float("-inf")
        for name, g in lines:
            y = g[col] / MB
            lo, hi = min(lo, float(y.min())), max(hi, float(y.max()))
            chart.add(name, _points(g["t"], y))
        _attach_line(chart, attach_s, lo, hi)
        panels.append(_svg(chart))
    return "\n".join(panels)


def growth_by_class_svg(growth: dict[str, float]) -> str:
    items = [(k, v) for k, v in growth.items() if abs(v) >= 0.005]
    if not items:
        return ""
    chart = _chart("HorizontalBar", "classes", width=700, height=int(40 * len(items) + 110), show_legend=False,
                   x_title="MB/min (RSS, summed over processes)")
    items = items[::-1]  # pygal draws the first bar at the bottom: the first item goes on top
    chart.x_labels = [k for k, _ in items]
    chart.add("MB/min", [{"value": round(v, 3), "color": "#d9534f" if v > 0 else "#5b9bd5"} for _, v in items])
    return _svg(chart)


def regions_svg(regions: list[dict[str, Any]]) -> str:
    if not regions:
        return ""
    chart = _chart("HorizontalBar", "regions", width=800, height=int(35 * len(regions) + 110), show_legend=False,
                   x_title="MB grown during the hunt (↻ = moved)")
    regions = regions[::-1]  # the largest on top (see growth_by_class_svg)
    chart.x_labels = [f"{r['pid']} {r['start']} {r['path'][-28:]}" + (" ↻" if r["moves"] else "") for r in regions]
    chart.add("MB", [{"value": round(r["growth_mb"], 3), "color": "#e8743b" if r["moves"] else "#f2a541"}
                     for r in regions])
    return _svg(chart)


def _ledger_over_time_svg(df: pd.DataFrame | None) -> str:
    if df is None or len(df) == 0 or not {"t", "bytes"} <= set(df.columns):
        return ""
    key = "library" if "library" in df.columns else None
    chart = _chart("XY", "ledger", width=1000, height=320, show_dots=False, y_title="outstanding (MB)",
                   x_title="seconds since hunt start", legend_at_bottom=True, legend_at_bottom_columns=3)
    for name, g in (df.groupby(key) if key else [("all", df)]):
        g = g.sort_values("t")
        chart.add(str(name), _points(g["t"], g["bytes"] / MB))
    return _svg(chart)


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
