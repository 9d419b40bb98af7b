"""The workloads of each split. ``tuning`` and ``frozen`` differ in seeds and in parameter ranges (leak rates,
churn laws and live sets, cache sizes, saw periods, JIT time constants, traffic lulls), so a rule tuned on one
is measured on workloads it was not fitted to. Each spec: ``name``, ``kind`` (c | py), ``label`` (clean:
no memory kept; bounded: memory kept up to a bound; leak), ``args`` (key=value for the generator)."""

from __future__ import annotations

import math
import random
from typing import Any

LEAK_LIBRARY = "libcorpusleak.so"

# Per split: the ranges the parameters are drawn from. Frozen's are other ranges, not just other draws.
RANGES: dict[str, dict[str, Any]] = {
    "tuning": {"seed": 1000, "ops": (500, 4000), "live": (2000, 30000), "laws": (0, 1, 2),
               "cache_mb": (15, 60), "cache_fill_s": (40, 150), "saw_mb": (8, 40), "saw_period": (20, 70),
               "jit_mb": (10, 40), "jit_tau": (30, 120), "on_s": (15, 40), "off_s": (4, 12),
               "leak_rates": (0.3, 0.8, 1.5, 3, 6, 12, 25, 50, 90, 150, 2.2, 4.5, 9, 18, 35, 0.5, 1.1, 250)},
    "frozen": {"seed": 7000, "ops": (1500, 8000), "live": (10000, 60000), "laws": (1, 2, 3),
               "cache_mb": (30, 90), "cache_fill_s": (90, 260), "saw_mb": (20, 60), "saw_period": (45, 110),
               "jit_mb": (25, 70), "jit_tau": (60, 200), "on_s": (25, 70), "off_s": (8, 25),
               "leak_rates": (0.4, 1.0, 2.0, 4.0, 7.5, 15, 30, 60, 120, 300, 2.6, 5.5, 11, 22, 45, 0.7, 1.4, 80)},
}

NOISES = ("none", "churn", "cache", "saw", "jit", "server", "pyheap")
PATTERNS = ("steady", "bursty", "batch", "stall", "late")


def _u(rnd: random.Random, lo_hi: tuple[float, float]) -> float:
    lo, hi = lo_hi
    return round(rnd.uniform(lo, hi), 2)


def _logu(rnd: random.Random, lo_hi: tuple[float, float]) -> float:
    lo, hi = lo_hi
    return round(math.exp(rnd.uniform(math.log(lo), math.log(hi))), 1)


def _noise(rnd: random.Random, r: dict[str, Any], noise: str, duration: float) -> dict[str, Any]:
    if noise == "churn":
        a = {"noise": "churn", "ops": int(_logu(rnd, r["ops"])), "law": rnd.choice(r["laws"]),
             "live": int(_logu(rnd, r["live"]))}
        if rnd.random() < 0.5:
            a["mmap_ops"] = int(rnd.uniform(50, 600))
        if rnd.random() < 0.3:
            a["trim_every"] = int(rnd.uniform(20, 90))
        return a
    if noise == "server":
        return {"noise": "server", "ops": int(_logu(rnd, r["ops"])), "law": rnd.choice(r["laws"]),
                "live": int(_logu(rnd, r["live"])), "on_s": _u(rnd, r["on_s"]), "off_s": _u(rnd, r["off_s"]),
                "mmap_ops": int(rnd.uniform(0, 300))}
    if noise == "cache":
        return {"noise": "cache", "cache_mb": _u(rnd, r["cache_mb"]), "cache_fill_s": _u(rnd, r["cache_fill_s"]),
                "cache_start": round(rnd.uniform(0, duration * 0.4), 1)}
    if noise == "saw":
        return {"noise": "saw", "saw_mb": _u(rnd, r["saw_mb"]), "saw_period": _u(rnd, r["saw_period"])}
    if noise == "jit":
        return {"noise": "jit", "jit_mb": _u(rnd, r["jit_mb"]), "jit_tau": _u(rnd, r["jit_tau"])}
    if noise == "pyheap":
        return {"objects": int(rnd.uniform(5000, 30000)), "cache": int(rnd.uniform(20000, 120000)),
                "freeze_at": round(rnd.uniform(10, duration * 0.6), 1) if rnd.random() < 0.6 else -1}
    return {"noise": "none"}


def plan(split: str, duration: float) -> list[dict[str, Any]]:
    """The generators of one hunt of ``split`` (about three dozen processes)."""
    r = RANGES[split]
    rnd = random.Random(r["seed"])
    specs: list[dict[str, Any]] = []

    def add(label: str, noise: str, leak: dict[str, Any] | None = None) -> None:
        args = {"seed": rnd.randrange(1, 1 << 30), "duration": duration, **_noise(rnd, r, noise, duration)}
        if leak:
            args.update(leak)
        name = f"{split}-{len(specs):02d}-{noise}-{label}"
        specs.append({"name": name, "kind": "py" if noise == "pyheap" else "c", "label": label,
                      "noise": noise, "args": args})

    # Clean and bounded: every noise alone, churn in several laws (the churner among them).
    for noise in ("churn", "churn", "churn", "server", "server", "pyheap", "none"):
        add("clean", noise)
    specs[0]["args"].update({"ops": 8000 if split == "tuning" else 12000, "mmap_ops": 1500, "law": 2,
                             "live": 20000})
    for noise in ("cache", "cache", "saw", "saw", "jit", "jit", "pyheap"):
        add("bounded", noise)
    # Leaks: every rate of the split, under a noise and a pattern each.
    for i, mbm in enumerate(r["leak_rates"]):
        noise = NOISES[i % len(NOISES)]
        pattern = PATTERNS[(i * 3 + 1) % len(PATTERNS)] if noise != "pyheap" else "steady"
        leak: dict[str, Any] = {"leak_mb_min": mbm, "leak_kind": "mmap" if i % 3 == 2 else "malloc"}
        if pattern == "late":
            leak["leak_start"] = round(rnd.uniform(0.15, 0.6) * duration, 1)
        else:
            leak["leak_pattern"] = pattern
            if pattern == "batch":
                leak["batch_s"] = round(rnd.uniform(5, 25), 1)
            if pattern == "stall" and noise != "server":
                leak["on_s"], leak["off_s"] = _u(rnd, r["on_s"]), _u(rnd, r["off_s"])
                leak["leak_follows_traffic"] = 1
            elif noise == "server":
                leak["leak_follows_traffic"] = 1
        if noise == "pyheap":
            leak = {"leak_mb_min": mbm, "leak_start": leak.get("leak_start", 0)}
        add("leak", noise, leak)
    return specs
