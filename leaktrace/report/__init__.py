"""Reporters: one module per output format, all rendering the dict built by leaktrace.analysis.

``render_session`` is what ``hunt``, ``report`` and ``demo`` call. ``html`` also writes
``outstanding.folded`` (the flame graph's data, for FlameGraph/speedscope); ``folded`` alone writes only it.
"""

from __future__ import annotations

from pathlib import Path

from leaktrace.analysis.figures import Figures, build_figures
from leaktrace.analysis.report_types import Report
from leaktrace.analysis.summary import build_report
from leaktrace.session import SessionReader

FORMATS = ("json", "md", "html", "folded")


def render_session(path: Path | str, formats: tuple[str, ...] | list[str] = FORMATS) -> Report:
    reader = SessionReader(path)
    report = build_report(reader)
    write_reports(report, Path(path), formats, build_figures(reader))
    return report


def write_reports(report: Report, out: Path, formats: tuple[str, ...] | list[str],
                  figures: Figures | None = None) -> list[Path]:
    from leaktrace.report import flame, html, json_report, markdown

    written = []
    if "json" in formats:
        written.append(json_report.write(report, out))
    if "md" in formats:
        written.append(markdown.write(report, out))
    if "html" in formats:
        written.append(html.write(report, out, figures))
    if "folded" in formats or "html" in formats:
        written.append(flame.write_folded(report, out, figures))
    return written
