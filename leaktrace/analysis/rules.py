"""The culprit rules (rules.toml: match → finding → evidence → remedy), loaded and rendered."""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leaktrace.analysis.candidates import Candidate, frame_library
from leaktrace.memclass import MEMORY_HOOK_LIBRARY

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

RULES_FILE = Path(__file__).with_name("rules.toml")


@dataclass
class Rule:
    id: str
    title: str
    match: dict[str, Any]
    text: dict[str, Any]
    settings: list[str] = field(default_factory=list)  # what the remedy changes (rules.toml header)
    _res: dict[str, re.Pattern[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in ("library", "stack", "path"):
            if key in self.match:
                self._res[key] = re.compile(self.match[key])

    def matches_library(self, c: Candidate) -> bool:
        return "library" in self._res and bool(c.library) and self._prereq(c) \
            and bool(self._res["library"].search(c.library or ""))

    def _prereq(self, c: Candidate) -> bool:
        """The match's conditions besides its patterns (kind, memory class, Python target, what the Python heap's
        walks say): all must hold."""
        m = self.match
        if "kind" in m and c.kind not in m["kind"]:
            return False
        if "cls" in m and c.cls not in m["cls"]:
            return False
        if m.get("python_objects_may_explain") and c.extra.get("python_objects_explain") is False:
            return False
        return not (m.get("python") and not c.python)

    def matches(self, c: Candidate) -> bool:
        if not self._prereq(c):
            return False
        if not self._res:
            return True
        if "library" in self._res and c.library and self._res["library"].search(c.library):
            return True
        if "stack" in self._res and any(self._res["stack"].search(f) for f in outer_frames(c)):
            return True
        if "path" in self._res and any(self._res["path"].search(p) for p in c.paths):
            return True
        return False


def outer_frames(c: Candidate) -> list[str]:
    """The frames a rule's ``stack`` is matched against: from the calling library's first frame outward (the
    whole stack when it has no frame of its own), without a memory hook's frames (UCX's libucm). The frames
    inside the caller are the machinery between it and the syscall (libc's malloc, the hook), and a hook
    is on the path of every mmap, sbrk and munmap of a hooked process: neither says who keeps the memory
    (UCX's own mappings are blamed on libucm itself, which a rule's ``library`` matches)."""
    frames = c.stack
    if c.library:
        for i, f in enumerate(frames):
            if frame_library(f) == c.library:
                frames = frames[i:]
                break
    return [f for f in frames if not MEMORY_HOOK_LIBRARY.match(frame_library(f))]


def load_rules(path: Path | None = None) -> list[Rule]:
    with open(path or RULES_FILE, "rb") as f:
        data = tomllib.load(f)
    return [Rule(r["id"], r.get("title", r["id"]), r.get("match", {}), r.get("text", {}), list(r.get("settings", [])))
            for r in data["rule"]]


class _Fields(string.Formatter):
    """Missing values render as "unknown" and are counted (an evidence line made only of unknowns is
    dropped: evidence states what was measured)."""

    def __init__(self) -> None:
        self.missing = 0

    def get_value(self, key: Any, args: Any, kwargs: Any) -> Any:
        v = kwargs.get(key)
        if v is None or v == "":
            self.missing += 1
            return "unknown"
        return v


def render_template(template: str, fields: dict[str, Any], drop_if_missing: bool = False) -> str | None:
    fmt = _Fields()
    try:
        text = fmt.vformat(template, (), fields)
    except (ValueError, IndexError, KeyError) as e:  # a bad template in a user-edited rules file
        return f"{template} [template error: {e}]"
    return None if drop_if_missing and fmt.missing else text


