"""Was a process OOM-killed? The kernel's log says so ("Killed process PID (comm)" / "oom-kill:… pid=PID"),
read from /dev/kmsg without blocking (root only; anything unreadable answers False)."""

from __future__ import annotations

import errno
import os
import re


def oom_killed(pid: int) -> bool:
    pat = re.compile(rf"(Killed process {pid} \(|oom-kill:.*[ ,]pid={pid}[ ,])".encode())
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    found = False
    try:
        while True:
            try:
                rec = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as e:  # EPIPE: a record overwritten while read; go on with the next
                if e.errno == errno.EPIPE:
                    continue
                break
            if not rec:
                break
            if pat.search(rec):
                found = True
    finally:
        os.close(fd)
    return found
