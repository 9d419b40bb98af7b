"""The Python line behind native growth, on real hunts: a Python host (the venv's CPython 3.11, and a 3.10 and
a 3.12 when installed) leaking through a stripped library it calls with ctypes. The culprit names the library and
carries the host's Python frames at the growing call site (gdb stopped there, the frames read from the
interpreter's memory), innermost first; report.md's call path, outstanding.folded and the pprof profile put
them above the native frames; no stack holds a frame that is not a code address."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys

import pytest
from conftest import LEAKTRACE, REPO, Proc, is_root
from fixtures.build import build
from fixtures.gdb_target import LEAK_LIB
from test_pyframes import _interpreters

from leaktrace.report.pprof import messages
from leaktrace.session import SessionReader

HOST = REPO / "tests" / "fixtures" / "py_ctypes_host.py"
HUNT_S = 20
INVENTED = re.compile(r"(^|;)\?[!@]0x|\[(stack|heap)")


def _pythons() -> list[str]:
    """The venv's interpreter, and a 3.10 (thread states matched on pthread_t) and a 3.12 where installed."""
    return [p for p in _interpreters() if p == sys.executable or "3.10" in p or "3.12" in p]


def _line(marker: str) -> int:
    return next(i for i, t in enumerate(HOST.read_text().splitlines(), 1) if marker in t)


@pytest.mark.gdb
@pytest.mark.bpf
@pytest.mark.parametrize("python", _pythons())
def test_python_frames_above_a_stripped_library(python, tmp_path):
    if not is_root():
        pytest.skip("the hunt's eBPF ledger and gdb need root")
    lib = build(LEAK_LIB, ["gdb_leaklib.c"], cflags=["-fomit-frame-pointer"], ldflags=[f"-Wl,-soname,{LEAK_LIB}"],
                shared=True, strip=True)
    host = Proc([python, str(HOST), str(lib), "--mb-per-s", "2"])
    out = tmp_path / "s"
    try:
        r = subprocess.run([*LEAKTRACE, "hunt", "--pid", str(host.pid), "--duration", str(HUNT_S), "--out", str(out),
                            "--format", "json,md,folded,pprof", "-q"], cwd=str(REPO), capture_output=True, text=True,
                           timeout=HUNT_S + 240)
    finally:
        host.kill()
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "report.json").read_text())
    top = rep["culprits"][0]
    assert top["library"] == LEAK_LIB, rep["culprits"]
    assert all(isinstance(c["python_stack"], list) for c in rep["culprits"])
    send = f"{HOST}:send_batch:{_line('the growing call')}"
    assert top["python_stack"][:3] == [send, f"{HOST}:step:{_line('self.send_batch()')}",
                                       f"{HOST}:main:{_line('conn.step(per_tick)')}"], top["python_stack"]
    # report.md: the call path from the Python line to the library
    md = (out / "report.md").read_text()
    assert f"Call path: `py_ctypes_host.py:send_batch:{_line('the growing call')} → " in md, md
    # folded: the Python frames, root first, right above the native frames of the call site
    lines = [ln for ln in (out / "outstanding.folded").read_text().splitlines() if send in ln]
    assert lines, (out / "outstanding.folded").read_text()
    frames = lines[0].rsplit(" ", 1)[0].split(";")
    assert frames.index(send) < min(i for i, f in enumerate(frames) if f.startswith(LEAK_LIB)), frames
    # pprof: send_batch is a function with the host's file name and its line
    prof = messages()["Profile"].FromString(gzip.decompress((out / "outstanding.pb.gz").read_bytes()))
    st = prof.string_table
    fn = {f.id: (st[f.name], st[f.filename]) for f in prof.function}
    lines_of = {(fn[ln.function_id], ln.line) for loc in prof.location for ln in loc.line}
    assert (("send_batch", str(HOST)), _line("the growing call")) in lines_of, lines_of
    # no invented frame anywhere
    stacks = [f for c in rep["culprits"] for f in c["stack"]]
    assert not [f for f in stacks if INVENTED.search(f)], stacks
    assert not INVENTED.search((out / "outstanding.folded").read_text())
    assert not [n for n, _ in fn.values() if INVENTED.search(n)]
    # read from the interpreter's memory, within the stops gdb made anyway
    reader = SessionReader(out)
    runs = reader.table("gdb_runs")
    assert runs["python"].str.startswith("ok: Python 3.1").all(), runs["python"].tolist()
    samples = reader.table("gdb_samples")
    assert (samples["python_us"] > 0).all() and (samples["python_us"] <= samples["stop_us"]).all()
