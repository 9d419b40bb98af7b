"""`--format`: one parser for every command, checked before any work (an unknown name is a usage error,
exit 2, one line, before attaching, compiling BPF or starting the demo's workload), report.json always
written whatever it says, and one reporter per format from a registry."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import run_cli
from golden import GOLDEN

from leaktrace.errors import UsageError
from leaktrace.report.formats import COMPARE_FORMATS, REPORT_FORMATS

# Starting Python, click and leaktrace's CLI costs ~0.1 s of CPU; a command that got as far as importing the
# analysis (pandas) or probes would cost several times that, and one that hunted, the whole --duration.
MAX_CPU_S = 1.0
MAX_WALL_S = 15.0  # a loaded 2-core machine; the hunts asked for below would run 60 s


def timed_cli(*args: object) -> tuple[subprocess.CompletedProcess, float, float]:
    """The command's result, its wall time and the CPU time of the process (and anything it started)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = run_cli(*args, timeout=120)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r, wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bogus_commands(tmp: Path) -> dict[str, list[object]]:
    out = tmp / "out"
    return {
        "hunt": ["hunt", "--pid", os.getpid(), "--no-gdb", "--duration", "60", "--out", out, "--format", "json,bogus"],
        # the session does not exist: a check made after opening it would say so (exit 7)
        "report": ["report", tmp / "no-session", "--format", "bogus"],
        "compare": ["compare", tmp / "no-before", tmp / "no-after", "--out", out, "--format", "md,bogus"],
        "demo": ["demo", "--duration", "60", "--out", out, "--format", "bogus"],
        "cluster hunt": ["cluster", "hunt", "--address", "127.0.0.1:1", "--match", "x", "--duration", "60",
                         "--out", out, "--format", "bogus"],
    }


@pytest.mark.parametrize("command", list(bogus_commands(Path("/"))))
def test_unknown_format_is_a_usage_error_before_any_work(tmp_path: Path, command: str) -> None:
    r, wall, cpu = timed_cli(*bogus_commands(tmp_path)[command])
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("leaktrace: error: --format: unknown format(s) bogus")
    assert "choose from json, md" in r.stderr
    assert not (tmp_path / "out").exists()  # no session directory, no demo output
    assert cpu < MAX_CPU_S and wall < MAX_WALL_S, (cpu, wall)


def test_hunt_writes_report_json_whatever_format_says(tmp_path: Path, spawn) -> None:
    target = spawn(["sleep", "120"], ready=None)
    out = tmp_path / "s"
    r = run_cli("hunt", "--pid", target.pid, "--no-bpf", "--no-gdb", "--duration", "2", "--format", "md",
                "--out", out, "-q", timeout=180)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == ["meta.json", "report.json", "report.md"]
    assert json.loads((out / "report.json").read_text())["processes"][0]["pid"] == target.pid
    assert f"report: {out / 'report.json'}" in r.stdout
    # report: the same rule, and html brings the flame graph's data with it
    (out / "report.json").unlink()
    (out / "report.md").unlink()
    r = run_cli("report", out, "--format", "html", timeout=180)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == [
        "meta.json", "outstanding.folded", "report.html", "report.json"]
    assert "wrote json, html, folded" in r.stdout


def test_compare_writes_compare_json_whatever_format_says(tmp_path: Path) -> None:
    for side in ("before", "after"):
        (tmp_path / side).mkdir()
        shutil.copy(GOLDEN / "demo" / "expected" / "report.json", tmp_path / side / "report.json")
    r = run_cli("compare", tmp_path / "before", tmp_path / "after", "--out", tmp_path / "c", "--format", "md",
                timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["compare.json", "compare.md"]


def test_registry() -> None:
    assert REPORT_FORMATS.parse(" md , json,md,") == ("md", "json")
    assert REPORT_FORMATS.parse("") == ()
    assert REPORT_FORMATS.selected(["md"]) == ("json", "md")
    assert REPORT_FORMATS.selected(["html"]) == ("json", "html", "folded")
    assert REPORT_FORMATS.selected(["folded"]) == ("json", "folded")
    assert COMPARE_FORMATS.selected([]) == ("json",)
    with pytest.raises(UsageError) as e:
        COMPARE_FORMATS.parse("json,folded")
    assert e.value.exit_code == 2 and "folded" in str(e.value)
    files = set()
    for formats in (REPORT_FORMATS, COMPARE_FORMATS):
        for name in formats.names:
            reporter = formats.reporter(name)
            assert reporter.name == name and callable(reporter.write)
            files.add(reporter.filename)
    assert files == {"report.json", "report.md", "report.html", "outstanding.folded", "outstanding.pb.gz",
                     "compare.json", "compare.md", "compare.html"}
