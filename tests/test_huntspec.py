"""The hunt's options as one object: HuntSpec.argv() is read back by `leaktrace hunt`'s own parser into the
same HuntSpec (cluster nodes and watch's deep hunts run hunts through it), and the defaults the command
line shows are HuntSpec's."""

from __future__ import annotations

import pytest

from leaktrace.commands.hunt import hunt
from leaktrace.huntspec import HuntSpec

SPECS = [
    HuntSpec(pids=(4242,)),
    HuntSpec(pids=(1, 2, 3), duration=12.5, interval=0.25, smaps_every=3, out="/tmp/x y", force=True,
             gdb_samples=0, gdb_seconds=4.0, gdb_pause_pct=2.5, metrics_urls=("http://127.0.0.1:8000/metrics",
                                                                              "http://127.0.0.1:8100/metrics"),
             no_bpf=True, no_gdb=True, pyheap=False, nice=0, prometheus_port=9464, prometheus_addr="127.0.0.2",
             live=False, formats=("json", "pprof"), quiet=True),
    HuntSpec(vllm=True, live=True, nice=-10, formats=("json",)),
]


def _parsed(argv: list[str]) -> HuntSpec:
    ctx = hunt.make_context("hunt", argv[argv.index("hunt") + 1:])
    return HuntSpec(**ctx.params)


@pytest.mark.parametrize("spec", SPECS)
def test_argv_reads_back_as_the_same_spec(spec: HuntSpec) -> None:
    back = _parsed(spec.argv())
    default_formats = _parsed(["hunt"]).formats
    assert back == (spec if spec.formats is not None else HuntSpec(**{**spec.__dict__, "formats": default_formats}))


def test_the_command_line_defaults_are_the_specs() -> None:
    parsed = _parsed(["hunt"])
    assert parsed == HuntSpec(formats=parsed.formats)
    assert parsed.formats == ("json", "md", "html")


def test_argv_leaves_defaults_to_the_hunt() -> None:
    assert HuntSpec(pids=(7,)).argv()[-2:] == ["--pid", "7"]
    assert "--duration" not in HuntSpec(pids=(7,)).argv()
