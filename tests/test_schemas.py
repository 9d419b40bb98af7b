"""The JSON Schemas of report.json and compare.json (leaktrace/schemas/): valid Draft 2020-12 schemas,
shipped in the package, matching every report and comparison the recorded hunts make (tests/data/golden),
strict where the contract is (a contract property renamed or removed, a word outside a vocabulary) and open
to new properties; and the writers refuse to write a document that does not match them."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from conftest import REPO, run_cli
from golden import GOLDEN, sessions
from jsonschema import Draft202012Validator

from leaktrace.analysis.compare import compare_reports
from leaktrace.analysis.report_types import CulpritKind
from leaktrace.cluster.merge import merge_reports
from leaktrace.report import json_report, schema
from leaktrace.report.formats import COMPARE_FORMATS
from leaktrace.vllm.labels import LABELS, ROLES


def golden_reports() -> dict[str, dict]:
    return {n: json.loads((GOLDEN / n / "expected" / "report.json").read_text()) for n in sessions()}


def as_written(doc: dict) -> dict:
    return json.loads(json_report.to_json(doc))


def golden_compares() -> dict[str, dict]:
    reps = golden_reports()
    return {f"{b}->{a}": as_written(compare_reports(reps[b], reps[a], GOLDEN / b, GOLDEN / a))
            for b in reps for a in reps}


def cluster_report() -> dict:
    """The merge of two golden node reports, a failed node and a node with nothing to hunt."""
    reps = list(golden_reports().values())
    leak = next(r for r in reps if r["verdict"] == "leak")
    entries = [{"node_id": "a" * 56, "hostname": "decode-0", "ip": "10.0.0.3", "status": "ok", "session": "nodes/d",
                "leaktrace": {"version": "0.1.0", "path": "/x"}},
               {"node_id": "b" * 56, "hostname": "prefill-0", "ip": "10.0.0.2", "status": "ok", "session": "nodes/p"},
               {"node_id": "c" * 56, "hostname": "spare", "status": "failed", "reason": "node died", "session": None},
               {"node_id": "d" * 56, "hostname": "idle", "status": "ok", "no_targets": True,
                "reason": "no vLLM server on this node", "session": None}]
    return as_written(merge_reports({"address": "10.0.0.1:6379", "targets": "--vllm"},
                                    [(entries[0], leak), (entries[1], reps[0]), (entries[2], None), (entries[3], None)]))


def errors(kind: str, doc: dict) -> list[str]:
    return [e.message for e in Draft202012Validator(schema.load_schema(kind)).iter_errors(doc)]


# ----------------------------------------------------------------------------- the files


def test_schema_files_are_valid_draft_2020_12_and_in_the_package() -> None:
    found = sorted(p.name for p in (REPO / "leaktrace" / "schemas").glob("*.schema.json"))
    assert found == ["compare.schema.json", "report.schema.json"]
    for kind in ("report", "compare"):
        doc = schema.load_schema(kind)
        assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        Draft202012Validator.check_schema(doc)
        assert schema.schema_path(kind).parent == REPO / "leaktrace" / "schemas"


def test_vocabularies_are_the_codes() -> None:
    rep, cmp = schema.load_schema("report"), schema.load_schema("compare")
    assert rep["$defs"]["label"]["enum"] == list(LABELS)
    assert rep["$defs"]["role"]["enum"] == list(ROLES)
    assert cmp["$defs"]["role"]["enum"] == [*ROLES, "-"]  # compare: "-" outside a vLLM instance
    assert set(typing.get_args(CulpritKind)) <= set(rep["$defs"]["kind"]["enum"])
    assert "thread-stacks" in rep["$defs"]["kind"]["enum"]
    assert cmp["$defs"]["kind"] == rep["$defs"]["kind"]
    assert cmp["$defs"]["report_verdict"] == rep["$defs"]["verdict"]


# ----------------------------------------------------------------------------- what the tool writes


@pytest.mark.parametrize("name", sessions())
def test_golden_reports_validate(name: str) -> None:
    schema.validate_report(golden_reports()[name])


def test_golden_compares_validate() -> None:
    for pair, cmp in golden_compares().items():
        assert not errors("compare", cmp), pair


def test_merged_cluster_report_validates() -> None:
    rep = cluster_report()
    assert rep["kind"] == "cluster" and [n["status"] for n in rep["nodes"]] == ["ok", "ok", "failed", "ok"]
    schema.validate_report(rep)
    del rep["nodes"]
    assert errors("report", rep)  # a cluster report without its nodes


def test_new_properties_and_new_features_pass() -> None:
    rep = copy.deepcopy(golden_reports()["demo"])
    rep["a_new_block"] = {"anything": [1, 2]}
    c = rep["culprits"][0]
    c.update(a_new_figure=1.5, kind="thread-stacks", mapped_mb_per_min=2.0, touched_by="libfoo.so",
             mapped_before_attach=True, first_named_s=None, role="decode", instance=4242)
    rep["processes"][0]["a_new_rate"] = 0.0
    rep["host"].update(mem_available_mb_per_min=-3.5, unattributed_mb_per_min=1.0)
    schema.validate_report(rep)
    cmp = golden_compares()["demo->ucx"]
    cmp["a_new_figure"] = 1
    cmp["culprits"][0]["a_new_figure"] = 1
    schema.validate_compare(cmp)


def _rename(d: dict, old: str, new: str) -> None:
    d[new] = d.pop(old)


REPORT_BREAKS = {
    "verdict removed": lambda r: r.pop("verdict"),
    "verdict renamed": lambda r: _rename(r, "verdict", "result"),
    "schema renamed": lambda r: _rename(r, "schema", "schema_version"),
    "unknown verdict": lambda r: r.update(verdict="leaky"),
    "schema version": lambda r: r.update(schema="leaktrace.report/2"),
    "duration as text": lambda r: r.update(duration_s="33 s"),
    "ledger events removed": lambda r: r["ledger"].pop("events"),
    "process rate renamed": lambda r: _rename(r["processes"][0], "rss_mb_per_min", "rssMbPerMin"),
    "process label outside the vocabulary": lambda r: r["processes"][0].update(label="vllm"),
    "culprit rate renamed": lambda r: _rename(r["culprits"][0], "mb_per_min", "mb_per_minute"),
    "culprit remedy removed": lambda r: r["culprits"][0].pop("remedy"),
    "culprit kind outside the vocabulary": lambda r: r["culprits"][0].update(kind="mmap"),
    "culprit pid as text": lambda r: r["culprits"][0].update(pid="4242"),
    "culprit stack as text": lambda r: r["culprits"][0].update(stack="a;b"),
    "culprit in camelCase": lambda r: r["culprits"][0].update(firstNamedS=1.0),
    "culprits without a leak": lambda r: r.update(verdict="no-leak"),
}


@pytest.mark.parametrize("what", list(REPORT_BREAKS))
def test_a_broken_report_fails(what: str) -> None:
    rep = copy.deepcopy(golden_reports()["demo"])
    assert rep["verdict"] == "leak" and rep["culprits"]
    REPORT_BREAKS[what](rep)
    with pytest.raises(schema.SchemaViolation, match="does not match report.schema.json"):
        schema.validate_report(rep)


COMPARE_BREAKS = {
    "verdict removed": lambda c: c.pop("verdict"),
    "unknown verdict": lambda c: c.update(verdict="better"),
    "before removed": lambda c: c.pop("before"),
    "side verdict outside the vocabulary": lambda c: c["after"].update(verdict="fixed"),
    "culprit status outside the vocabulary": lambda c: c["culprits"][0].update(status="fixed"),
    "culprit rate renamed": lambda c: _rename(c["culprits"][0], "after_mb_per_min", "after_rate"),
    "culprit library removed": lambda c: c["culprits"][0].pop("library"),
    "culprit role outside the vocabulary": lambda c: c["culprits"][0].update(role="prefil"),
    "confidence above 1": lambda c: c.update(confidence=1.5),
}


@pytest.mark.parametrize("what", list(COMPARE_BREAKS))
def test_a_broken_compare_fails(what: str) -> None:
    cmp = golden_compares()["demo->ucx"]
    COMPARE_BREAKS[what](cmp)
    with pytest.raises(schema.SchemaViolation, match="does not match compare.schema.json"):
        schema.validate_compare(cmp)


# ----------------------------------------------------------------------------- the writers check


def test_writers_refuse_a_broken_document_when_the_check_is_on(tmp_path: Path, monkeypatch) -> None:
    rep = copy.deepcopy(golden_reports()["demo"])
    rep["culprits"][0]["kind"] = "mmap"
    monkeypatch.setenv(schema.ENV, "1")
    with pytest.raises(schema.SchemaViolation, match="culprits/0/kind"):
        json_report.write(rep, tmp_path)
    assert not (tmp_path / "report.json").exists()
    cmp = golden_compares()["demo->ucx"]
    cmp["verdict"] = "better"
    with pytest.raises(schema.SchemaViolation):
        COMPARE_FORMATS.write(cmp, tmp_path, ("json", "md"))
    assert not list(tmp_path.iterdir())
    monkeypatch.setenv(schema.ENV, "0")  # off: written as it is (users never pay for the check)
    json_report.write(rep, tmp_path)
    assert json.loads((tmp_path / "report.json").read_text())["culprits"][0]["kind"] == "mmap"


def test_compare_fails_loudly_on_a_report_that_breaks_the_contract(tmp_path: Path) -> None:
    """End to end: a hand-edited before report whose culprit kind is outside the vocabulary makes a
    compare.json that does not match its schema; with the check on, compare exits non-zero and writes none."""
    for side in ("before", "after"):
        (tmp_path / side).mkdir()
        shutil.copy(GOLDEN / "demo" / "expected" / "report.json", tmp_path / side / "report.json")
    bad = json.loads((tmp_path / "before" / "report.json").read_text())
    bad["culprits"][0]["kind"] = "mmap"
    (tmp_path / "before" / "report.json").write_text(json.dumps(bad))
    r = run_cli("compare", tmp_path / "before", tmp_path / "after", "--out", tmp_path / "out",
                env={schema.ENV: "1"}, timeout=120)
    assert r.returncode != 0 and "does not match compare.schema.json" in r.stderr, r.stderr
    assert not (tmp_path / "out" / "compare.json").exists()
    r = run_cli("compare", tmp_path / "after", tmp_path / "after", "--out", tmp_path / "out",
                env={schema.ENV: "1"}, timeout=120)
    assert r.returncode == 0, r.stderr
    schema.validate_compare(json.loads((tmp_path / "out" / "compare.json").read_text()))


def test_without_jsonschema_the_check_says_so_and_writes(tmp_path: Path) -> None:
    """An installed wheel without the dev extra, under a run that set the variable: one warning, and the
    report written unchecked (a hunt is never lost to a missing test tool)."""
    code = ("import sys; sys.modules['jsonschema'] = None\n"
            "import json; from pathlib import Path; from leaktrace.report import json_report\n"
            f"rep = json.loads(Path({str(GOLDEN / 'demo' / 'expected' / 'report.json')!r}).read_text())\n"
            f"json_report.write(rep, Path({str(tmp_path)!r})); json_report.write(rep, Path({str(tmp_path)!r}))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=str(REPO),
                       env={**os.environ, schema.ENV: "1"})
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("jsonschema package is not installed") == 1, r.stderr
    assert (tmp_path / "report.json").is_file()
