"""What `leaktrace hunt` is asked, as one object.

:class:`HuntSpec` holds the hunt command's options: built once from the command line (the options are
declared in leaktrace.commands.options, their defaults taken from here), turned into the probes' options by
:meth:`HuntSpec.probe_options`, and back into a command line by :meth:`HuntSpec.argv` where another process
runs the hunt (each node of a cluster hunt, watch's deep hunts).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields

from leaktrace.errors import UsageError
from leaktrace.probes import HuntOptions
from leaktrace.sched import HUNT_NICE


@dataclass(frozen=True)
class HuntSpec:
    pids: tuple[int, ...] = ()
    vllm: bool = False
    duration: float = 60.0
    interval: float = 1.0
    smaps_every: int = 10
    out: str | None = None
    force: bool = False
    gdb_samples: int | None = None
    gdb_seconds: float | None = None
    gdb_pause_pct: float | None = None
    metrics_urls: tuple[str, ...] = ()
    no_bpf: bool = False
    no_gdb: bool = False
    pyheap: bool = True
    nice: int = HUNT_NICE
    prometheus_port: int | None = None
    prometheus_addr: str = "127.0.0.1"
    live: bool | None = None  # None: when stderr is a TTY
    formats: tuple[str, ...] | None = None  # None: the hunt's default formats
    quiet: bool = False

    def probe_options(self) -> HuntOptions:
        options = HuntOptions(duration=self.duration, interval=self.interval, smaps_every=max(1, self.smaps_every),
                              bpf=not self.no_bpf, gdb=not self.no_gdb, gdb_samples=self.gdb_samples,
                              vllm=self.vllm, metrics_urls=list(self.metrics_urls), pyheap=self.pyheap,
                              prometheus_port=self.prometheus_port, live=self.live,
                              prometheus_addr=self.prometheus_addr, gdb_seconds=self.gdb_seconds,
                              # Asked for by default: without BPF the hunt cannot name libraries, so "no BPF"
                              # is one clear error (exit 5) with the way out (--no-bpf), not a hunt that
                              # quietly knows less.
                              bpf_required=not self.no_bpf, nice=self.nice)
        if self.gdb_pause_pct is not None:
            if not 0 < self.gdb_pause_pct <= 100:
                raise UsageError("--gdb-pause-pct must be in (0, 100]")
            # A larger pause share needs a matching stop rate, or the stops/s limit ends sampling first.
            options.gdb_pause_fraction = self.gdb_pause_pct / 100.0
            options.gdb_max_stops_per_s = max(200.0, 200.0 * self.gdb_pause_pct)
        return options

    def argv(self) -> list[str]:
        """The command line that runs this hunt in another process (this Python, ``-m leaktrace hunt``): the
        options that differ from their defaults, so the hunt there applies its own defaults to the rest."""
        default = HuntSpec()
        args: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value == getattr(default, f.name):
                continue
            flag = "--" + _FLAGS.get(f.name, f.name).replace("_", "-")
            if f.name in ("pids", "metrics_urls"):
                for v in value:
                    args += [flag, str(v)]
            elif f.name == "formats":
                args += [flag, ",".join(value)]
            elif f.name == "pyheap":
                args.append("--no-pyheap")
            elif f.name == "live":
                args.append("--live" if value else "--no-live")
            elif isinstance(value, bool):
                args.append(flag)
            else:
                args += [flag, str(value)]
        return [sys.executable, "-m", "leaktrace", "hunt", *args]


# Fields whose option is not --<field name>.
_FLAGS = {"pids": "pid", "metrics_urls": "metrics", "formats": "format"}
