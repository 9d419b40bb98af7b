"""`leaktrace ps`: vLLM processes (and other UCX/NIXL users) with labels, instances, roles and libraries."""

from __future__ import annotations

import json

import click

from leaktrace import procfs
from leaktrace.vllm.discover import discover, instances


@click.command("ps")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (a list of processes).")
@click.option("--all", "all_processes", is_flag=True, help="Every process, not only vLLM and UCX/NIXL users.")
@click.option("--pid", "pids", type=int, multiple=True, help="Only this process tree (repeatable).")
@click.option("--no-metrics", is_flag=True, help="Do not ask API servers' /metrics for a P/D role.")
def ps(as_json: bool, all_processes: bool, pids: tuple[int, ...], no_metrics: bool) -> None:
    """List vLLM servers (API server, EngineCore, workers, DP coordinator), P/D proxies and other
    processes that map UCX/NIXL/NCCL, with each one's label, instance, P/D role, port, libraries of
    interest and settings (each value with where it was read)."""
    for pid in pids:
        procfs.require_pid(pid)  # no such process: one line, exit 3 (not an empty listing)
    procs = discover(list(pids) or None, with_metrics=not no_metrics, all_processes=all_processes)
    if as_json:
        click.echo(json.dumps(procs, indent=2, default=str))
        return
    if not procs:
        click.echo("no vLLM server, P/D proxy or UCX/NIXL process found on this host (`leaktrace ps --all` lists every process)")
        return
    insts = {i["instance"]: i for i in instances(procs)}
    for inst_pid, inst in insts.items():
        kv = inst.get("kv_transfer_config")
        kv_s = f" kv={kv.get('kv_connector')}" if isinstance(kv, dict) else ""
        click.echo(f"vLLM instance {inst_pid}  role={inst['role']} ({inst.get('role_source')})  "
                   f"port={inst.get('port')}  model={inst.get('model')}{kv_s}")
        for p in procs:
            if p.get("instance") == inst_pid:
                click.echo("  " + _line(p))
    rest = [p for p in procs if p.get("instance") is None]
    if rest:
        click.echo("other processes")
        for p in rest:
            click.echo("  " + _line(p))


def _line(p: dict) -> str:
    what = p.get("title") or p["cmdline"][:60]
    libs = ",".join(p.get("lib_groups") or []) or "-"
    extra = ""
    u = p["config"].get("ucx")
    if isinstance(u, dict) and "hooks_active" in u:
        extra = (f"  ucx hooks={'on' if u['hooks_active'] else 'off'} mode={u['hook_mode']} "
                 f"max_unreleased={u['rcache_max_unreleased']} rcache={u['rcache_enable']}")
    if p.get("proxy_ports"):
        extra += f"  prefill={p['proxy_ports'].get('prefill')} decode={p['proxy_ports'].get('decode')}"
    return f"{p['pid']:>7} {p['ppid']:>7}  {p['label']:<14} {what:<28} libs={libs}{extra}"
