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


def true_mb_per_min(a: Truth, b: Truth) -> float:
    return (b.held - a.held) / max(b.t - a.t, 1e-9) * 60.0 / MB


def shape_argv(shapes_bin: Path, shape: str, kib_per_s: float, truth: Path, *extra: str) -> list[str]:
    return [str(shapes_bin), shape, str(kib_per_s), "--truth", str(truth), *extra]
