"""Where a command writes: output directories decided once, at the CLI boundary.

Two rules, each against a way an output goes wrong:

* **Absolute, before anything else runs.** libbcc changes the working directory of the whole process to
  the kernel-header tree while it compiles the BPF program (~0.5 s), so a relative path opened by any
  other thread in that window (the session's flush thread, gdb's work folder) resolves under that tree.
  Every output path is therefore made absolute here, before a probe is built.
* **A session directory is never mixed.** A second hunt into a directory that holds a session would
  restart part numbers under the first run's compacted files. Such a directory is refused
  (:class:`~leaktrace.errors.SessionExists`) unless the user passes ``--force``; then the old session is
  replaced atomically by :class:`~leaktrace.session.SessionWriter` once the new one has its meta.json.
  A non-empty directory that is not a session is never touched, ``--force`` or not.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from leaktrace.errors import OutputNotWritable, SessionExists

# Files whose presence says "a leaktrace session (or merged cluster report) lives here".
SESSION_MARKERS = ("meta.json", "tables", "report.json", "cluster.json")


def absolute(path: str | os.PathLike[str]) -> Path:
    """``path`` made absolute against the working directory of now (no symlink resolution: the user's
    name for the place is kept)."""
    return Path(os.path.abspath(os.path.expanduser(os.fspath(path))))


def holds_session(path: Path) -> bool:
    return path.is_dir() and any((path / m).exists() for m in SESSION_MARKERS)


def _describe_session(path: Path) -> str:
    """A few words on the session in ``path`` for the refusal message (best effort)."""
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError):
        return "a leaktrace session"
    pids = (meta.get("target") or {}).get("pids") or []
    when = meta.get("start_wall")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if isinstance(when, (int, float)) else "?"
    return f"a leaktrace session (pids {', '.join(map(str, pids)) or '?'}, started {stamp})"


def check_out(path: Path, force: bool) -> Path:
    """Refuse ``path`` unless a new session may be written there: it does not exist, is an empty
    directory, or holds a session and ``force`` is set (the writer then replaces it atomically)."""
    if path.exists() and not path.is_dir():
        raise OutputNotWritable(f"--out {path} exists and is not a directory")
    if not path.is_dir():
        return path
    if holds_session(path):
        if force:
            return path
        raise SessionExists(f"--out {path} already holds {_describe_session(path)}",
                            "choose another --out, or pass --force to replace it")
    try:
        empty = next(os.scandir(path), None) is None
    except OSError as e:
        raise OutputNotWritable(f"cannot read --out {path}: {e.strerror or e}") from e
    if not empty:
        raise SessionExists(f"--out {path} is a non-empty directory that holds no leaktrace session",
                            "choose a new or empty directory (nothing in it is touched, not even with --force)")
    return path


def claim_default(prefix: str, parent: Path | None = None) -> Path:
    """A new, empty directory ``PREFIX-DATE-TIME[-N]`` under ``parent`` (default: the working directory),
    created here so that two commands started in the same second never share it (mkdir is atomic)."""
    base = absolute(parent or Path.cwd()) / time.strftime(f"{prefix}-%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        candidate = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            continue
        except OSError as e:
            raise OutputNotWritable(f"cannot create {candidate}: {e.strerror or e}") from e
    raise OutputNotWritable(f"no free name for {base}-N after 999 tries", "pass --out DIR")


@contextlib.contextmanager
def output_dir(out: str | os.PathLike[str] | None, *, prefix: str, force: bool = False) -> Iterator[Path]:
    """The absolute output directory of a command: ``out`` checked by :func:`check_out`, or a new
    default one claimed by :func:`claim_default` — removed again if the command fails before writing
    anything into it (``hunt --pid 999999`` leaves no empty directory behind)."""
    if out is not None and os.fspath(out) != "":
        yield check_out(absolute(out), force)
        return
    path = claim_default(prefix)
    try:
        yield path
    except BaseException:
        with contextlib.suppress(OSError):
            path.rmdir()  # only when still empty
        raise


def write_error_remedy(err: OSError, out: Path) -> str:
    """What the user should do about a failed session write, by its cause."""
    readable = f"what was written before the failure stays readable: leaktrace report {out}"
    if err.errno == errno.ENOENT:
        return (f"the session directory {out} disappeared during the hunt (removed or moved?); "
                + (readable if out.is_dir() else "nothing of it is left to read"))
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"free space or choose another --out; {readable}"
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"the directory became unwritable (permissions or a read-only mount); {readable}"
    return f"choose another --out; {readable}"
