"""Golden reports: small real sessions recorded on this machine (tests/data/golden/<name>/: meta.json +
tables/) and the reports the code renders from them (<name>/expected/). They pin behaviour across
refactors: a move-only change must leave every expected file as it is.

A change that alters a report on purpose re-renders the goldens in its own commit, saying why:

    .venv/bin/python tests/golden.py            # rewrite tests/data/golden/*/expected/
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"
COMPARED = ("report.json", "report.md", "outstanding.folded")


def sessions() -> list[str]:
    return sorted(p.name for p in GOLDEN.iterdir() if (p / "meta.json").is_file())


def render(name: str, work: Path) -> Path:
    """Copy the recorded session to ``work`` and render every format there; returns the copy."""
    from leaktrace.report import render_session

    dest = work / name
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    shutil.copy(GOLDEN / name / "meta.json", dest / "meta.json")
    shutil.copytree(GOLDEN / name / "tables", dest / "tables")
    render_session(dest, formats=["json", "md", "html", "folded"])
    return dest


def normalized(path: Path) -> str:
    """The file as compared: JSON re-dumped with sorted keys (stable diffs), other text as is."""
    text = path.read_text()
    if path.suffix == ".json":
        return json.dumps(json.loads(text), indent=1, sort_keys=True) + "\n"
    return text


def update() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name in sessions():
            out = render(name, Path(tmp))
            expected = GOLDEN / name / "expected"
            expected.mkdir(exist_ok=True)
            for f in COMPARED:
                (expected / f).write_text(normalized(out / f))
            print(f"{name}: {', '.join(COMPARED)} rewritten")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    update()
