"""`leaktrace report DIR`: re-render the reports of a session (complete or killed mid-hunt)."""

from __future__ import annotations

import click

from leaktrace.commands import parse_formats
from leaktrace.outdir import absolute


@click.command("report")
@click.argument("session_dir", type=click.Path(file_okay=False))
@click.option("--format", "formats", default="json,md,html", show_default=True,
              help="Comma-separated: json, md, html, folded.")
@click.option("--stdout", "to_stdout", is_flag=True, help="Also print report.json to stdout.")
def report(session_dir: str, formats: str, to_stdout: bool) -> None:
    """Re-render SESSION_DIR's reports from its tables (works on a hunt that was killed)."""
    import json

    from leaktrace.report import FORMATS, render_session

    fmts = parse_formats(formats, FORMATS)
    rep = render_session(absolute(session_dir), formats=fmts)
    if to_stdout:
        click.echo(json.dumps(rep, indent=2, default=str))
    else:
        click.echo(f"verdict: {rep['verdict']}; wrote {', '.join(fmts)} to {session_dir}")
