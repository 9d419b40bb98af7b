"""`leaktrace ps`: candidate processes (a first, generic version; vLLM-aware discovery replaces it)."""

from __future__ import annotations

import json

import click
import psutil


@click.command("ps")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def ps(as_json: bool) -> None:
    """List processes by resident memory, largest first."""
    rows = []
    for p in psutil.process_iter(["pid", "ppid", "name", "memory_info"]):
        mi = p.info.get("memory_info")
        if mi is None:
            continue
        rows.append({"pid": p.info["pid"], "ppid": p.info["ppid"], "label": "other", "instance": None,
                     "role": "unknown", "port": None, "libs": [], "config": {}, "name": p.info["name"],
                     "rss_mb": round(mi.rss / 2**20, 1)})
    rows.sort(key=lambda r: -r["rss_mb"])
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        for r in rows[:40]:
            click.echo(f"{r['pid']:>8} {r['ppid']:>8} {r['rss_mb']:>9.1f} MB  {r['name']}")
