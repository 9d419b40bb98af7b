"""Helpers of tests/test_exit_how.py: a memory cgroup to be OOM-killed in (cgroup v2, or v1's memory
hierarchy where the machine mounts that), and a hunt run in the background so a test can act on its target
once the probes are live."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

from conftest import LEAKTRACE, REPO, wait_for

CGROUP_ROOT = Path("/sys/fs/cgroup")


class MemoryCgroup:
    """A fresh memory cgroup with a hard limit; ``wrap(argv)`` starts a command inside it. Removed on close
    (its processes must be gone by then)."""

    def __init__(self, limit_bytes: int) -> None:
        name = f"leaktrace-test-{uuid.uuid4().hex[:8]}"
        controllers = CGROUP_ROOT / "cgroup.controllers"
        if controllers.is_file() and "memory" in controllers.read_text().split():
            sub = CGROUP_ROOT / "cgroup.subtree_control"
            if "memory" not in sub.read_text().split():
                sub.write_text("+memory")
            self.path = CGROUP_ROOT / name
            self.path.mkdir()
            (self.path / "memory.max").write_text(str(limit_bytes))
            if (self.path / "memory.swap.max").exists():
                (self.path / "memory.swap.max").write_text("0")
        elif (CGROUP_ROOT / "memory" / "memory.limit_in_bytes").is_file():  # v1 (hybrid mounts)
            self.path = CGROUP_ROOT / "memory" / name
            self.path.mkdir()
            (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
        else:
            raise RuntimeError("no memory cgroup controller (neither cgroup v2 with memory nor v1 memory)")

    def wrap(self, argv: list[str]) -> list[str]:
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh", *map(str, argv)]

    def oom_kills(self) -> int:
        for name in ("memory.events", "memory.oom_control"):
            f = self.path / name
            if f.is_file():
                for line in f.read_text().splitlines():
                    k, _, v = line.partition(" ")
                    if k == "oom_kill":
                        return int(v)
        return 0

    def close(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)


class BackgroundHunt:
    """``leaktrace hunt`` in the background; ``wait_attached()`` returns once every probe is live."""

    def __init__(self, pid: int, out: Path, *args: str) -> None:
        self.out = out
        self.popen = subprocess.Popen([*LEAKTRACE, "hunt", "--pid", str(pid), "--gdb-samples", "0", "--format",
                                       "json,md,html", "--out", str(out), *map(str, args)],
                                      cwd=str(REPO), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def meta(self) -> dict:
        try:
            return json.loads((self.out / "meta.json").read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def wait_attached(self, timeout: float = 90) -> float:
        assert wait_for(lambda: self.meta().get("attach_s") is not None or self.popen.poll() is not None,
                        timeout=timeout), "the hunt did not attach"
        return float(self.meta()["attach_s"])

    def wait_line(self, needle: str, timeout: float = 90) -> str:
        """Read the hunt's output until a line containing ``needle`` (returns it)."""
        deadline = time.monotonic() + timeout
        assert self.popen.stdout is not None
        while time.monotonic() < deadline:
            line = self.popen.stdout.readline()
            if not line:
                break
            if needle in line:
                return line
        raise AssertionError(f"the hunt never printed {needle!r}")

    def finish(self, timeout: float = 180) -> dict:
        out, _ = self.popen.communicate(timeout=timeout)
        assert self.popen.returncode == 0, out
        return json.loads((self.out / "report.json").read_text())

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
