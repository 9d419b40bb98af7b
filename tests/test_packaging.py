"""The built package traces: a wheel and an sdist made by `python -m build`, each installed into a fresh
virtual environment (no system site packages, no repository on sys.path), run `leaktrace doctor` and a
hunt with the eBPF and gdb probes from a directory outside the repository. Both find bpf/ and
gdb_scripts/ inside their own site-packages (leaktrace/_data/), not in the checkout; the editable
install these tests run in finds the checkout's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, is_root

from leaktrace import resources
from leaktrace.session import SessionReader

# What the package needs at run time besides its Python files (as the wheel names them).
DATA_FILES = ["leaktrace/_data/bpf/leaktrace.bpf.c", "leaktrace/_data/bpf/leaktrace.h",
              "leaktrace/_data/bpf/kheaders/include/linux/kconfig.h", "leaktrace/_data/gdb_scripts/sampler.py",
              "leaktrace/_data/gdb_scripts/sampler_settings.gdb", "leaktrace/report/templates/report.html.j2",
              "leaktrace/analysis/rules.toml", "leaktrace/demo/xfer.c"]
# Variables that would point the installed package back at the checkout.
CHECKOUT_POINTERS = ("LEAKTRACE_BPF_DIR", "LEAKTRACE_GDB_SCRIPTS", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in CHECKOUT_POINTERS}


def run(argv: list[str | Path], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    res = subprocess.run([str(a) for a in argv], cwd=str(cwd), env=clean_env(), capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, f"{argv}: exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """The sdist, and the wheel that `build` makes from it (so the sdist is proven complete too)."""
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", out, REPO], cwd=out)
    found = {"wheel": list(out.glob("leaktrace-*.whl")), "sdist": list(out.glob("leaktrace-*.tar.gz"))}
    assert all(len(v) == 1 for v in found.values()), found
    return {k: v[0] for k, v in found.items()}


@pytest.fixture(scope="module")
def venv(tmp_path_factory, dists) -> Path:
    """A fresh venv holding the wheel and the project's dependencies (installed once for both tests)."""
    root = tmp_path_factory.mktemp("venv") / "v"
    run([sys.executable, "-m", "venv", root], cwd=root.parent)
    run([root / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", dists["wheel"]],
        cwd=root.parent)
    return root


def test_checkout_copy_found_and_overrides_honoured(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("LEAKTRACE_BPF_DIR", raising=False)
    monkeypatch.delenv("LEAKTRACE_GDB_SCRIPTS", raising=False)
    assert resources.bpf_dir() == REPO / "bpf" and resources.gdb_scripts_dir() == REPO / "gdb_scripts"
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("LEAKTRACE_BPF_DIR", "bpf")  # relative: made absolute at the lookup
    assert resources.bpf_dir() == REPO / "bpf"
    monkeypatch.setenv("LEAKTRACE_GDB_SCRIPTS", str(tmp_path))  # no sampler.py there: no fallback either
    with pytest.raises(resources.ResourceMissing, match="LEAKTRACE_GDB_SCRIPTS"):
        resources.gdb_scripts_dir()


def test_wheel_holds_the_data_files(dists) -> None:
    names = set(zipfile.ZipFile(dists["wheel"]).namelist())
    assert not [f for f in DATA_FILES if f not in names], sorted(names)
    assert not [n for n in names if n.startswith(("bpf/", "gdb_scripts/"))], "data outside the package"


def site_packages(venv: Path) -> Path:
    paths = list((venv / "lib").glob("python3*/site-packages"))
    assert len(paths) == 1, paths
    return paths[0]


def doctor(venv: Path, cwd: Path) -> dict[str, dict]:
    res = subprocess.run([str(venv / "bin" / "leaktrace"), "doctor", "--json"], cwd=str(cwd), env=clean_env(),
                         capture_output=True, text=True, timeout=120)
    # The exit status is the machine's (every check), not the package's: read the checks instead.
    return {c["name"]: c for c in json.loads(res.stdout)["checks"]}


def hunt(venv: Path, pid: int, out: Path) -> dict:
    # --gdb-samples 3: sample at once rather than wait for the default 8 MiB of growth.
    run([venv / "bin" / "leaktrace", "hunt", "--pid", pid, "--duration", "6", "--interval", "0.5",
         "--gdb-samples", "3", "--out", out, "--format", "json", "-q"], cwd=out.parent, timeout=180)
    return json.loads((out / "report.json").read_text())


@pytest.mark.bpf
@pytest.mark.gdb
@pytest.mark.skipif(not is_root(), reason="the BPF + gdb hunt needs root")
@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_installed_package_hunts_with_bpf_and_gdb(kind, dists, venv, leaker_bin, spawn, tmp_path) -> None:
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    run([*pip, "--force-reinstall", "--no-deps", dists[kind]], cwd=tmp_path, timeout=300)
    data = site_packages(venv) / "leaktrace" / "_data"
    where = run([venv / "bin" / "python", "-c", "import leaktrace; print(leaktrace.__file__)"], cwd=tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(site_packages(venv)), where.stdout

    checks = doctor(venv, tmp_path)
    for name, file in (("leaktrace BPF program", data / "bpf" / "leaktrace.bpf.c"),
                       ("gdb sampler script", data / "gdb_scripts" / "sampler.py")):
        assert checks[name]["ok"] and checks[name]["detail"] == str(file), checks[name]
    headers = checks["kernel headers for bcc"]
    assert headers["ok"], headers
    if headers["detail"].startswith("stub"):
        assert str(data / "bpf" / "kheaders") in headers["detail"], headers

    target = spawn([leaker_bin, "--leak-kib-per-s", "640", "--chunk-kib", "64"])
    report = hunt(venv, target.pid, tmp_path / "session")
    assert {"bpf", "gdb"} <= set(report["probes"]), report["probes"]
    assert report["ledger"]["available"] and report["ledger"]["events"] > 0, report["ledger"]
    runs = SessionReader(tmp_path / "session").table("gdb_runs")
    assert list(runs["pid"]) == [target.pid] and int(runs["samples"].iloc[0]) >= 1, runs.to_dict("records")
