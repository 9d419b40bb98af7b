"""One module per subcommand."""


def parse_formats(text: str, allowed: tuple[str, ...]) -> list[str]:
    """``--format json,md`` as a list; an unknown name is a usage error (exit 2)."""
    from leaktrace.errors import UsageError

    fmts = [f.strip() for f in text.split(",") if f.strip()]
    bad = [f for f in fmts if f not in allowed]
    if bad:
        raise UsageError(f"unknown format(s): {', '.join(bad)} (choose from {', '.join(allowed)})")
    return fmts
