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
