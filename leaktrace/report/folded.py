"""The folded-stacks format (FlameGraph / speedscope input): outstanding bytes by call path, one line a
stack, ``frame;frame;frame bytes``."""

from __future__ import annotations

from leaktrace.analysis.figures import Figures, Stacks
from leaktrace.analysis.report_types import Report
from leaktrace.report.reporter import TextReporter
from leaktrace.report.stacks import collect_stacks


def folded_text(stacks: Stacks) -> str:
    merged: dict[str, int] = {}
    for frames, size in stacks:
        key = ";".join(frames)
        merged[key] = merged.get(key, 0) + size
    return "".join(f"{k} {v}\n" for k, v in sorted(merged.items(), key=lambda kv: -kv[1]))


def render_folded(report: Report, figures: Figures | None = None) -> str:
    return folded_text(collect_stacks(report, figures)[0])


REPORTER = TextReporter("folded", "outstanding.folded", render_folded)
