"""The CPU priority of the hunt's own processes, so its ticks run on time on a node whose cores serve.

Small and bursty work (a tick: tens of ms of CPU a second) is what a loaded node delays most: beside a vLLM
P/D pair keeping both cores of a 2-core node busy, a nice-0 process woken every 0.5 s for 30 ms of CPU sat
runnable on the run queue for most of the wall time and waited up to 28 s for one burst. With the kernel's
autogroup (``kernel.sched_autogroup_enabled``), the CPU is shared between sessions first and between a
session's threads second, so a thread's own nice changes nothing against the servers (nice -10: still up to
15 s); the session's group at nice -5 got each burst within 50-65 ms. So the hunt raises the group it is
scheduled in, not only its threads:

- its session's autogroup when the hunt leads its session (nobody else's processes share it);
- otherwise, where autogroup applies (the process sits in the root cpu cgroup), a cpu cgroup of its own,
  ``leaktrace``, with the weight of HUNT_NICE (``cpu.shares`` on cgroup v1, ``cpu.weight`` on v2), left at
  the end of the hunt;
- in any case its threads' nice, which decides among the processes of a shared cgroup (a container).

A raised priority makes the hunt prompt, not bigger: what it computes is bounded by its ticks. Its heavy
helpers (gdb's symbol reads, heap walks) run in sessions and groups of their own at an ordinary weight
(``helper_group``): at the hunt's, gdb reading 1 GB of symbols doubled the pair's p50 latency. Without the privilege (not root)
nothing changes and ``as_meta()`` says why.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

HUNT_NICE = -5
# The kernel's weight of a nice level (sched_prio_to_weight), for a cgroup given the share of that level.
NICE_WEIGHT = {-10: 9548, -5: 3121, 0: 1024}
CGROUP_NAME = "leaktrace"
# The cpu hierarchy this process left for CGROUP_NAME (HuntPriority), where helpers go back to (helper_group).
_joined_from: Path | None = None


def autogroup_enabled() -> bool:
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False


def cpu_cgroup_mount(mountinfo: str) -> tuple[Path, int] | None:
    """(mount point, cgroup version) of the hierarchy holding the cpu controller, from the text of
    /proc/self/mountinfo; a v1 ``cpu`` hierarchy wins over a v2 one."""
    v2 = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] == "cgroup" and "cpu" in tail[2].split(","):
            return Path(fields[4]), 1
        if tail[0] == "cgroup2" and v2 is None:
            v2 = Path(fields[4])
    if v2 is not None:
        try:
            if "cpu" in (v2 / "cgroup.subtree_control").read_text().split():
                return v2, 2
        except OSError:
            pass
    return None


def cpu_cgroup_of(proc_cgroup: str, version: int) -> str | None:
    """The path of a process's cgroup in the cpu hierarchy, from the text of /proc/PID/cgroup."""
    for line in proc_cgroup.splitlines():
        _id, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if version == 1 and "cpu" in controllers.split(","):
            return path
        if version == 2 and _id == "0" and controllers == "":
            return path
    return None


def set_autogroup_nice(pid: int, nice: int) -> bool:
    """Set the nice of ``pid``'s session group (pid 0: this process); False where autogroup is off or
    the kernel refused."""
    path = Path(f"/proc/{pid or 'self'}/autogroup")
    try:
        path.write_text(str(nice))
        return True
    except OSError:
        return False


class HuntPriority:
    """Raises this process's CPU priority for a hunt (``raise_``) and puts it back (``restore``)."""

    def __init__(self, nice: int = HUNT_NICE) -> None:
        self.nice = nice
        self.done: dict[str, Any] = {}
        self._nice_before: int | None = None
        self._autogroup_before: int | None = None
        self._cgroup_from: Path | None = None
        self._cgroup: Path | None = None

    def raise_(self) -> dict[str, Any]:
        """Raise what applies (see the module docstring); returns what was done, for meta.json."""
        try:
            self._nice_before = os.getpriority(os.PRIO_PROCESS, 0)
            if self._nice_before > self.nice:
                # This thread only: threads and helpers started from here on inherit it.
                os.setpriority(os.PRIO_PROCESS, 0, self.nice)
                self.done["nice"] = self.nice
        except OSError as e:
            self._nice_before = None
            self.done["nice_error"] = e.strerror or str(e)
        if self.nice >= 0 or not autogroup_enabled():
            return self.done  # a group is only ever raised
        try:
            mount = cpu_cgroup_mount(Path("/proc/self/mountinfo").read_text())
            path = cpu_cgroup_of(Path("/proc/self/cgroup").read_text(), mount[1]) if mount else "/"
        except OSError:
            mount, path = None, "/"
        if path not in ("/", None):
            return self.done  # in a cgroup of its own choosing (a container, a service): autogroup does not apply
        if os.getsid(0) == os.getpid():
            self._raise_autogroup()
        elif mount is not None:
            self._join_cgroup(*mount)
        else:
            self.done["group_error"] = "shares its session's autogroup and has no cpu cgroup to join"
        return self.done

    def _raise_autogroup(self) -> None:
        try:
            before = int(Path("/proc/self/autogroup").read_text().split()[-1])
        except (OSError, ValueError, IndexError):
            before = 0
        if before <= self.nice:
            return
        if set_autogroup_nice(0, self.nice):
            self._autogroup_before = before
            self.done["autogroup_nice"] = self.nice
        else:
            self.done["group_error"] = "the kernel refused the autogroup's nice"

    def _join_cgroup(self, mount: Path, version: int) -> None:
        group = mount / CGROUP_NAME
        weight = NICE_WEIGHT.get(self.nice, 1024)
        try:
            group.mkdir(exist_ok=True)
            if version == 1:
                (group / "cpu.shares").write_text(str(weight))
            else:
                (group / "cpu.weight").write_text(str(max(1, min(10000, round(weight * 100 / 1024)))))
            (group / "cgroup.procs").write_text(str(os.getpid()))
        except OSError as e:
            self.done["group_error"] = f"cpu cgroup {group}: {e.strerror or e}"
            return
        self._cgroup_from, self._cgroup = mount, group
        global _joined_from
        _joined_from = mount
        self.done["cgroup"] = str(group)

    def restore(self) -> None:
        if self._cgroup_from is not None:
            try:
                (self._cgroup_from / "cgroup.procs").write_text(str(os.getpid()))
                self._cgroup.rmdir()  # type: ignore[union-attr]
            except OSError:
                pass  # another hunt is in it, or it is gone: an empty group costs nothing
            self._cgroup_from = self._cgroup = None
            global _joined_from
            _joined_from = None
        if self._autogroup_before is not None:
            set_autogroup_nice(0, self._autogroup_before)
            self._autogroup_before = None
        if self._nice_before is not None:
            try:
                os.setpriority(os.PRIO_PROCESS, 0, self._nice_before)
            except OSError:
                pass
            self._nice_before = None


def helper_group(pid: int, nice: int) -> None:
    """Give a helper started in a session of its own (``start_new_session``) a scheduling group of its own at
    ``nice``: out of the hunt's cpu cgroup, which it inherited, into its session's autogroup. A helper's heavy
    work (gdb's symbol read, a heap walk) at the hunt's raised weight would take the serving processes' CPU:
    it runs at an ordinary weight, and gdb is raised only while it samples (a stopped target waits for it)."""
    if not autogroup_enabled():
        return
    try:
        if os.getsid(pid) != pid:
            return  # in the hunt's session: its group is the hunt's
    except OSError:
        return
    if _joined_from is not None:
        try:
            (_joined_from / "cgroup.procs").write_text(str(pid))
        except OSError:
            pass
    set_autogroup_nice(pid, nice)
