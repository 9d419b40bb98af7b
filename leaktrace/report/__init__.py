"""Reporters: one per output format, all rendering the dict built by leaktrace.analysis.

``render_session`` is what ``hunt``, ``report`` and ``demo`` call: report.json always, the other formats
asked for in addition (leaktrace.report.formats: the registry, ``--format``). ``html`` also writes
``outstanding.folded`` (the flame graph's data, for FlameGraph/speedscope); ``folded`` alone writes only it
besides report.json.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from leaktrace.report.formats import REPORT_FORMATS

if TYPE_CHECKING:
    from leaktrace.analysis.figures import Figures
    from leaktrace.analysis.report_types import Report

FORMATS = REPORT_FORMATS.names


def render_session(path: Path | str, formats: Iterable[str] = FORMATS) -> Report:
    from leaktrace.analysis.figures import build_figures
    from leaktrace.analysis.summary import build_report
    from leaktrace.session import SessionReader

    reader = SessionReader(path)
    report = build_report(reader)
    write_reports(report, Path(path), formats, build_figures(reader))
    return report


def write_reports(report: Report, out: Path, formats: Iterable[str], figures: Figures | None = None) -> list[Path]:
    return REPORT_FORMATS.write(report, out, formats, figures)
