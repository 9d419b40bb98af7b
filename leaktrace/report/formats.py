"""Output formats: one reporter per format name, chosen from a registry, and ``--format`` parsed once.

A :class:`Formats` is the registry of the reporters of one kind of document (a hunt's report, a
comparison of two hunts). It parses ``--format`` (the CLI does so while it parses the command line, so an
unknown name is a usage error before any work starts), always adds the JSON file (the contract other
tools and the acceptance checks read), adds what a format brings with it (html: the flame graph's data,
outstanding.folded), and writes each chosen format with its reporter, in the registry's order.

Reporters are named by ``module:attribute`` and imported when a document is written: parsing
``--format`` loads none of them (nor matplotlib, jinja2, pandas).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from leaktrace.atomic import atomic_write_text
from leaktrace.errors import UsageError

if TYPE_CHECKING:
    from leaktrace.analysis.figures import Figures


class Reporter(Protocol):
    """Writes one format of a document into ``out_dir`` and returns the file written. ``figures`` are what
    the analysis took from the session besides the document (time series, stacks), for the reporters
    that plot; the others ignore them. A reporter renders what it is given and never reopens a session."""

    name: str  # the format's name in --format
    filename: str  # the file it writes in out_dir

    def write(self, doc: Mapping[str, Any], out_dir: Path, figures: Figures | None = None) -> Path: ...


@dataclass(frozen=True)
class TextReporter:
    """A reporter whose format is one text file rendered from the document (and the figures)."""

    name: str
    filename: str
    render: Callable[[Mapping[str, Any], Figures | None], str]

    def write(self, doc: Mapping[str, Any], out_dir: Path, figures: Figures | None = None) -> Path:
        return atomic_write_text(Path(out_dir) / self.filename, self.render(doc, figures))


@dataclass(frozen=True)
class Formats:
    document: str  # what the reporters render, for messages: "report", "compare"
    reporters: Mapping[str, str]  # format name -> "module:attribute" of its Reporter, in writing order
    always: tuple[str, ...] = ()  # written whatever --format says
    brings: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # a format -> those written with it

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.reporters)

    def parse(self, text: str | Iterable[str]) -> tuple[str, ...]:
        """``json,md`` (or names already split) as a tuple of names, each once; an unknown name is a usage
        error (one line, exit 2)."""
        asked = [f.strip() for f in text.split(",")] if isinstance(text, str) else [str(f).strip() for f in text]
        asked = [f for f in asked if f]
        bad = [f for f in asked if f not in self.reporters]
        if bad:
            raise UsageError(f"--format: unknown format(s) {', '.join(bad)} (choose from {', '.join(self.names)})")
        return tuple(dict.fromkeys(asked))

    def selected(self, names: Iterable[str]) -> tuple[str, ...]:
        """What writing ``names`` writes: those, what they bring and what is always written, in order."""
        asked = set(self.parse(names))
        want = asked | set(self.always) | {b for n in asked for b in self.brings.get(n, ())}
        return tuple(n for n in self.reporters if n in want)

    def reporter(self, name: str) -> Reporter:
        module, attr = self.reporters[name].split(":")
        return getattr(importlib.import_module(module), attr)

    def write(self, doc: Mapping[str, Any], out_dir: Path, names: Iterable[str],
              figures: Figures | None = None) -> list[Path]:
        return [self.reporter(n).write(doc, Path(out_dir), figures) for n in self.selected(names)]


# A hunt's report: hunt, report, demo (and each node of a cluster hunt).
REPORT_FORMATS = Formats(
    "report",
    {"json": "leaktrace.report.json_report:REPORTER", "md": "leaktrace.report.markdown:REPORTER",
     "html": "leaktrace.report.html:REPORTER", "folded": "leaktrace.report.flame:REPORTER"},
    always=("json",), brings={"html": ("folded",)})

# Two hunts compared: compare.
COMPARE_FORMATS = Formats(
    "compare",
    {"json": "leaktrace.report.compare:JSON_REPORTER", "md": "leaktrace.report.compare:MARKDOWN_REPORTER",
     "html": "leaktrace.report.compare:HTML_REPORTER"},
    always=("json",))
