"""report.json: the machine-readable contract (../shared/DESIGN.md, leaktrace/schemas/report.schema.json)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leaktrace.atomic import atomic_write_text
from leaktrace.report.schema import check_before_write

if TYPE_CHECKING:
    from leaktrace.analysis.figures import Figures


def _clean(o: Any) -> Any:
    if isinstance(o, float):
        return None if math.isnan(o) or math.isinf(o) else o
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if hasattr(o, "item"):  # numpy scalars
        return _clean(o.item())
    return o


def to_json(doc: Mapping[str, Any]) -> str:
    """The JSON text of a report or comparison: NaN and infinities as null (JSON has neither), numpy
    scalars as numbers, anything else unknown as its string."""
    return json.dumps(_clean(doc), indent=2, default=str)


class JsonReporter:
    """Writes ``filename`` from the document, checked against the ``schema`` kind's JSON Schema first when
    LEAKTRACE_SCHEMA_CHECK=1 (leaktrace.report.schema)."""

    def __init__(self, filename: str, schema: str) -> None:
        self.name = "json"
        self.filename = filename
        self.schema = schema

    def write(self, doc: Mapping[str, Any], out_dir: Path, figures: Figures | None = None) -> Path:
        text = to_json(doc)
        check_before_write(self.schema, text)
        return atomic_write_text(Path(out_dir) / self.filename, text)


REPORTER = JsonReporter("report.json", "report")


def write(report: Mapping[str, Any], out_dir: Path) -> Path:
    return REPORTER.write(report, out_dir)
