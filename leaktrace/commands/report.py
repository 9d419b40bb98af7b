"""`leaktrace report DIR`: re-render the reports of a session (complete or killed mid-hunt)."""

from __future__ import annotations

import click

from leaktrace.commands import format_option
from leaktrace.outdir import absolute
from leaktrace.report.formats import REPORT_FORMATS


@click.command("report")
@click.argument("session_dir", type=click.Path(file_okay=False))
@format_option(REPORT_FORMATS, "json,md,html")
@click.option("--stdout", "to_stdout", is_flag=True, help="Also print report.json to stdout.")
def report(session_dir: str, formats: tuple[str, ...], to_stdout: bool) -> None:
    """Re-render SESSION_DIR's reports from its tables (works on a hunt that was killed)."""
    import json

    from leaktrace.report import render_session

    rep = render_session(absolute(session_dir), formats=formats)
    if to_stdout:
        click.echo(json.dumps(rep, indent=2, default=str))
    else:
        click.echo(f"verdict: {rep['verdict']}; wrote {', '.join(REPORT_FORMATS.selected(formats))} to {session_dir}")
