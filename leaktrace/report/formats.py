"""Output formats: one reporter per format name, chosen from a registry, and ``--format`` parsed once.

A :class:`Formats` is the registry of the reporters of one kind of document (a hunt's report, a
comparison of two hunts). It parses ``--format`` (the CLI does so while it parses the command line, so an
unknown name is a usage error before any work starts), always adds the JSON file (the contract other
tools and the acceptance checks read), adds what a format brings with it (html: the flame graph's data,
outstanding.folded), and writes each chosen format with its reporter, in the registry's order.

Each reporter is reached through a small function that imports its module when a document is written:
parsing ``--format`` loads none of them (nor pygal, jinja2, pandas).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leaktrace.errors import UsageError
from leaktrace.report.reporter import Reporter

if TYPE_CHECKING:
    from leaktrace.analysis.figures import Figures


@dataclass(frozen=True)
class Formats:
    document: str  # what the reporters render, for messages: "report", "compare"
    reporters: Mapping[str, Callable[[], Reporter]]  # format name -> its Reporter, loaded; in writing order
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
        return self.reporters[name]()

    def write(self, doc: Mapping[str, Any], out_dir: Path, names: Iterable[str],
              figures: Figures | Mapping[str, Any] | None = None) -> list[Path]:
        return [self.reporter(n).write(doc, Path(out_dir), figures) for n in self.selected(names)]


def _json() -> Reporter:
    from leaktrace.report import json_report

    return json_report.REPORTER


def _markdown() -> Reporter:
    from leaktrace.report import markdown

    return markdown.REPORTER


def _html() -> Reporter:
    from leaktrace.report import html

    return html.REPORTER


def _folded() -> Reporter:
    from leaktrace.report import folded

    return folded.REPORTER


def _pprof() -> Reporter:
    from leaktrace.report import pprof

    return pprof.REPORTER


def _compare(attr: str) -> Callable[[], Reporter]:
    def load() -> Reporter:
        from leaktrace.report import compare

        return getattr(compare, attr)

    return load


# A hunt's report: hunt, report, demo (and each node of a cluster hunt).
REPORT_FORMATS = Formats(
    "report", {"json": _json, "md": _markdown, "html": _html, "folded": _folded, "pprof": _pprof},
    always=("json",), brings={"html": ("folded",)})

# Two hunts compared: compare.
COMPARE_FORMATS = Formats(
    "compare",
    {"json": _compare("JSON_REPORTER"), "md": _compare("MARKDOWN_REPORTER"), "html": _compare("HTML_REPORTER")},
    always=("json",))
