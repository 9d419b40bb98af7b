"""`leaktrace compare BEFORE AFTER`: verdicts on recorded sessions (tests/data/golden) and end to end on the
seed-002 remedy with real UCX 1.20.1: the leaking program before and after UCX_RCACHE_MAX_UNRELEASED=1024."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import REPO, is_root, run_cli
from golden import GOLDEN

from leaktrace.analysis.compare import compare_reports, normalise_library

LEAK_BIN = REPO / ".cache" / "ucx_munmap_leak"
UCX_ENV = {"UCX_NET_DEVICES": "lo", "UCX_MODULES": "^ib*,rdmacm"}


def _compare(before, after, out) -> tuple[subprocess.CompletedProcess, dict]:
    r = run_cli("compare", before, after, "--out", out)
    assert r.returncode == 0, r.stderr
    return r, json.loads((out / "compare.json").read_text())


def test_normalise_library():
    assert normalise_library("libucm-1a2b3c4d.so.0.0.0") == "libucm.so"
    assert normalise_library("/opt/x/nixl_cu12.libs/libucp-b39b3ed9.so.0.0.0") == "libucp.so"
    assert normalise_library("libucm.so.0") == "libucm.so"
    assert normalise_library("libxfer_demo.so") == "libxfer_demo.so"
    assert normalise_library(None) is None


@pytest.mark.parametrize("before,after,verdict,status", [
    ("demo", "churn", "fixed", {"libxfer_demo.so": "gone"}),
    ("churn", "demo", "regressed", {"libxfer_demo.so": "new"}),
    ("demo", "demo", "not-fixed", {"libxfer_demo.so": "remains"}),
    ("demo", "ucx", "regressed", {"libxfer_demo.so": "gone", "libucm.so": "new"}),
])
def test_verdicts_on_recorded_hunts(tmp_path, before, after, verdict, status):
    r, cmp = _compare(GOLDEN / before, GOLDEN / after, tmp_path)
    assert cmp["schema"] == "leaktrace.compare/1" and cmp["verdict"] == verdict, cmp["verdict_reason"]
    assert {c["library"]: c["status"] for c in cmp["culprits"]} == status
    b = json.loads((GOLDEN / before / "expected" / "report.json").read_text())
    a = json.loads((GOLDEN / after / "expected" / "report.json").read_text())
    assert cmp["before"]["verdict"] == b["verdict"] and cmp["after"]["verdict"] == a["verdict"]
    for c in cmp["culprits"]:  # the rates are each hunt's own culprit rates
        want_b = sum(x["mb_per_min"] for x in b["culprits"] if normalise_library(x["library"]) == c["library"])
        want_a = sum(x["mb_per_min"] for x in a["culprits"] if normalise_library(x["library"]) == c["library"])
        assert c["before_mb_per_min"] == pytest.approx(want_b, abs=1e-3)
        assert c["after_mb_per_min"] == pytest.approx(want_a, abs=1e-3)
    assert 0 < cmp["confidence"] <= 1
    assert f"verdict: {verdict}" in r.stdout
    assert f"**{verdict}**" in (tmp_path / "compare.md").read_text()
    assert f'class="verdict {verdict}"' in (tmp_path / "compare.html").read_text()


@pytest.mark.parametrize("new_rate,verdict", [(30.0, "fixed"), (119.6, "regressed")])
def test_a_new_culprit_regresses_only_when_it_grows_as_fast(tmp_path, new_rate, verdict):
    """The remedied leak gone and something else new beside it (a worker's own warm-up in the vintage pair):
    fixed while the new growth is slower than what was fixed, with the new culprit in the reason; regressed
    once it grows at least as fast. The after hunt is the recorded UCX hunt with its culprit's rate set."""
    before = json.loads((GOLDEN / "demo" / "expected" / "report.json").read_text())  # libxfer_demo.so 119.5
    after = json.loads((GOLDEN / "ucx" / "expected" / "report.json").read_text())
    for c in after["culprits"]:
        c["mb_per_min"] = new_rate
    cmp = compare_reports(before, after, tmp_path / "b", tmp_path / "a")
    assert cmp["verdict"] == verdict, cmp["verdict_reason"]
    assert {c["library"]: c["status"] for c in cmp["culprits"]} == {"libxfer_demo.so": "gone", "libucm.so": "new"}
    if verdict == "fixed":
        assert "libucm.so 30.0 MB/min" in cmp["verdict_reason"], cmp["verdict_reason"]


def _with_setting(report: dict, value: str) -> dict:
    for p in report["processes"]:
        if p.get("ucx"):
            p["ucx"]["settings"]["UCX_RCACHE_MAX_UNRELEASED"] = value
    return report


@pytest.mark.parametrize("applied,ucm_after,verdict", [
    ("1024", 0.0, "fixed"),        # the change addressed libucm, which is gone; the other grows in both
    ("1024", 90.0, "not-fixed"),   # the change addressed libucm, which still grows
    ("inf", 0.0, "not-fixed"),     # nothing the culprits' remedies name changed: every culprit counts
])
def test_the_change_is_judged_by_the_culprits_it_addresses(tmp_path, applied, ucm_after, verdict):
    """The recorded UCX hunt before, and after with UCX_RCACHE_MAX_UNRELEASED set as given in its process
    (``processes[].ucx``): a culprit of another library (a worker's own oneDNN growth) grows in both hunts.
    When the setting the UCX culprit's remedy names (``remedy_settings``) differs, the verdict is the UCX
    culprit's alone and the other is listed apart; when it does not, the other still growing is not-fixed."""
    before = json.loads((GOLDEN / "ucx" / "expected" / "report.json").read_text())
    ucm = before["culprits"][0]
    assert ucm["remedy_settings"] == {"UCX_MEM_MMAP_HOOK_MODE": "bistro", "UCX_RCACHE_MAX_UNRELEASED": "inf"}
    other = {**ucm, "library": "_C.abi3.so", "rule": "unknown", "mb_per_min": 6.1, "remedy_settings": None}
    before["culprits"].append(other)
    after = _with_setting(json.loads(json.dumps(before)), applied)
    after["culprits"][0]["mb_per_min"] = ucm_after
    after["culprits"][1]["mb_per_min"] = 4.1
    if not ucm_after:
        del after["culprits"][0]
    cmp = compare_reports(before, after, tmp_path / "b", tmp_path / "a")
    assert cmp["verdict"] == verdict, cmp["verdict_reason"]
    rows = {c["library"]: c for c in cmp["culprits"]}
    assert rows["_C.abi3.so"]["status"] == "remains" and rows["_C.abi3.so"]["remedy_applied"] is None
    changed = {"UCX_RCACHE_MAX_UNRELEASED": {"before": "inf", "after": "1024"}}
    assert rows["libucm.so"]["remedy_applied"] == (changed if applied == "1024" else None)
    if applied == "1024":
        assert "UCX_RCACHE_MAX_UNRELEASED inf → 1024" in cmp["verdict_reason"], cmp["verdict_reason"]
    if verdict == "fixed":
        assert "not what that change addresses" in cmp["verdict_reason"] and "_C.abi3.so 6.1 → 4.1" in cmp["verdict_reason"]
    from leaktrace.report.compare import render_html, render_markdown
    assert ("UCX_RCACHE_MAX_UNRELEASED inf → 1024" in render_markdown(cmp)) == (applied == "1024")
    assert ("UCX_RCACHE_MAX_UNRELEASED inf → 1024" in render_html(cmp)) == (applied == "1024")


@pytest.mark.parametrize("applied,verdict", [("1024", "fixed"), ("inf", "inconclusive")])
def test_an_inconclusive_after_hunt_is_judged_by_what_the_change_addressed(tmp_path, applied, verdict):
    """The after hunt inconclusive about other growth (the vintage control's worker: 1.7 MB/min of its own
    warm-up at sign agreement 0.747, under 0.75), with the UCX culprit gone: when the change addressed that
    culprit (its remedy's setting differs), the verdict is the change's, the after hunt's doubt stated in the
    reason; when nothing it names changed, inconclusive."""
    before = json.loads((GOLDEN / "ucx" / "expected" / "report.json").read_text())
    assert before["verdict"] == "leak"
    after = _with_setting(json.loads(json.dumps(before)), applied)
    doubt = "inconclusive pid(s) [7] grow ≥ 1.0 MB/min but with confidence below 0.75 or over too short a span"
    after.update(culprits=[], verdict="inconclusive", verdict_reason=doubt)
    cmp = compare_reports(before, after, tmp_path / "b", tmp_path / "a")
    assert cmp["verdict"] == verdict, cmp["verdict_reason"]
    assert {c["library"]: c["status"] for c in cmp["culprits"]} == {"libucm.so": "gone"}
    if verdict == "fixed":
        assert "UCX_RCACHE_MAX_UNRELEASED inf → 1024" in cmp["verdict_reason"], cmp["verdict_reason"]
        assert cmp["verdict_reason"].endswith(f"beside it, the after hunt is inconclusive: {doubt}"), cmp["verdict_reason"]
    else:
        assert cmp["verdict_reason"] == "the after hunt is inconclusive"


def test_bad_input_is_one_line(tmp_path):
    r = run_cli("compare", tmp_path / "missing", GOLDEN / "demo")
    assert r.returncode == 7 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "report.json").write_text("{not json")
    r = run_cli("compare", tmp_path / "junk", GOLDEN / "demo")
    assert r.returncode == 7 and "not readable JSON" in r.stderr


def test_session_without_report_is_analysed(tmp_path):
    """A killed hunt leaves no report.json: compare builds it from the session."""
    import shutil

    for name in ("demo", "churn"):
        (tmp_path / name).mkdir()
        shutil.copy(GOLDEN / name / "meta.json", tmp_path / name / "meta.json")
        shutil.copytree(GOLDEN / name / "tables", tmp_path / name / "tables")
    _, cmp = _compare(tmp_path / "demo", tmp_path / "churn", tmp_path / "out")
    assert cmp["verdict"] == "fixed"


@pytest.mark.bpf
@pytest.mark.skipif(not is_root(), reason="the eBPF probe needs root")
def test_seed002_remedy_is_fixed_on_real_ucx(spawn, tmp_path):
    """Real UCX 1.20.1: the program that munmaps through UCX's memory hooks leaks with the default
    (UCX_RCACHE_MAX_UNRELEASED=inf) and not with the remedy; compare says fixed, libucm gone."""
    assert LEAK_BIN.exists(), "built by tests/targets/setup_ucx.sh (.ci/setup.d/30-targets.sh)"
    for name, extra in (("before", {"UCX_RCACHE_MAX_UNRELEASED": "inf"}),
                        ("after", {"UCX_RCACHE_MAX_UNRELEASED": "1024"})):
        target = spawn([LEAK_BIN, "20000"], env={**UCX_ENV, **extra})
        r = run_cli("hunt", "--pid", target.pid, "--duration", "20", "--gdb-samples", "0", "--format", "json",
                    "--out", tmp_path / name)
        assert r.returncode == 0, r.stderr
        target.kill()
    before = json.loads((tmp_path / "before" / "report.json").read_text())
    assert before["verdict"] == "leak" and before["culprits"][0]["library"] == "libucm.so.0", before["culprits"][:1]
    _, cmp = _compare(tmp_path / "before", tmp_path / "after", tmp_path / "cmp")
    assert cmp["verdict"] == "fixed", (cmp["verdict_reason"], cmp["after"])
    ucm = next(c for c in cmp["culprits"] if c["library"] == "libucm.so")
    assert ucm["status"] == "gone" and ucm["before_mb_per_min"] > 20 and ucm["after_mb_per_min"] < 1
    assert ucm["libraries_as_mapped"] == ["libucm.so.0"]
    # read from each live process: the setting the remedy names, before and after
    assert ucm["remedy_applied"] == {"UCX_RCACHE_MAX_UNRELEASED": {"before": "inf", "after": "1024"}}, ucm
    assert "UCX_RCACHE_MAX_UNRELEASED inf → 1024" in cmp["verdict_reason"]
    assert os.path.getsize(tmp_path / "cmp" / "compare.html") > 1000
