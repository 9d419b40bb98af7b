"""`leaktrace cluster hunt|report`: the same hunt on every node of a Ray cluster, one merged report."""

from __future__ import annotations

import signal
from typing import Any

import click

from leaktrace.commands import format_option
from leaktrace.commands.hunt import make_logger
from leaktrace.commands.options import match_option, probe_options, quiet_option
from leaktrace.huntspec import HuntSpec
from leaktrace.outdir import output_dir
from leaktrace.report.formats import REPORT_FORMATS

_HUNT = HuntSpec()


@click.group("cluster")
def cluster() -> None:
    """Hunt on every node of a Ray cluster (prefill and decode nodes side by side) and merge the reports.

    \b
    Needs Ray on the driver and on every node (pip install 'leaktrace[cluster]'), and leaktrace
    installed in the Python that Ray runs tasks with on each node (as root for eBPF and gdb).
    """


@cluster.command("hunt")
@click.option("--address", required=True,
              help="Ray cluster: HOST:PORT of the head's GCS, ray://HOST:10001 (Ray Client) or auto.")
@click.option("--vllm", is_flag=True, help="On each node, hunt every vLLM server found there.")
@match_option("On each node, hunt")
@click.option("--pid", "pids", multiple=True, metavar="[NODE=]PID",
              help="Hunt PID; NODE (IP, hostname, node-id prefix or custom resource) says on which node. "
                   "Repeatable.")
@click.option("--nodes", "node_selectors", default="", metavar="NODE,...",
              help="Only these nodes (IP, hostname, node-id prefix or custom resource); default: every alive node "
                   "(or the nodes named by --pid NODE=PID).")
@click.option("--duration", type=float, default=_HUNT.duration, show_default=True,
              help="Seconds to hunt on each node.")
@probe_options(", as each node sees it")
@format_option(REPORT_FORMATS, None)
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="Cluster session directory to write (default: a new ./leaktrace-cluster-DATE-TIME); one "
                   "that already holds a session is refused (exit 13).")
@click.option("--shared-dir", default=None, type=click.Path(file_okay=False),
              help="Absolute path every node can write (NFS, hostPath…): node sessions go there instead "
                   "of travelling back through Ray's object store.")
@click.option("--node-timeout", type=float, default=None,
              help="Seconds to wait for each node's answer (default: --duration + 120).")
@click.option("--node-ip-address", default=None,
              help="This machine's IP as a Ray node, when Ray cannot tell it (several IPs, containers).")
@quiet_option()
def hunt(address: str, vllm: bool, match: str | None, pids: tuple[str, ...], node_selectors: str,
         duration: float, out: str | None, shared_dir: str | None, node_timeout: float | None,
         node_ip_address: str | None, quiet: bool, **probes: Any) -> None:
    """Run `leaktrace hunt` on every selected node of the Ray cluster at --address, with the same
    options everywhere, and merge the node sessions into OUT (report.json, report.md, nodes/).
    --format is the formats of each node's session (nodes/<node>/: report.json always; by default what
    `leaktrace hunt` writes); the merged report is report.json and report.md.

    A node that fails (no target, target gone, node lost, no answer in time) is reported with its reason;
    the others' results are kept. Exit status 0 when the cluster hunt ran, whatever the verdicts.

    \b
    Examples:
      leaktrace cluster hunt --address auto --vllm --duration 300 --out pd-hunt
      leaktrace cluster hunt --address 10.0.0.1:6379 --match 'VLLM::Worker' --no-gdb --out w
      leaktrace cluster hunt --address 10.0.0.1:6379 --pid 10.0.0.2=4242 --pid 10.0.0.3=5151
    """
    from leaktrace.cluster.driver import cluster_hunt, import_ray
    from leaktrace.cluster.request import ClusterRequest, PidSpec
    from leaktrace.errors import UsageError

    # Each node's hunt: these options, its duration, and on the node its targets and session directory.
    spec = HuntSpec(duration=duration, **probes)
    if spec.interval <= 0:
        raise UsageError("--interval must be positive")
    request = ClusterRequest(
        address=address, vllm=vllm, match=match, pids=[PidSpec.parse(p) for p in pids],
        nodes=[s for s in node_selectors.split(",") if s.strip()], hunt=spec,
        shared_dir=shared_dir, node_timeout=node_timeout, node_ip_address=node_ip_address)
    request.validate()
    import_ray()  # before anything else happens: without Ray, one line saying how to get it
    # Ctrl-C stops the node hunts and still writes the report, as for `hunt`, also when SIGINT came ignored
    # (a background job of a non-interactive shell inherits SIG_IGN, and Python then raises no
    # KeyboardInterrupt: the driver would wait out the whole hunt).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with output_dir(out, prefix="leaktrace-cluster") as out_dir:
        report = cluster_hunt(request, out_dir, log=make_logger(quiet))
    _print_summary(report, str(out_dir))


def _print_summary(report: dict, out: str) -> None:
    from pathlib import Path

    for n in report["nodes"]:
        top = n["culprits"][0] if n["culprits"] else None
        detail = n["reason"] if n["status"] == "failed" or n.get("no_targets") else (
            f"{n['verdict']}" + (f" — {top['kind']} {top.get('library') or ''} pid {top['pid']} "
                                 f"{top['mb_per_min']:.2f} MB/min" if top else ""))
        notes = "".join(f" [{note}]" for note in n.get("notes", []))
        click.echo(f"{n['hostname']} ({n.get('ip')}): {n['status']}: {detail}{notes}")
    click.echo(f"verdict: {report['verdict']}")
    click.echo(f"report: {Path(out) / 'report.json'}")


@cluster.command("report")
@click.argument("cluster_dir", type=click.Path(file_okay=False))
@click.option("--stdout", "to_stdout", is_flag=True, help="Also print report.json to stdout.")
def report(cluster_dir: str, to_stdout: bool) -> None:
    """Re-render CLUSTER_DIR's merged report (report.json, report.md) from its node sessions. Needs no Ray."""
    import json

    from leaktrace.cluster.merge import render_cluster

    rep = render_cluster(cluster_dir, rerender=True)
    if to_stdout:
        click.echo(json.dumps(rep, indent=2, default=str))
    else:
        _print_summary(rep, cluster_dir)
