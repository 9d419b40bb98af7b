"""Shared test helpers: fixture builds, starting real processes, and skip reasons that say what is missing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from fixtures.build import build  # noqa: E402


def _venv_bin(name: str) -> str:
    p = Path(sys.executable).parent / name
    return str(p)


LEAKTRACE = [sys.executable, "-m", "leaktrace"]


@pytest.fixture(scope="session")
def leaker_bin() -> Path:
    return build("leaker", ["leaker.c"])


@pytest.fixture(scope="session")
def shapes_bin() -> Path:
    """The leak-shape fixture (tests/fixtures/shapes.c) and its stripped, frame-pointer-less vendor library
    libshape.so (shapes_lib.c), which makes every shape."""
    lib = build("libshape.so", ["shapes_lib.c"], cflags=["-fomit-frame-pointer"], ldflags=["-lpthread"],
                shared=True, strip=True)
    return build("shapes", ["shapes.c"], ldflags=[f"-L{lib.parent}", "-lshape", f"-Wl,-rpath,{lib.parent}",
                                                  "-lpthread"])


class Proc:
    """A started fixture process in its own process group, killed at teardown."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, ready: str | None = "ready") -> None:
        self.popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True, env={**os.environ, **(env or {})})
        self.pid = self.popen.pid
        if ready:
            line = self.popen.stdout.readline()  # type: ignore[union-attr]
            if not line.startswith(ready):
                err = self.popen.stderr.read() if self.popen.poll() is not None else ""  # type: ignore[union-attr]
                self.kill()
                raise RuntimeError(f"fixture did not start: {line!r} {err}")

    def kill(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


@pytest.fixture
def spawn() -> Iterator:
    procs: list[Proc] = []

    def _spawn(argv: list[str], env: dict[str, str] | None = None, ready: str | None = "ready") -> Proc:
        p = Proc([str(a) for a in argv], env, ready)
        procs.append(p)
        return p

    yield _spawn
    for p in procs:
        p.kill()


def run_cli(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*LEAKTRACE, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=str(REPO))


def is_root() -> bool:
    return os.geteuid() == 0


def wait_for(pred, timeout: float = 30, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return False


# Every report.json and compare.json the tool writes during the suite is validated against its JSON Schema
# (leaktrace/schemas/): a report that drifts from the contract fails the test that made it.
os.environ.setdefault("LEAKTRACE_SCHEMA_CHECK", "1")


# ----------------------------------------------------------------------------- alone or two at a time
#
# .ci/test.sh runs the suite in two phases: the modules below alone (marked ``alone``), then every other one
# two at a time (pytest-xdist, -n 2). Alone: real vLLM pairs, Ray clusters, real UCX/NIXL pairs, whatever
# discovers vLLM-like processes machine-wide (a neighbour's look-alike would be found), the gdb pause budgets,
# and the checks of pace, shape or rate that a neighbour's CPU use would skew. Two at a time: hunts of the
# fixture processes, whose checks count bytes, regions and call paths.
ALONE_MODULES = {
    "test_vllm_pd.py", "test_cluster_pd.py", "test_cluster.py",
    "test_cluster_faults.py", "test_cluster_merge.py", "test_nixl_pair.py", "test_ucx_leak.py", "test_compare.py",
    "test_discover.py", "test_discover_pyheap.py", "test_secrets.py", "test_cli_edges.py", "test_gdb_sampler.py",
    "test_bpf_stream.py", "test_pyheap_stall.py", "test_verdict_plateau.py", "test_demo.py",
    "test_python_vs_native.py", "test_live_exporter.py", "test_notebook.py", "test_packaging.py",
    "test_flamegraph.py", "test_watch.py", "test_verdicts.py",
    # its tmpfs writer makes the host lose memory no process holds: a neighbour's hunt would see it too
    "test_host_memory.py",
    # memfds held by descriptor are memory a neighbour's hunt sees the host lose, held by no process of its own
    "test_held_files.py",
    # rates read against the fixtures' own books, and gdb's pause budget with the Python frames
    "test_malloc_state.py", "test_python_frames_hunt.py",
    # replays the corpus on two worker processes: a neighbour's hunt would wait for the CPU
    "test_verdict_corpus.py",
    # its clean control must read no host memory lost outside processes: a neighbour's tmpfs or memfds would be
    "test_analysis.py",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in ALONE_MODULES:
            item.add_marker(pytest.mark.alone)


# ----------------------------------------------------------------------------- strict mode: no silent skips
#
# In CI (`bash .ci/run` as root with CI=true, every target installed by .ci/setup.sh) a skipped test means a
# root / BPF / gdb / UCX / vLLM check that did not run, which would otherwise read as a pass. With CI=true or
# LEAKTRACE_STRICT=1 a test that ends skipped (skip() in a fixture or the test, skipif marks, importorskip)
# is reported as FAILED with the skip reason. LEAKTRACE_STRICT=0 turns it off explicitly.

# Skips that stay legitimate even in CI: (test id substring, reason substring). Keep empty unless a skip
# depends on something CI cannot control; prefer making the test not skip.
STRICT_SKIP_ALLOWED: list[tuple[str, str]] = []


def strict_skips() -> bool:
    flag = os.environ.get("LEAKTRACE_STRICT", "").strip().lower()
    if flag in ("0", "false", "no"):
        return False
    if flag in ("1", "true", "yes"):
        return True
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _skip_reason(report: pytest.TestReport) -> str:
    lr = report.longrepr
    if isinstance(lr, tuple) and len(lr) == 3:  # (path, lineno, "Skipped: reason")
        return str(lr[2])
    return str(lr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.skipped or not strict_skips() or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if any(tid in item.nodeid and why in reason for tid, why in STRICT_SKIP_ALLOWED):
        return
    # Reported as a failed test (FAILED, not an ERROR of the setup phase) whichever phase skipped; the
    # message names the phase. The call phase does not run after a failed setup, teardown still does.
    report.longrepr = (f"skipped in strict mode (CI=true or LEAKTRACE_STRICT=1), which counts as a failure "
                       f"[{report.when} phase]: {reason}")
    report.outcome = "failed"
    report.when = "call"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """A module skipped while it is collected (module-level importorskip or skip): a failure too."""
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    if not report.skipped or not strict_skips():
        return
    reason = _skip_reason(report)
    if any(tid in report.nodeid and why in reason for tid, why in STRICT_SKIP_ALLOWED):
        return
    report.outcome = "failed"
    report.longrepr = f"skipped at collection in strict mode (CI=true or LEAKTRACE_STRICT=1): {reason}"
