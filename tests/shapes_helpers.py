"""Ground truth of the leak-shape fixture (tests/fixtures/shapes.c): the bytes it holds, from its own
bookkeeping, checked against /proc; and the rate it leaked at over a hunt's window."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

MB = 1024 * 1024


@dataclass(frozen=True)
class Truth:
    t: float  # CLOCK_MONOTONIC seconds (time.monotonic() in this process)
    held: int  # bytes the fixture added and still holds
    ticks: int

    @classmethod
    def read(cls, path: Path) -> Truth:
        for _ in range(50):  # the fixture renames a new file in every 100 ms
            try:
                t, held, ticks = path.read_text().split()
                return cls(float(t), int(held), int(ticks))
            except (FileNotFoundError, ValueError):
                time.sleep(0.02)
        raise RuntimeError(f"no truth in {path}")


def shape_argv(shapes_bin: Path, shape: str, kib_per_s: float, truth: Path, *extra: str) -> list[str]:
    return [str(shapes_bin), shape, str(kib_per_s), "--truth", str(truth), *extra]


class TruthLog:
    """The fixture's truth (a line "t_monotonic value ...": ``field`` picks the value's word) sampled every
    50 ms in a thread, so what it held at any moment of the hunt (attach, last snapshot) is known; use as a
    context manager around the hunt."""

    def __init__(self, path: Path, field: int = 1) -> None:
        import threading

        self.path, self.field, self.samples = path, field, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                words = self.path.read_text().split()
                t, held = words[0], words[self.field]
                if not self.samples or float(t) > self.samples[-1][0]:
                    self.samples.append((float(t), int(held)))
            except (FileNotFoundError, ValueError, IndexError):
                pass
            self._stop.wait(0.05)

    def __enter__(self) -> TruthLog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def held_at(self, t_monotonic: float) -> float:
        import numpy as np

        ts, held = zip(*self.samples, strict=True)
        if not ts[0] - 0.2 <= t_monotonic <= ts[-1] + 0.2:
            raise ValueError(f"{t_monotonic:.1f} is outside the truth log [{ts[0]:.1f}, {ts[-1]:.1f}]")
        return float(np.interp(t_monotonic, ts, held))

    def mb_per_min(self, t0: float, t1: float) -> float:
        return (self.held_at(t1) - self.held_at(t0)) / (t1 - t0) * 60.0 / MB


def hunt_shape(spawn, shapes_bin: Path, tmp_path: Path, kib_per_s: float, shape: str, duration: int = 40,
               *extra: str) -> tuple[dict, int, float, float]:
    """Hunt one shape of the fixture with default flags: (report.json, pid, bytes the fixture added between
    the probes going live and the ledger's last snapshot, its rate in MB/min over that span)."""
    import json

    from conftest import run_cli

    from leaktrace.session import SessionReader

    truth = tmp_path / "truth"
    target = spawn(shape_argv(shapes_bin, shape, kib_per_s, truth, *extra))
    with TruthLog(truth) as log:
        r = run_cli("hunt", "--pid", target.pid, "--duration", duration, "--format", "json", "--out", tmp_path / "s")
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "s" / "report.json").read_text())
    reader = SessionReader(tmp_path / "s")
    t0, attach = reader.meta["t0_monotonic"], reader.meta["attach_s"]
    t_last = float(reader.table("ledger_snapshots")["t"].max())
    expected = log.held_at(t0 + t_last) - log.held_at(t0 + attach)
    rate = log.mb_per_min(t0 + attach, t0 + t_last)
    return rep, target.pid, expected, rate
