"""Growth by touching pages, with no syscall during the hunt, is named to the library whose code touches them
(tests/fixtures/touch_growth.c: libtouch.so writes a 1 GiB MAP_NORESERVE region it reserved before attach,
through libc's memset; the host program churns balanced mmaps meanwhile). The rate is the region's resident
growth, checked against the fixture's own count of the bytes it wrote; the host's churn names nobody."""

from __future__ import annotations

import json

import pytest
from conftest import is_root, run_cli
from shapes_helpers import MB, TruthLog

from leaktrace.probes.bpf.faults import _vmflags_at
from leaktrace.session import SessionReader

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(not is_root(), reason="BPF needs root")]
KIB_PER_S = 1536  # 90 MiB/min
REGION = 1 << 30


@pytest.fixture(scope="module")
def touch_bin():
    from fixtures.build import build

    lib = build("libtouch.so", ["touch_growth.c"], cflags=["-DTOUCH_LIB", "-fomit-frame-pointer"], shared=True,
                strip=True)
    return build("touch_growth", ["touch_growth.c"],
                 ldflags=[f"-L{lib.parent}", "-ltouch", f"-Wl,-rpath,{lib.parent}"])


def test_region_mapped_before_attach_is_named_by_its_toucher(spawn, touch_bin, tmp_path):
    truth = tmp_path / "truth"
    target = spawn([touch_bin, KIB_PER_S, "--truth", truth, "--churn-per-s", 200])
    with TruthLog(truth) as log:
        r = run_cli("hunt", "--pid", target.pid, "--duration", 20, "--format", "json", "--out", tmp_path / "s")
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "s" / "report.json").read_text())
    assert rep["verdict"] == "leak", rep["verdict_reason"]
    top = rep["culprits"][0]
    assert (top["pid"], top["library"], top["touched_by"]) == (target.pid, "libtouch.so", "libtouch.so"), top
    assert top["mapped_before_attach"] is True
    assert top["region"]["size"] == REGION and "nr" in top["region"]["flags"], top["region"]
    # its address space did not grow, what is resident did: both figures named
    assert (top["outstanding_bytes"], top["mapped_mb_per_min"]) == (REGION, 0.0)
    assert top["outstanding_resident_bytes"] == top["region"]["rss_last"] < REGION
    # the host binary's balanced churn is not a culprit, joined by address or otherwise
    assert all(c["library"] != "touch_growth" for c in rep["culprits"]), rep["culprits"]
    reader = SessionReader(tmp_path / "s")
    # RSS grew with no mapping call the ledger holds: gdb (stacks at those calls) was not run for it
    assert reader.meta["probe_summaries"]["gdb"]["runs"] == 0, reader.meta["probe_summaries"]["gdb"]
    regions = reader.table("regions")
    mine = regions[(regions["pid"] == target.pid) & (regions["size"] == REGION)]
    t0 = reader.meta["t0_monotonic"]
    t_first, t_last = float(mine["t"].min()), float(mine["t"].max())
    rate = log.mb_per_min(t0 + t_first, t0 + t_last)
    assert rate > 0.8 * KIB_PER_S * 1024 * 60 / MB  # the fixture kept the rate asked
    assert top["mb_per_min"] == pytest.approx(rate, rel=0.15)


def test_vmflags_of_the_region_holding_an_address():
    smaps = ("7f0000000000-7f0040000000 rw-p 00000000 00:00 0 \nSize: 1048576 kB\nVmFlags: rd wr mr mw me nr \n"
             "7f0040000000-7f0040001000 r--p 00000000 00:00 0 \nSize: 4 kB\nVmFlags: rd mr mw me \n")
    assert _vmflags_at(smaps, 0x7F0000200000) == "rd wr mr mw me nr"
    assert _vmflags_at(smaps, 0x7F0040000000) == "rd mr mw me"
    assert _vmflags_at(smaps, 0x7F0050000000) == ""
