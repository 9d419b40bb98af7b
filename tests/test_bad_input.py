"""Bad-input matrix: fuzzed /proc and Prometheus parsers, hostile mapping names on a real process,
session directories edited by hand, and CLI misuse. Each gives a clear error or a correct result,
never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from conftest import run_cli
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from ops_helpers import one_error_line

from leaktrace import procfs
from leaktrace.procfs import ParseError

# derandomize: the same examples on every run (CI is deterministic); explicit @example cases pin what a
# random run found
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None,
                derandomize=True)

# Paths as the kernel prints them: any character but NUL and "\n" (which it escapes as "\012").
path_chars = st.characters(blacklist_characters="\n\x00", blacklist_categories=("Cs",))
kernel_paths = st.one_of(
    st.just(""),
    st.sampled_from(["[heap]", "[stack]", "[vdso]", "[anon:vllm kv]", "/SYSV00000000 (deleted)"]),
    st.text(path_chars, max_size=300).map(lambda s: "/" + s),
    st.text(path_chars, max_size=40).map(lambda s: "/dev/shm/" + s + " (deleted)"),
)


@st.composite
def maps_lines(draw) -> tuple[str, int, int, str]:
    start = draw(st.integers(0, 2**47)) & ~0xFFF
    end = start + (draw(st.integers(1, 2**20)) << 12)
    perms = draw(st.sampled_from(["rw-p", "r-xp", "r--s", "---p", "rwxs"]))
    path = draw(kernel_paths)
    inode = draw(st.integers(0, 2**40))
    pad = " " * (26 - len(str(inode))) if path else ""
    offset = draw(st.integers(0, 2**40))
    line = f"{start:x}-{end:x} {perms} {offset:08x} fd:01 {inode}"
    if path:
        line += f"{pad} {path}"
    return line, start, end, path


@FUZZ
@given(st.lists(maps_lines(), max_size=20))
def test_maps_roundtrip_hostile_paths(lines):
    """Valid lines with any path the kernel can print parse back to the same path."""
    parsed = procfs.parse_maps("\n".join(ln for ln, *_ in lines) + "\n")
    assert [(m.start, m.end, m.path) for m in parsed] == [(s, e, p) for _, s, e, p in lines]


@FUZZ
@given(st.lists(maps_lines(), max_size=20), st.text(max_size=200))
def test_mapped_inodes_as_parse_maps_reads_them(lines, noise):
    """The inodes read in one regex pass are those of the parsed mappings, whatever the paths; a file that
    does not parse raises ParseError in both."""
    text = "\n".join(ln for ln, *_ in lines) + "\n"
    assert procfs.mapped_inodes(text) == {m.inode for m in procfs.parse_maps(text) if m.inode}
    try:
        want = {m.inode for m in procfs.parse_maps(text + noise) if m.inode}
    except ParseError:
        with pytest.raises(ParseError):
            procfs.mapped_inodes(text + noise)
    else:
        assert procfs.mapped_inodes(text + noise) == want


@FUZZ
@given(st.lists(maps_lines(), max_size=8), st.lists(st.integers(0, 10**9), max_size=8), st.text(max_size=200))
def test_smaps_roundtrip_and_noise(lines, rss, noise):
    """smaps with hostile paths parses exactly; arbitrary garbage raises ParseError, nothing else."""
    text = ""
    for (ln, *_), kb in zip(lines, rss + [0] * len(lines), strict=False):
        text += f"{ln}\nSize: 4 kB\nRss: {kb} kB\nAnonymous: {kb} kB\nVmFlags: rd wr mr mw me ac\n"
    parsed = procfs.parse_smaps(text)
    assert [(m.path, m.rss) for m in parsed] == [
        (p, kb * 1024) for (_, _, _, p), kb in zip(lines, rss + [0] * len(lines), strict=False)
    ]
    try:
        procfs.parse_smaps(text + noise)
    except ParseError:
        pass


@FUZZ
@given(st.text(max_size=2000))
def test_maps_garbage_only_parse_errors(text):
    try:
        procfs.parse_maps(text)
    except ParseError:
        pass


@FUZZ
@given(st.text(max_size=2000))
def test_smaps_garbage_only_parse_errors(text):
    try:
        procfs.parse_smaps(text)
    except ParseError:
        pass


# (line, (key, kB) for a field line else None). The noise lines hold no "kB", so no noise line is a field.
rollup_lines = st.one_of(
    st.tuples(
        st.sampled_from(["Rss", "Pss", "Anonymous", "Swap", "Private_Dirty", "Pss_Anon"]),
        st.integers(0, 2**40),
    ).map(lambda kv: (f"{kv[0]}:   {kv[1]} kB", kv)),
    st.just(("55d0c0000000-7ffd5c7f2000 ---p 00000000 00:00 0                          [rollup]", None)),
    st.text(max_size=80).filter(lambda s: "\n" not in s and "kB" not in s).map(lambda s: (s, None)),
)


@FUZZ
@given(st.lists(rollup_lines, max_size=30))
def test_smaps_rollup_fuzz(lines):
    """Every field line counts (the last one of a key wins), in bytes; nothing else does; no Rss line is
    a ParseError."""
    text = "\n".join(ln for ln, _ in lines)
    want = {k: kb * 1024 for _, kv in lines if kv for k, kb in [kv]}
    if "Rss" not in want:
        with pytest.raises(ParseError):
            procfs.parse_smaps_rollup(text)
        return
    assert procfs.parse_smaps_rollup(text) == want


prom_lines = st.one_of(
    st.sampled_from(
        [
            "# HELP vllm:num_requests_running Number of requests.",
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{model_name="m"} 3.0',
            "# TYPE vllm:request_success_total counter",
            'vllm:request_success_total{finished_reason="stop",model_name="m"} 12.0',
            'vllm:prompt_tokens_by_source_total{source="external_kv_transfer"} 1e3',
            "process_resident_memory_bytes 7.4e+08",
            "# EOF",
            "",
            "bad line {",
            'x{a="\\"} 1',
            "x NaN",
            "x +Inf",
        ]
    ),
    # noise that never names a vLLM or process metric, so only the lines above can add to a figure
    st.text(max_size=60).filter(lambda s: "\n" not in s and "vllm" not in s and "process_" not in s),
)


# The valid sample lines above that summarize() counts, with what each adds to which figure.
PROM_COUNTED = {
    'vllm:num_requests_running{model_name="m"} 3.0': ("running", 3.0),
    'vllm:request_success_total{finished_reason="stop",model_name="m"} 12.0': ("requests", 12.0),
    'vllm:prompt_tokens_by_source_total{source="external_kv_transfer"} 1e3': ("kv_external_prompt_tokens", 1000.0),
    "process_resident_memory_bytes 7.4e+08": ("api_rss", 7.4e8),
}


@FUZZ
@given(st.lists(prom_lines, max_size=20))
@example(["INFINITY"])  # prometheus_client reads it as a sample INFINIT = +Inf
def test_prometheus_text_fuzz(lines):
    """vLLM /metrics pages, valid or not: a list of samples or a ValueError (the scraper's contract); when
    the page parses, each counted sample line adds its value once to its figure, every other figure is 0."""
    from leaktrace.vllm import metrics

    try:
        samples = metrics.parse_metrics("\n".join(lines) + "\n")
    except ValueError:
        return
    summary = metrics.summarize(samples)
    # The scrape's parse, less the names the hunt does not keep: the same samples of the names it keeps
    kept = metrics.parse_metrics("\n".join(lines) + "\n", keep=lambda n: n.startswith("vllm:"))
    assert kept == [s for s in samples if s[0].startswith("vllm:")], (kept, samples)
    want = dict.fromkeys(summary, 0.0)
    for ln in lines:
        if ln in PROM_COUNTED:
            key, v = PROM_COUNTED[ln]
            want[key] += v
    assert summary == want, (summary, want)


# ----------------------------------------------------------------------------- hostile mappings, for real

HOSTILE_TARGET = r"""
import mmap, os, sys
d = sys.argv[1]
names = ["with space", "new\nline", "fake (deleted)", "form\x0cfeed", "line\u2028sep", "tab\there", "gone"]
long_dir = os.path.join(d, *(["L" * 200] * 18))  # a path of ~3.7 kB (PATH_MAX is 4096)
os.makedirs(long_dir)
names.append(os.path.relpath(os.path.join(long_dir, "long"), d))
maps = []
for n in names:
    p = os.path.join(d, n)
    with open(p, "wb") as f:
        f.truncate(65536)
    fd = os.open(p, os.O_RDWR)
    m = mmap.mmap(fd, 65536)
    m[:] = b"x" * 65536
    maps.append(m)
os.unlink(os.path.join(d, "gone"))  # a really deleted file, still mapped
print("ready", flush=True)
import time
time.sleep(600)
"""


def test_hostile_mapping_names_real_process(tmp_path, spawn):
    d = tmp_path / "files"
    d.mkdir()
    target = spawn([sys.executable, "-c", HOSTILE_TARGET, str(d)])
    raw = procfs.read_maps(target.pid)  # the parser on the real thing first
    paths = {m.path for m in raw}
    assert f"{d}/with space" in paths and f"{d}/new\\012line" in paths
    assert f"{d}/form\x0cfeed" in paths and f"{d}/line\u2028sep" in paths
    assert f"{d}/gone (deleted)" in paths and f"{d}/fake (deleted)" in paths
    assert any(p.endswith("/long") and len(p) > 3500 for p in paths)
    out = tmp_path / "s"
    r = run_cli(
        "hunt",
        "--pid",
        target.pid,
        "--duration",
        "2",
        "--interval",
        "0.5",
        "--smaps-every",
        "1",
        "--out",
        out,
        "--no-gdb",
        "--no-bpf",
        "--format",
        "json,md",
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    from leaktrace.session import SessionReader

    regions = SessionReader(out).table("regions")
    got = set(regions["path"])
    for p in paths:
        if str(d) in p:
            assert p in got, f"mapping {p!r} missing from the session"
    assert json.loads((out / "report.json").read_text())["schema"] == "leaktrace.report/1"


# ----------------------------------------------------------------------------- sessions edited by hand


@pytest.fixture(scope="module")
def good_session(tmp_path_factory, leaker_bin):
    """One real short session, copied by each test before it is damaged."""
    from conftest import Proc

    out = tmp_path_factory.mktemp("good") / "s"
    p = Proc([str(leaker_bin), "--leak-kib-per-s", "512"])
    try:
        r = run_cli(
            "hunt",
            "--pid",
            p.pid,
            "--duration",
            "3",
            "--interval",
            "0.25",
            "--smaps-every",
            "2",
            "--out",
            out,
            "--no-gdb",
            "--no-bpf",
            "--format",
            "json",
        )
        assert r.returncode == 0, r.stderr
    finally:
        p.kill()
    return out


def _damaged(good: Path, tmp_path: Path, how: str) -> Path:
    s = tmp_path / "s"
    shutil.copytree(good, s)
    tables = s / "tables"
    if how == "meta-truncated":
        (s / "meta.json").write_text((s / "meta.json").read_text()[:40])
    elif how == "meta-missing":
        (s / "meta.json").unlink()
    elif how == "meta-wrong-types":
        meta = json.loads((s / "meta.json").read_text())
        meta.update(duration_s="long", attach_s=[1], exited=["x"], labels="none", warnings={"a": 1})
        (s / "meta.json").write_text(json.dumps(meta))
    elif how == "meta-not-object":
        (s / "meta.json").write_text("[1, 2, 3]")
    elif how == "part-truncated":
        part = next((tables / "rollup").glob("part-*.parquet"))
        part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    elif how == "part-garbage":
        (tables / "rollup" / "part-999999.parquet").write_bytes(os.urandom(3000))
    elif how == "part-wrong-types":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(
            pa.table({"t": ["soon"], "pid": ["me"], "rss": ["lots"]}),
            tables / "rollup" / "part-999999.parquet",
        )
    elif how == "tables-deleted":
        shutil.rmtree(tables)
    elif how == "rollup-deleted":
        shutil.rmtree(tables / "rollup")
    elif how == "tables-is-file":
        shutil.rmtree(tables)
        tables.write_text("not a directory")
    else:
        raise AssertionError(how)
    return s


@pytest.mark.parametrize(
    "how,rc",
    [
        ("meta-truncated", 7),
        ("meta-missing", 7),
        ("meta-not-object", 7),
        ("meta-wrong-types", 7),
        ("part-truncated", 0),
        ("part-garbage", 0),
        ("part-wrong-types", 0),
        ("tables-deleted", 0),
        ("rollup-deleted", 0),
        ("tables-is-file", 0),
    ],
)
def test_hand_edited_session(good_session, tmp_path, how, rc):
    """Damaged meta.json: one line, exit 7. Damaged or missing tables: the report renders from what is
    left and says what it skipped."""
    s = _damaged(good_session, tmp_path, how)
    r = run_cli("report", s, "--format", "json,md")
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == rc, r.stderr
    if rc:
        line = one_error_line(r.stderr)
        assert "meta.json" in line, line
        return
    rep = json.loads((s / "report.json").read_text())
    if how.startswith("part-"):
        assert any("skipped" in w for w in rep["warnings"]), rep["warnings"]
    if how in ("part-garbage", "part-wrong-types"):  # an extra bad part: every good row still counts
        from leaktrace.session import SessionReader

        good_rows = len(SessionReader(good_session).table("rollup"))
        assert good_rows >= 4
        assert [p["samples"] for p in rep["processes"]] == [good_rows], (rep["processes"], good_rows)
    else:
        assert rep["verdict"] == "inconclusive"


# ----------------------------------------------------------------------------- CLI misuse


def _free_pid() -> int:
    pid = 4_000_000
    while Path(f"/proc/{pid}").exists():
        pid += 1
    return pid


def test_cli_bad_input(tmp_path, spawn, leaker_bin):
    cases = []
    r = run_cli("hunt", "--pid", _free_pid(), "--duration", "1", "--out", tmp_path / "a")
    cases.append(("no such pid", r, 3))
    target = spawn([leaker_bin])
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "file").write_text("")
    r = run_cli(
        "hunt",
        "--pid",
        target.pid,
        "--duration",
        "1",
        "--out",
        tmp_path / "ro" / "file" / "s",
        "--no-gdb",
        "--no-bpf",
    )
    cases.append(("--out under a file", r, 9))
    r = run_cli(
        "hunt", "--pid", target.pid, "--duration", "1", "--out", "/proc/leaktrace/s", "--no-gdb", "--no-bpf"
    )
    cases.append(("--out not writable", r, 9))
    r = run_cli("report", tmp_path / "missing")
    cases.append(("report on a missing session", r, 7))
    (tmp_path / "trunc").mkdir()
    (tmp_path / "trunc" / "meta.json").write_text('{"schema": "leaktrace.session/1", "id"')
    r = run_cli("report", tmp_path / "trunc")
    cases.append(("report on a truncated session", r, 7))
    r = run_cli("hunt", "--pid", target.pid, "--duration", "-1")
    cases.append(("negative duration", r, 2))
    r = run_cli(
        "hunt",
        "--pid",
        target.pid,
        "--duration",
        "1",
        "--prometheus-port",
        "99999",
        "--no-gdb",
        "--no-bpf",
        "--out",
        tmp_path / "p",
    )
    cases.append(("impossible prometheus port", r, 2))
    for what, r, rc in cases:
        assert r.returncode == rc, (what, r.returncode, r.stderr)
        one_error_line(r.stderr)
