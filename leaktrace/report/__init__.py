"""Reporters: one module per output format, all rendering the dict built by leaktrace.analysis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from leaktrace.analysis.summary import build_report
from leaktrace.session import SessionReader

FORMATS = ("json", "md")


def render_session(path: Path, formats: tuple[str, ...] | list[str] = FORMATS) -> dict[str, Any]:
    reader = SessionReader(path)
    report = build_report(reader)
    from leaktrace.report import json_report, markdown

    writers = {"json": json_report.write, "md": markdown.write}
    for fmt in formats:
        if fmt in writers:
            writers[fmt](report, Path(path))
    return report
