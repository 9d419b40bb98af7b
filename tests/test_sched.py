"""The hunt's CPU priority (leaktrace/sched.py) on the real kernel: a hunt outside its own session joins the
``leaktrace`` cpu cgroup, one that leads its session raises its session's autogroup, both with HUNT_NICE on
their threads, and everything is put back when the hunt ends; the parsers on recorded /proc text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from leaktrace.sched import HUNT_NICE, NICE_WEIGHT, autogroup_enabled, cpu_cgroup_mount, cpu_cgroup_of

# Raises, reports what it sees from /proc, restores, reports again.
CHILD = """
import json, os, sys
from pathlib import Path
from leaktrace.sched import HuntPriority

def autogroup_nice(pid):
    # empty for a process of the boot session's default group (a service's or container's init session)
    path = Path(f"/proc/{pid}/autogroup")
    words = path.read_text().split() if path.exists() else []
    return words[-1] if words else None

def seen():
    cg = [l.split(":", 2)[2] for l in Path("/proc/self/cgroup").read_text().splitlines()
          if "cpu" in l.split(":")[1].split(",")]
    ag = autogroup_nice("self")
    return {"nice": os.getpriority(os.PRIO_PROCESS, 0), "cpu_cgroup": cg[0] if cg else None, "autogroup_nice": ag}

def helper_seen(pid):
    cg = [l.split(":", 2)[2] for l in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
          if "cpu" in l.split(":")[1].split(",")]
    return {"cpu_cgroup": cg[0] if cg else None, "autogroup_nice": autogroup_nice(pid)}

p = HuntPriority()
done = p.raise_()
during = seen()
import subprocess
from leaktrace.sched import helper_group
helper = subprocess.Popen(["sleep", "30"], start_new_session=True)
helper_inherited = helper_seen(helper.pid)
helper_group(helper.pid, 0)
helper_own = helper_seen(helper.pid)
helper_group(helper.pid, -5)
helper_raised = helper_seen(helper.pid)
helper.kill()
p.restore()
print(json.dumps({"done": done, "during": during, "after": seen(), "leader": os.getsid(0) == os.getpid(),
                  "helper": [helper_inherited, helper_own, helper_raised]}))
"""

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a negative nice needs root")


def _run(new_session: bool) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60,
                       start_new_session=new_session)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _root_cpu_cgroup() -> bool:
    mount = cpu_cgroup_mount(Path("/proc/self/mountinfo").read_text())
    return mount is not None and cpu_cgroup_of(Path("/proc/self/cgroup").read_text(), mount[1]) == "/"


@needs_root
def test_outside_its_session_the_hunt_joins_a_weighted_cpu_cgroup_and_leaves_it() -> None:
    got = _run(new_session=False)
    assert not got["leader"]
    assert got["done"]["nice"] == HUNT_NICE and got["during"]["nice"] == HUNT_NICE, got
    assert got["after"]["nice"] == 0, got
    if not (autogroup_enabled() and _root_cpu_cgroup()):
        assert "cgroup" not in got["done"], got  # autogroup does not apply: threads' nice only
        return
    assert got["during"]["cpu_cgroup"] == "/leaktrace", got
    mount, version = cpu_cgroup_mount(Path("/proc/self/mountinfo").read_text())
    if version == 1 and (mount / "leaktrace").exists():  # another hunt may be in it; its weight is the same
        assert int((mount / "leaktrace" / "cpu.shares").read_text()) == NICE_WEIGHT[HUNT_NICE]
    assert got["after"]["cpu_cgroup"] == "/", got
    # a helper in a session of its own (gdb, the heap walker) inherits the cgroup and is taken out of it: its
    # heavy work at an ordinary weight in its own session's group, raised only when asked (gdb sampling)
    inherited, own, raised = got["helper"]
    assert inherited["cpu_cgroup"] == "/leaktrace", got
    assert own == {"cpu_cgroup": "/", "autogroup_nice": "0"}, got
    assert raised == {"cpu_cgroup": "/", "autogroup_nice": str(HUNT_NICE)}, got
    # the session's group is the caller's: left alone
    assert got["during"]["autogroup_nice"] == got["after"]["autogroup_nice"], got


@needs_root
def test_a_session_leader_raises_its_own_autogroup_and_puts_it_back() -> None:
    if not autogroup_enabled():
        pytest.skip("kernel.sched_autogroup_enabled is 0: only the threads' nice applies")
    got = _run(new_session=True)
    assert got["leader"]
    if not _root_cpu_cgroup():
        assert "autogroup_nice" not in got["done"], got
        return
    assert got["done"].get("autogroup_nice") == HUNT_NICE and "cgroup" not in got["done"], got
    assert got["during"]["autogroup_nice"] == str(HUNT_NICE) and got["during"]["cpu_cgroup"] == "/", got
    assert got["after"]["autogroup_nice"] == "0" and got["after"]["nice"] == 0, got


MOUNTINFO_V1 = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
MOUNTINFO_V1_JOINED = "25 23 0:22 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
CGROUP_V1 = "9:name=systemd:/\n3:cpuset:/\n1:cpu:/leaktrace\n0::/\n"
CGROUP_V1_JOINED = "4:cpu,cpuacct:/system.slice/x.service\n0::/system.slice/x.service\n"
CGROUP_V2 = "0::/kubepods/pod1/abc\n"


def test_cpu_cgroup_parsers_on_recorded_text() -> None:
    assert cpu_cgroup_mount(MOUNTINFO_V1) == (Path("/sys/fs/cgroup/cpu"), 1)
    assert cpu_cgroup_mount(MOUNTINFO_V1_JOINED) == (Path("/sys/fs/cgroup/cpu,cpuacct"), 1)
    assert cpu_cgroup_mount("garbage\n - \n") is None
    assert cpu_cgroup_of(CGROUP_V1, 1) == "/leaktrace"
    assert cpu_cgroup_of(CGROUP_V1_JOINED, 1) == "/system.slice/x.service"
    assert cpu_cgroup_of(CGROUP_V2, 2) == "/kubepods/pod1/abc"
    assert cpu_cgroup_of(CGROUP_V2, 1) is None
    assert cpu_cgroup_of("cpuacct:/x\n", 1) is None  # malformed lines give nothing, not a wrong controller
