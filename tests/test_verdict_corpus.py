"""The verdict on the frozen (held-out) split of the labelled corpus (bench/verdict_corpus, issue 42).

The split's content is pinned by its hash: a re-recording or an edit shows in review as a change of
FROZEN_SHA256. Its windows are replayed through the analysis offline, and each figure must be at least as
good as the one docs/verdicts.md states (its `frozen-bounds` block: the figures measured when the rules last
changed). A rule change that improves a figure should lower the bound in docs/verdicts.md with it."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.verdict_corpus import score  # noqa: E402
from bench.verdict_corpus.windows import Split, content_hash, cut, replay  # noqa: E402

FROZEN_SHA256 = "bd131553b7b0f6233321f88790adb72a1a17e1d8b3675cf587c2cfb5383838a6"
DOC = ROOT / "docs" / "verdicts.md"
EPS = 1e-4  # the docs state figures to 4 decimals


def _bounds() -> dict:
    m = re.search(r"<!-- frozen-bounds -->\s*```json\n(.*?)```", DOC.read_text(), re.S)
    assert m, f"{DOC} has no frozen-bounds block"
    return json.loads(m.group(1))


def test_frozen_split_is_pinned():
    assert content_hash("frozen") == FROZEN_SHA256


@pytest.fixture(scope="module")
def frozen():
    import pandas as pd

    split = Split("frozen")
    return split, pd.DataFrame([replay(split, w) for w in cut(split)])


def test_frozen_windows_enough(frozen):
    _, df = frozen
    assert len(df) >= 250
    assert set(df["label"]) == {"clean", "bounded", "leak"}


def test_frozen_figures_do_not_regress(frozen):
    _, df = frozen
    bounds = _bounds()
    figs = score.split_figures(df)
    worse = []
    for n, want in bounds["windows"].items():
        got = figs[n]["figures"]
        assert got["windows"] == want["windows"], f"{n} s: {got['windows']} windows, the docs state {want['windows']}"
        for k in ("false_alarm_rate", "rate_error_median", "rate_error_p90"):
            if got[k] > want[k] + EPS:
                worse.append(f"{n} s {k}: {got[k]:.4f} > {want[k]:.4f}")
        for k in ("detection_rate", "library_right_rate"):
            if got[k] < want[k] - EPS:
                worse.append(f"{n} s {k}: {got[k]:.4f} < {want[k]:.4f}")
    assert not worse, "; ".join(worse)


def test_watch_day_does_not_regress(frozen):
    split, _ = frozen
    want = _bounds()["watch_day"]
    day = score.watch_day(split)
    assert day["hours"] >= 24.0
    assert day["false_incidents"] <= want["false_incidents"]
    assert day["leaks_not_confirmed"] <= want["leaks_not_confirmed"]
    assert day["confirm_s_median"] <= want["confirm_s_median"] + 0.1


def test_sure_leak_calls_are_leaks(frozen):
    """The report's confidence means what the corpus measured (DESIGN.md): of the frozen split's windows called
    a leak with confidence >= 0.9, the share that are leaks is at least the one docs/verdicts.md states."""
    _, df = frozen
    sure = df[df["called"] & (df["confidence"] >= 0.9)]
    assert len(sure) >= 20
    assert float((sure["label"] == "leak").mean()) >= _bounds()["sure_leak_share"] - EPS


def test_confidence_table_is_the_tuning_splits():
    """leaktrace/analysis/calibration.toml is what `python -m bench verdicts --fit-calibration` fits on the tuning
    split with the current rules: a rule change that moves a verdict must refit it (never on the frozen split)."""
    from bench.verdict_corpus.calibrate import fit
    from bench.verdict_corpus.windows import replay_all
    from leaktrace.analysis.calibration import _table

    fitted = fit(replay_all(("tuning",), workers=1))
    table = _table()
    for name, v in fitted.items():
        assert table[name] == (v["span_s"], v["p"]), (name, table[name], v)


def test_confidence_interpolates_in_log_span():
    from leaktrace.analysis.calibration import interpolate, leak_probability

    assert interpolate([30.0, 60.0], [0.6, 0.9], 30.0 * 2 ** 0.5) == pytest.approx(0.75)
    assert interpolate([30.0, 60.0], [0.6, 0.9], 5.0) == 0.6 and interpolate([30.0, 60.0], [0.6, 0.9], 900.0) == 0.9
    called = [leak_probability(True, s) for s in (10, 30, 45, 60, 90, 300, 3600)]
    assert called == sorted(called) and all(0.0 < p < 1.0 for p in called)

