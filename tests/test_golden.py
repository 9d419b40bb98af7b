"""Golden report tests (tests/golden.py): each recorded session renders exactly its expected reports,
and every reporter path runs on it (JSON, Markdown, HTML with its plots, the folded flame graph)."""

from __future__ import annotations

import difflib
import re

import pytest
from golden import COMPARED, GOLDEN, normalized, render, sessions


@pytest.mark.parametrize("name", sessions())
def test_report_matches_golden(name, tmp_path):
    out = render(name, tmp_path)
    for f in COMPARED:
        got, want = normalized(out / f), (GOLDEN / name / "expected" / f).read_text()
        if got != want:
            diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "expected", "rendered",
                                                n=2))
            pytest.fail(f"{name}/{f} differs from the golden (re-render on purpose: python tests/golden.py):\n"
                        f"{diff[:6000]}")
    html = (out / "report.html").read_text()
    assert html.count("<svg") + html.count("data:image/png") >= 1, "report.html has no plot"


def test_goldens_cover_the_verdicts_and_the_ledger():
    """The set pins a leak named by the eBPF ledger (demo, real UCX 1.20.1) and a clean churner."""
    import json

    reports = {n: json.loads((GOLDEN / n / "expected" / "report.json").read_text()) for n in sessions()}
    assert {r["verdict"] for r in reports.values()} == {"leak", "no-leak"}
    assert reports["demo"]["culprits"][0]["library"] == "libxfer_demo.so"
    assert reports["ucx"]["culprits"][0]["library"].startswith("libucm")
    assert reports["churn"]["culprits"] == [] and reports["churn"]["ledger"]["events"] > 10000


def test_every_flame_graph_source_runs(tmp_path):
    """The flame graph comes from the eBPF ledger's outstanding regions when the hunt had them, else from
    the culprits' stacks, else from the watcher's classes: each path runs on a real session."""
    import json

    from leaktrace.analysis.figures import build_figures
    from leaktrace.report.stacks import collect_stacks
    from leaktrace.session import SessionReader

    demo = render("demo", tmp_path)
    report = json.loads((demo / "report.json").read_text())
    stacks, source = collect_stacks(report, build_figures(SessionReader(demo)))
    assert source == "ledger" and any("libxfer_demo.so!xfer_send" in ";".join(f) for f, _ in stacks)
    # The ledger's outstanding bytes are what the flame graph weighs (pre-existing regions left out).
    assert sum(n for _, n in stacks) == pytest.approx(report["culprits"][0]["outstanding_bytes"], rel=0.05)
    stacks, source = collect_stacks(report, None)
    assert source == "culprits" and stacks[0][1] == report["culprits"][0]["outstanding_bytes"]
    report["culprits"] = []
    stacks, source = collect_stacks(report, None)
    assert source == "watcher-classes" and any(f[-1] == "[anon]" for f, _ in stacks)


@pytest.mark.parametrize("name", sessions())
def test_verdict_reason_states_the_reports_own_figures(name, tmp_path):
    """The reason names, in figures a person can check against the report, the process that leaks (its pid,
    RSS at the first and last samples, slope) and its first culprit (library, kind, rate, outstanding MB); a
    no-leak reason names the fastest-growing process the same way."""
    import json

    report = json.loads((render(name, tmp_path) / "report.json").read_text())
    why = report["verdict_reason"]
    procs = {p["pid"]: p for p in report["processes"]}
    if report["verdict"] == "leak":
        c = report["culprits"][0]
        p = procs[c["pid"]]
        assert why.startswith(f"{len({x['pid'] for x in report['culprits']})} process(es) leak: pid {c['pid']} "), why
        facts = [f"RSS {p['rss_first_mb']:.1f} → {p['rss_last_mb']:.1f} MB", f"its slope {p['rss_mb_per_min']:.1f} MB/min",
                 f"{c['library']}: {c['kind']} at {c['mb_per_min']:.1f} MB/min",
                 f"{c['outstanding_bytes'] / 2**20:.1f} MB outstanding", "the rule: ≥ 1.0 MB/min"]
    else:
        p = max(report["processes"], key=lambda q: q["rss_mb_per_min"])
        facts = [f"the fastest, pid {p['pid']} ", f"RSS {p['rss_first_mb']:.1f} → {p['rss_last_mb']:.1f} MB",
                 f"its slope {p['rss_mb_per_min']:.1f} MB/min"]
    missing = [f for f in facts if f not in why]
    assert not missing, (missing, why)


def test_inconclusive_reasons_name_the_doubtful_processes_figures():
    """The figures behind an inconclusive verdict: each doubtful process's RSS, span and slope (the fastest
    three), none of the others'."""
    import pandas as pd

    from leaktrace.analysis.reasons import MAX_PROCESSES_NAMED, facts_of

    procs = pd.DataFrame([{"pid": 100 + i, "title": f"w{i}", "t_first": 0.0, "t_last": 30.0 + i,
                           "rss_first_mb": 50.0 + i, "rss_last_mb": 60.0 + 2 * i, "rss_mb_per_min": 1.5 * i,
                           "rss_lower_mb_per_min": 0.5 * i, "rss_confidence": 0.6} for i in range(6)])
    doubtful = {101, 103, 104, 105}
    why = facts_of(procs, doubtful)
    named = [int(x) for x in re.findall(r"; pid (\d+) ", why)]
    assert named == [105, 104, 103][:MAX_PROCESSES_NAMED], why
    p = procs.set_index("pid").loc[105]
    assert f"pid 105 (w5): RSS {p.rss_first_mb:.1f} → {p.rss_last_mb:.1f} MB over {p.t_last:.0f} s" in why, why
    assert f"its slope {p.rss_mb_per_min:.1f} MB/min (≥ {p.rss_lower_mb_per_min:.1f} at 95%" in why, why
    assert facts_of(procs, set()) == "" and facts_of(procs.iloc[0:0], doubtful) == ""
