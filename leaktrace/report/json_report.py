"""report.json: the machine-readable contract (../shared/DESIGN.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from leaktrace.analysis.report_types import Report
from leaktrace.atomic import atomic_write_text


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


def write(report: Report, out_dir: Path) -> Path:
    return atomic_write_text(Path(out_dir) / "report.json", json.dumps(_clean(report), indent=2, default=str))
