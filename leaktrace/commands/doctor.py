"""`leaktrace doctor`: can this machine trace? Exit 0 when every required check passes, else 5."""

from __future__ import annotations

import json
import sys

import click


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor(as_json: bool) -> None:
    """Check privileges, the bpf() syscall, tracepoints, BTF, kernel headers (or the bundled stub),
    gdb and ptrace — each with a fix."""
    from leaktrace.doctor import checks_as_dicts, run_checks

    checks = run_checks()
    ok = all(c.ok for c in checks if c.required)
    if as_json:
        click.echo(json.dumps({"ok": ok, "checks": checks_as_dicts(checks)}, indent=2))
    else:
        for c in checks:
            mark = click.style("ok ", fg="green") if c.ok else click.style("FAIL" if c.required else "warn", fg="red")
            click.echo(f"{mark:>4}  {c.name:<28} {c.detail}")
            if not c.ok and c.fix:
                click.echo(f"      fix: {c.fix}")
        click.echo("ready to trace" if ok else "not ready: see the fixes above")
    sys.exit(0 if ok else 5)
