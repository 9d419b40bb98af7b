"""The verdict's ``confidence``: the probability that the growth it judged is a leak, given the verdict and how
long the processes were observed.

Read from the labelled corpus (bench/verdict_corpus): of the windows of each length the analysis called a leak,
the share that were leaks; of those it did not call one, the share that were leaks all the same (small and slow
leaks under the leak rate, most of them). The table is fitted on the tuning split only (``python -m bench
verdicts --fit-calibration`` writes calibration.toml), monotone in the span where a verdict called a leak (a
longer window tells a filling cache from a leak), and measured on the frozen split (the reliability table of
docs/verdicts.md). Between the fitted spans the probability is interpolated in log(span); outside them the
nearest span's holds. It is the corpus's mix of leaks and clean or bounded workloads that it is calibrated to."""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import numpy as np

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

CALIBRATION_FILE = Path(__file__).with_name("calibration.toml")


@cache
def _table(path: Path = CALIBRATION_FILE) -> dict[str, tuple[list[float], list[float]]]:
    with open(path, "rb") as f:
        data = tomllib.load(f)
    return {k: ([float(s) for s in v["span_s"]], [float(p) for p in v["p"]]) for k, v in data.items()
            if isinstance(v, dict) and "span_s" in v}


def interpolate(spans: list[float], ps: list[float], span_s: float) -> float:
    """The probability at ``span_s`` from fitted (span, probability) points, linear in log(span); the nearest
    point's outside them."""
    if not spans:
        return 0.5
    return float(np.interp(math.log(span_s), np.log(spans), ps))


def leak_probability(called: bool, span_s: float) -> float:
    """The probability the judged growth is a leak: ``called`` whether the verdict called one (else no leak, or
    inconclusive), ``span_s`` the seconds the processes were observed."""
    spans, ps = _table()["called" if called else "not_called"]
    return round(interpolate(spans, ps, max(span_s, 1.0)), 3)
