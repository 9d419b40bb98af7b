"""tracefs: where tracepoint formats live. Fresh machines (and many containers) do not mount it;
as root we mount it the way bpftrace and perf expect, and say so."""

from __future__ import annotations

import os
import subprocess

TRACEFS_DIRS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")


def mounted_root() -> str | None:
    for root in TRACEFS_DIRS:
        if os.path.isdir(f"{root}/events"):
            return root
    return None


def ensure_mounted() -> tuple[str | None, str]:
    """(root, what was done). Mounts tracefs at /sys/kernel/tracing and debugfs at /sys/kernel/debug
    (BCC reads /sys/kernel/debug/tracing) when root and they are missing."""
    done = []
    if os.geteuid() == 0:
        if not os.path.isdir("/sys/kernel/tracing/events") and os.path.isdir("/sys/kernel/tracing"):
            if subprocess.run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"],
                              capture_output=True).returncode == 0:
                done.append("mounted tracefs on /sys/kernel/tracing")
        if not os.path.isdir("/sys/kernel/debug/tracing") and os.path.isdir("/sys/kernel/debug"):
            if subprocess.run(["mount", "-t", "debugfs", "nodev", "/sys/kernel/debug"],
                              capture_output=True).returncode == 0:
                done.append("mounted debugfs on /sys/kernel/debug")
    return mounted_root(), "; ".join(done)
