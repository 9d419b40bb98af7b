"""The verdict's confidence table (leaktrace/analysis/calibration.py) fitted on the tuning split's replayed
windows: per window length and verdict (called a leak or not), the share of leaks with a uniform prior
((leaks + 1) / (windows + 2)); where called, pooled into a non-decreasing sequence over the lengths (pool
adjacent violators: a longer window never reads as less sure)."""

from __future__ import annotations

from typing import Any

import pandas as pd


def _pooled(counts: list[tuple[float, int, int]], increasing: bool) -> list[tuple[float, float]]:
    """(span, probability) of bins (span, leaks, windows), pooled to be monotone when ``increasing``."""
    blocks: list[list[Any]] = [[[s], k, n] for s, k, n in counts]
    if increasing:
        i = 0
        while i < len(blocks) - 1:
            a, b = blocks[i], blocks[i + 1]
            if (a[1] + 1) / (a[2] + 2) > (b[1] + 1) / (b[2] + 2):
                blocks[i] = [a[0] + b[0], a[1] + b[1], a[2] + b[2]]
                del blocks[i + 1]
                i = max(i - 1, 0)
            else:
                i += 1
    return [(s, (k + 1) / (n + 2)) for spans, k, n in blocks for s in spans]


def fit(df: pd.DataFrame) -> dict[str, dict[str, list[float]]]:
    """The table from one split's replayed windows (columns length, called, label)."""
    out: dict[str, dict[str, list[float]]] = {}
    for name, called in (("called", True), ("not_called", False)):
        g = df[df["called"] == called]
        counts = [(float(n), int((x["label"] == "leak").sum()), len(x)) for n, x in sorted(g.groupby("length"))]
        pts = _pooled(counts, increasing=called)
        out[name] = {"span_s": [s for s, _ in pts], "p": [round(p, 3) for _, p in pts]}
    return out


def toml_text(table: dict[str, dict[str, list[float]]]) -> str:
    lines = ["# The verdict's confidence: P(leak | verdict, seconds observed), fitted on the tuning split of the",
             "# labelled corpus by `python -m bench verdicts --fit-calibration` (bench/verdict_corpus/calibrate.py).",
             "# Measured on the frozen split: docs/verdicts.md, the reliability table. Do not edit by hand."]
    for name, v in table.items():
        lines += ["", f"[{name}]", f"span_s = {v['span_s']}", f"p = {v['p']}"]
    return "\n".join(lines) + "\n"
