"""The vllm probe (``hunt --vllm``): records discovery into the session.

At start: the ``vllm_processes`` table (one row per discovered process: label, title, instance, role,
port, libraries, settings with their sources) and ``instances`` in meta.json; it also publishes the
instances in ``ctx.live.vllm_instances`` so the metrics probe knows which /metrics to scrape, and labels the
target set. Every ``rediscover_every`` ticks, and at stop, it looks again when a process was born since or an
instance's role is still unknown, so processes born later (a restarted worker) are labelled too; a role learnt
later (decode receives its first KV) updates the meta.
"""

from __future__ import annotations

import json
from typing import Any

from leaktrace.errors import LeaktraceError
from leaktrace.probes import HuntContext, HuntOptions, RereadingProbe
from leaktrace.vllm.discover import discover, instances


class VllmProbe(RereadingProbe):
    name = "vllm"

    def __init__(self, options: HuntOptions, rediscover_every: int = 15) -> None:
        super().__init__(options)
        self.rediscover_every = rediscover_every
        self.seen: set[int] = set()
        self.instances: list[dict[str, Any]] = []

    def start(self, ctx: HuntContext) -> None:
        super().start(ctx)
        if not self.instances:
            ctx.warn("vllm: no vLLM server found among the targets; the hunt goes on with what it can see")

    def _read(self, edge: str) -> None:
        if edge == "tick" and self._ticks % self.rediscover_every:
            return
        if edge != "start" and not self._may_have_changed():
            return
        self._record(first=edge == "start")

    def _may_have_changed(self) -> bool:
        """A look reads every process's maps and environment (a vLLM process maps thousands of regions:
        ~0.2 CPU s a look on a P/D node, the costliest read of the hunt's ticks); what it can add is a process
        born since (a restarted worker, to label) or the role of an instance not known yet (learnt from
        /metrics once KV moves)."""
        assert self.ctx is not None
        return (bool(set(self.ctx.targets.live()) - self.seen)
                or any(i.get("role") == "unknown" for i in self.instances))

    def _record(self, first: bool = False) -> None:
        assert self.ctx is not None
        ctx = self.ctx
        try:
            procs = discover(ctx.targets.roots or None, with_metrics=True)
        except LeaktraceError as e:
            ctx.warn(f"vllm: discovery failed: {e}")
            return
        t = ctx.session.now()
        rows = []
        for p in procs:
            if p["pid"] in self.seen:
                continue
            self.seen.add(p["pid"])
            rows.append({"t": t, "pid": p["pid"], "ppid": p["ppid"], "label": p["label"],
                         "title": p.get("title"), "instance": p.get("instance"), "role": p["role"],
                         "role_source": p.get("role_source"), "port": p.get("port"), "model": p.get("model"),
                         "libs": ",".join(p["libs"]), "lib_groups": ",".join(p["lib_groups"]),
                         "config": json.dumps(p["config"], default=str)})
            with ctx.targets.lock:
                ctx.targets.labels[p["pid"]] = p.get("title") or p["label"]
        ctx.session.append("vllm_processes", rows)
        insts = instances(procs)
        if first or _roles(insts) != _roles(self.instances) or len(insts) != len(self.instances):
            self.instances = insts
            ctx.session.update_meta(instances=insts)
            ctx.live.vllm_instances = insts
            for i in insts:
                ctx.log(f"vllm: instance {i['instance']} role={i['role']} port={i.get('port')} "
                        f"processes={len(i['pids'])}")

    def summary(self) -> dict[str, Any]:
        return {"instances": [{k: i.get(k) for k in ("instance", "role", "port", "pids")} for i in self.instances]}


def _roles(insts: list[dict[str, Any]]) -> dict[int, str]:
    return {i["instance"]: i["role"] for i in insts}
