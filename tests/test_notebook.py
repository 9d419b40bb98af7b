"""notebooks/leak_hunt.ipynb runs top to bottom (nbclient, a real kernel) on a real session."""

from __future__ import annotations

import os

import pytest
from conftest import REPO, Proc, is_root

from leaktrace.hunt import run_hunt
from leaktrace.probes import HuntOptions


def test_notebook_executes_on_a_session(leaker_bin, tmp_path):
    # Inside the test, so a missing dev dependency is this test's skip (a failure in strict mode), not a
    # module skipped at collection.
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    target = Proc([str(leaker_bin), "--leak-kib-per-s", "1024", "--mremap-kib-per-s", "256"])
    try:
        run_hunt([target.pid], HuntOptions(duration=10, interval=1.0, smaps_every=2, bpf=is_root(), gdb=False),
                 tmp_path / "s", write_reports=False)
    finally:
        target.kill()
    nb = nbformat.read(REPO / "notebooks" / "leak_hunt.ipynb", as_version=4)
    os.environ["LEAKTRACE_SESSION"] = str(tmp_path / "s")
    try:
        nbclient.NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                                ).execute()
    finally:
        os.environ.pop("LEAKTRACE_SESSION", None)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "NOTEBOOK-OK verdict=leak" in text, text[-2000:]
    images = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                 if "image/png" in o.get("data", {}))
    assert images >= 2  # memory over time, growth by class
    # the interactive flame graph, as in report.html: its data and the inlined scripts that draw it
    html = "".join("".join(o.get("data", {}).get("text/html", "")) for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []))
    assert 'id="flamegraph"' in html and "leaktraceFlame" in html and "d3-flame-graph" in html, html[:500]
