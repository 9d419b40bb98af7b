"""One module per subcommand, and the options they share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from leaktrace.report.formats import Formats


class FormatList(click.ParamType):
    """``--format json,md``: a tuple of format names of one registry, checked while the command line is
    parsed, so an unknown name is a usage error (one line, exit 2) before any work starts."""

    name = "FORMATS"

    def __init__(self, formats: Formats) -> None:
        self.formats = formats

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, ...]:
        return self.formats.parse(value)


def format_option(formats: Formats, default: str | None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The ``--format`` option of a command writing ``formats`` (the command receives ``formats``: a tuple
    of names, or None without a default)."""
    always = f" {', '.join(formats.always)} is always written." if formats.always else ""
    return click.option("--format", "formats", type=FormatList(formats), default=default,
                        show_default=default is not None,
                        help=f"Comma-separated, from: {', '.join(formats.names)}.{always}")
