"""Command line: thin. Parses, calls one function, maps LeaktraceError → one line + exit code."""

from __future__ import annotations

import importlib
import sys

import click

from leaktrace import __version__
from leaktrace.errors import LeaktraceError

# name -> "module:attribute"; one module per subcommand, imported only when used (fast --help).
COMMANDS = {
    "doctor": "leaktrace.commands.doctor:doctor",
    "ps": "leaktrace.commands.ps:ps",
    "hunt": "leaktrace.commands.hunt:hunt",
    "report": "leaktrace.commands.report:report",
    "compare": "leaktrace.commands.compare:compare",
    "demo": "leaktrace.commands.demo:demo",
    "cluster": "leaktrace.commands.cluster:cluster",
    "watch": "leaktrace.commands.watch:watch",
}
HELP = {
    "doctor": "Can this machine trace? (root/BPF, tracepoints, BTF, headers, gdb, ptrace)",
    "ps": "List vLLM (and other) candidate processes with labels, roles and libraries.",
    "hunt": "Hunt a leak in live process trees and write a session + report.",
    "report": "Re-render the reports of a session directory.",
    "compare": "Before/after a remedy: fixed, not fixed or regressed (compare.json/.md/.html).",
    "demo": "Start the bundled leaking workload, hunt it, write the report.",
    "cluster": "Hunt on every node of a Ray cluster and merge the reports.",
    "watch": "Always-on: follow processes, hunt a confirmed leak, keep the evidence of those that die.",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        spec = COMMANDS.get(name)
        if spec is None:
            return None
        mod, attr = spec.split(":")
        try:
            return getattr(importlib.import_module(mod), attr)
        except ImportError as e:
            if e.name and e.name.startswith("leaktrace"):
                why = str(e)

                @click.command(name, help=HELP.get(name))
                def unavailable() -> None:
                    raise LeaktraceError(f"`leaktrace {name}` is not available in this build ({why})")
                return unavailable
            raise

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(n, HELP[n]) for n in COMMANDS])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks and debug output.")
@click.version_option(__version__, prog_name="leaktrace")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """leaktrace — find which native memory grows in live processes (vLLM P/D serving),
    who maps it and why.

    \b
    Typical use (as root):
      leaktrace doctor                     # can this machine trace?
      leaktrace ps                         # find the vLLM processes
      leaktrace hunt --vllm --duration 120 --out hunt1
      leaktrace hunt --pid 1234 --duration 60 --out hunt2
      leaktrace report hunt1 --format json,md,html
      leaktrace compare before after       # did the remedy work?
    """
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose


def main(argv: list[str] | None = None) -> None:
    verbose = "-v" in (argv or sys.argv[1:]) or "--verbose" in (argv or sys.argv[1:])
    try:
        cli.main(args=argv, prog_name="leaktrace", standalone_mode=False)
    except LeaktraceError as e:
        if verbose:
            import traceback

            traceback.print_exc()
        click.echo(f"leaktrace: error: {e}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("leaktrace: aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(2 if isinstance(e, click.UsageError) else e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("leaktrace: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)


if __name__ == "__main__":
    main()
