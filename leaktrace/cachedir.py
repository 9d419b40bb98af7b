"""Where leaktrace keeps what it can make again but need not: ``$LEAKTRACE_CACHE``, else
``$XDG_CACHE_HOME/leaktrace``, else ``~/.cache/leaktrace``. Nothing in it is a finding: deleting it costs
only the time to remake it."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("LEAKTRACE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "leaktrace"))
