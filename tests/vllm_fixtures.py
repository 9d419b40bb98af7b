"""Shared pieces of the real-vLLM tests: skip reasons, a background load, and hunting with the CLI."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO, is_root, run_cli

sys.path.insert(0, str(REPO / "tests" / "targets"))

import vllm_servers  # noqa: E402


def require_vllm() -> None:
    why = vllm_servers.available()
    if why:
        pytest.skip(f"vLLM target missing: {why}")


class Load(threading.Thread):
    """Sequential completions in the background, at most one per ``pause`` seconds, until stopped (or n
    done); ≥60 s client timeouts. Paced, so the load spans the whole hunt even on a fast machine."""

    def __init__(self, url: str, n: int = 1000, max_tokens: int = 8, pause: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.url, self.n, self.max_tokens, self.pause = url, n, max_tokens, pause
        self.ok = self.failed = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        for i in range(self.n):
            if self.stop_event.is_set():
                return
            try:
                vllm_servers.complete(self.url, f"Load {i}: the quick brown fox number {i * 13} jumps", self.max_tokens,
                                      timeout=90)
                self.ok += 1
            except OSError:
                self.failed += 1
            self.stop_event.wait(self.pause)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=100)


def hunt_vllm(out: Path, duration: int, extra: tuple[str, ...] = ()) -> tuple[dict, str]:
    args = ["hunt", "--vllm", "--duration", str(duration), "--interval", "1", "--no-gdb", "--out", str(out),
            "--format", "json", *extra]
    if not is_root():
        args.append("--no-bpf")
    r = run_cli(*args, timeout=duration + 240)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((out / "report.json").read_text()), r.stderr
