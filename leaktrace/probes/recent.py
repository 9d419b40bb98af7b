"""Recent growth rates of a running hunt, from the figures probes publish in ``HuntContext.live``: the
terminal view (leaktrace/live.py) and the Prometheus exporter (probes/exporter.py) show the same ones."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import numpy as np

from leaktrace.probes import LiveFigures
from leaktrace.slope import theil_sen

# Rates are robust slopes (Theil–Sen) over the last WINDOW_S seconds of samples: recent enough to
# follow a leak that starts mid-hunt, long enough that one smaps_rollup spike does not make a rate.
WINDOW_S = 60.0
MAX_SAMPLES = 240  # per process; bounds memory and the O(n²) slope on hours-long hunts


def as_int(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0


class RecentRates:
    """Bounded recent history per process and per library, with robust growth rates (bytes/s)."""

    def __init__(self, window_s: float = WINDOW_S, max_samples: int = MAX_SAMPLES) -> None:
        self.window_s = window_s
        self.max_samples = max_samples
        self._proc: dict[int, deque[tuple[float, int, int]]] = {}
        self._libs: deque[tuple[float, dict[str, int]]] = deque(maxlen=max_samples)
        self.latest: dict[int, dict[str, int]] = {}
        self.bpf: dict[str, Any] = {}
        self.gdb: dict[str, Any] = {}
        self.lock = threading.Lock()

    def update(self, live: LiveFigures, now: float) -> None:
        rollup = live.rollup
        with self.lock:
            latest = {}
            for pid, r in rollup.items():
                rss, anon = as_int(r.get("rss")), as_int(r.get("anon"))
                latest[int(pid)] = {"rss": rss, "anon": anon}
                hist = self._proc.setdefault(int(pid), deque(maxlen=self.max_samples))
                if not hist or hist[-1][0] < now:
                    hist.append((now, rss, anon))
            # Processes no longer published have exited: forget them (bounded on churning trees).
            for pid in [p for p in self._proc if p not in latest]:
                del self._proc[pid]
            self.latest = latest
            self.bpf = dict(live.bpf)
            libs = self.bpf.get("outstanding_by_library")
            if isinstance(libs, dict):
                self._libs.append((now, {str(k): as_int(v) for k, v in libs.items()}))
            self.gdb = dict(live.gdb)

    def _window(self, hist: deque) -> list:
        if not hist:
            return []
        cut = hist[-1][0] - self.window_s
        return [s for s in hist if s[0] >= cut]

    def process_rates(self) -> dict[int, dict[str, float]]:
        """{pid: {"rss", "anon", "rss_per_s", "anon_per_s", "span_s"}} over the recent window."""
        out: dict[int, dict[str, float]] = {}
        with self.lock:
            for pid, hist in self._proc.items():
                w = self._window(hist)
                t = np.array([s[0] for s in w], dtype=float)
                rss_s = theil_sen(t, np.array([s[1] for s in w], dtype=float))[0] if len(w) >= 3 else 0.0
                anon_s = theil_sen(t, np.array([s[2] for s in w], dtype=float))[0] if len(w) >= 3 else 0.0
                last = w[-1] if w else (0.0, 0, 0)
                out[pid] = {
                    "rss": last[1],
                    "anon": last[2],
                    "rss_per_s": rss_s,
                    "anon_per_s": anon_s,
                    "span_s": float(t[-1] - t[0]) if len(t) else 0.0,
                }
        return out

    def library_growth(self) -> list[tuple[str, int, float]]:
        """[(library, outstanding bytes, growth bytes/s over the window)], fastest-growing first."""
        with self.lock:
            w = self._window(self._libs)
        if not w:
            return []
        (t0, first), (t1, last) = w[0], w[-1]
        dt = t1 - t0
        rows = [(lib, b, (b - first.get(lib, 0)) / dt if dt > 0 else 0.0) for lib, b in last.items()]
        rows.sort(key=lambda r: (-r[2], -r[1]))
        return rows
