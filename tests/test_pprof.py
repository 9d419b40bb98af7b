"""`--format pprof`: outstanding.pb.gz read back by `go tool pprof` (Debian's golang-go, installed by
.ci/setup.d/45-pprof.sh), on recorded sessions and on a real hunt: the top frames, totals, regions, labels
and time range are the eBPF ledger's."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import is_root, run_cli
from golden import GOLDEN

from leaktrace.report.pprof import DROP_FRAMES, build_profile, messages
from leaktrace.session import SessionReader

MB = 2**20


def go_pprof(*args: str | Path) -> str:
    go = shutil.which("go")
    if go is None:
        pytest.skip("`go` not installed (.ci/setup.d/45-pprof.sh installs Debian's golang-go)")
    r = subprocess.run([go, "tool", "pprof", *map(str, args)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def top(profile: Path, index: str = "inuse_space") -> tuple[int, list[tuple[int, str]]]:
    """(total, [(flat, function)]) of `go tool pprof -top` in plain units."""
    out = go_pprof("-top", f"-sample_index={index}", "-unit=B" if index != "inuse_objects" else "-unit=",
                   profile)
    total = int(re.search(r"accounting for (\d+)B?, ", out).group(1))
    rows = [(int(m.group(1)), m.group(2)) for m in re.finditer(r"^\s*(\d+)B?\s+\S+%\s+\S+%\s+\S+\s+\S+%\s+(.+)$",
                                                                  out, re.M)]
    return total, rows


def ledger(session: Path) -> tuple[int, int, str]:
    """(bytes, regions, the top stack's first frame the profile keeps) of the ledger's outstanding regions."""
    reader = SessionReader(session)
    regs = reader.table("ledger_regions")
    regs = regs[~regs["preexisting"].astype(bool)]
    stacks = reader.table("bpf_stacks").set_index("stack_key")["frames"]
    key = regs.groupby("stack_key")["size"].sum().idxmax()
    leaf = next(f for f in str(stacks[key]).split("\n") if f and not re.fullmatch(DROP_FRAMES, f))
    return int(regs["size"].sum()), len(regs), leaf


@pytest.mark.parametrize("name", ["demo", "ucx"])
def test_golden_session_as_pprof(name, tmp_path):
    session = tmp_path / name
    shutil.copytree(GOLDEN / name, session, ignore=shutil.ignore_patterns("expected"))
    r = run_cli("report", session, "--format", "pprof")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in session.iterdir() if p.is_file()) == ["meta.json", "outstanding.pb.gz",
                                                                        "report.json"]
    profile = session / "outstanding.pb.gz"
    report = json.loads((session / "report.json").read_text())
    culprit = report["culprits"][0]
    size, regions, leaf = ledger(session)
    total, rows = top(profile)
    assert total == size and rows[0] == (size, leaf), rows  # the culprit's call site on top, all its bytes
    assert leaf.startswith(culprit["library"] + "!") and leaf in culprit["stack"]
    assert top(profile, "inuse_objects")[0] == regions
    assert top(profile, "growth_space_per_minute")[0] == pytest.approx(culprit["mb_per_min"] * MB, abs=1)
    (session / "pprof-top.txt").write_text(go_pprof("-top", profile))  # what a user sees, kept with the session
    raw = go_pprof("-raw", profile)
    assert "inuse_space/bytes[dflt] inuse_objects/count growth_space_per_minute/bytes" in raw
    assert f"pid:[{culprit['pid']}]" in raw and f"library:[{culprit['library']}]" in raw
    start = json.loads((session / "meta.json").read_text())["start_wall"]
    assert float(re.search(r"^Duration: ([\d.]+)", raw, re.M).group(1)) == pytest.approx(report["duration_s"], abs=0.1)
    assert re.search(r"^Mappings\n(.*\n)*.* " + re.escape(culprit["library"]) + r" ", raw, re.M)
    # The same bytes parsed with the message layout it was written with: frames keep their library!function
    prof = messages()["Profile"].FromString(gzip.decompress(profile.read_bytes()))
    names = {prof.string_table[f.name] for f in prof.function}
    assert leaf in names and "libc.so.6!syscall+0x19" in names
    assert prof.time_nanos == int(start * 1e9) and prof.string_table[prof.mapping[0].filename] == culprit["library"]


def test_watcher_only_report_still_gives_a_profile():
    """No eBPF ledger and no culprit stack: growth by process and memory class, as outstanding.folded."""
    report = {"duration_s": 60.0, "culprits": [], "verdict": "inconclusive",
              "processes": [{"pid": 7, "label": "worker", "growth_by_class": {"anon": 2.0, "heap": -1.0}}]}
    prof = build_profile(report)
    strings = list(prof.string_table)
    assert [s.value[0] for s in prof.sample] == [2 * MB]
    assert "[anon]" in strings and any("watcher only" in strings[c] for c in prof.comment)


def test_real_hunt_as_pprof(leaker_bin, spawn, tmp_path):
    if not is_root():
        pytest.skip("the eBPF ledger needs root (see `leaktrace doctor`)")
    target = spawn([leaker_bin, "--leak-kib-per-s", "1024"])
    out = tmp_path / "hunt"
    r = run_cli("hunt", "--pid", target.pid, "--duration", "6", "--no-gdb", "--format", "pprof", "--out", out,
                "-q", timeout=180)
    assert r.returncode == 0, r.stderr
    size, regions, leaf = ledger(out)
    assert leaf.startswith("leaker!main"), leaf  # raw syscall(SYS_mmap) from the fixture's main
    total, rows = top(out / "outstanding.pb.gz")
    assert total == size >= 2 * MB and rows[0] == (size, leaf), rows
    assert top(out / "outstanding.pb.gz", "inuse_objects")[0] == regions
    raw = go_pprof("-raw", out / "outstanding.pb.gz")
    assert f"pid:[{target.pid}]" in raw and "library:[leaker]" in raw
    (out / "pprof-top.txt").write_text(go_pprof("-top", out / "outstanding.pb.gz"))  # what a user sees, kept
    report = json.loads((out / "report.json").read_text())
    assert report["ledger"]["outstanding_bytes"] == pytest.approx(size, rel=0.05)
