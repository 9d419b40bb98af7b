"""A culprit's figures as a sentence: its growth (resident, and mapped where that differs) and what it
holds (mapped, and of that resident) — "2.40 MB/min resident, 76.80 MB/min mapped; 80.0 MB mapped, 61.0 MB
resident". report.md and report.html write the same words."""

from __future__ import annotations

from typing import Any

MB = 2**20


def rates(c: dict[str, Any]) -> tuple[str, str]:
    """(the resident growth, the mapped growth where it reads differently, else "")."""
    rate = f"{c['mb_per_min']:.2f} MB/min"
    mapped = c.get("mapped_mb_per_min")
    if mapped is None or f"{mapped:.2f}" == f"{c['mb_per_min']:.2f}":
        return rate, ""
    return f"{rate} resident", f"{mapped:.2f} MB/min mapped"


def held(c: dict[str, Any]) -> str:
    """ "80.0 MB mapped, 61.0 MB resident" ("" when it holds nothing outstanding)."""
    if not c.get("outstanding_bytes"):
        return ""
    out = f"{c['outstanding_bytes'] / MB:.1f} MB mapped"
    if c.get("outstanding_resident_bytes") is not None:
        out += f", {c['outstanding_resident_bytes'] / MB:.1f} MB resident"
    return out
