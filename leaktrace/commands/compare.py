"""`leaktrace compare BEFORE AFTER`: did the remedy work? Two hunts side by side, with a verdict."""

from __future__ import annotations

from typing import Any

import click

from leaktrace.commands import format_option
from leaktrace.outdir import absolute
from leaktrace.report.formats import COMPARE_FORMATS


@click.command("compare")
@click.argument("before", type=click.Path(file_okay=False))
@click.argument("after", type=click.Path(file_okay=False))
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="Directory for compare.json/.md/.html (default: AFTER).")
@format_option(COMPARE_FORMATS, "json,md,html")
def compare(before: str, after: str, out: str | None, formats: tuple[str, ...]) -> None:
    """Compare two hunts of the same service — BEFORE and AFTER a remedy (or two versions) — and say
    whether it is fixed, not fixed or regressed, with a confidence.

    BEFORE and AFTER are hunt directories (their report.json, or the session when there is none).
    Culprits are matched by library across the two runs (pids differ; a wheel's hashed library names
    are normalised) and by the P/D role of their vLLM instance. Exit status 0 whatever the verdict.

    \b
    Example (the seed-002 remedy):
      leaktrace hunt --vllm --duration 300 --out before
      # restart decode with UCX_RCACHE_MAX_UNRELEASED=1024
      leaktrace hunt --vllm --duration 300 --out after
      leaktrace compare before after
    """
    from leaktrace.analysis.compare import compare_dirs

    cmp = compare_dirs(absolute(before), absolute(after))
    out_dir = absolute(out) if out else absolute(after)
    # compare.html shows both hunts' flame graphs: their views are built here, from each hunt's report and
    # session, and handed to the reporters (which never reopen a session).
    hunts = ({side: _hunt_views(cmp[side]["path"]) for side in ("before", "after")}
             if "html" in COMPARE_FORMATS.selected(formats) else None)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        COMPARE_FORMATS.write(cmp, out_dir, formats, hunts)
    except OSError as e:
        from leaktrace.errors import OutputNotWritable

        raise OutputNotWritable(f"cannot write {out_dir}: {e.strerror or e}") from e
    click.echo(f"verdict: {cmp['verdict']} (confidence {cmp['confidence']:.2f}) — {cmp['verdict_reason']}")
    for r in cmp["culprits"][:5]:
        click.echo(f"  {r['status']:<8} {r['role']}/{r['kind']} {r['label']}: "
                   f"{r['before_mb_per_min']:.2f} → {r['after_mb_per_min']:.2f} MB/min")
    click.echo(f"compare: {out_dir / 'compare.json'}")


def _hunt_views(path: str) -> list[dict[str, Any]]:
    """The flame graph views of one compared hunt: its report.json (else the report built from its session)
    and the figures of its session when it has one; a hunt that cannot be read gets none (the comparison
    stands without them)."""
    from leaktrace.analysis.compare import load_report
    from leaktrace.analysis.figures import build_figures
    from leaktrace.report import flamegraph
    from leaktrace.session import SessionReader

    try:
        report, d = load_report(path)
    except Exception:  # the flame graphs are a view
        return []
    try:
        figures = build_figures(SessionReader(d))
    except Exception:  # no (readable) session: the culprits' stacks only
        figures = None
    return flamegraph.views(report, figures)
