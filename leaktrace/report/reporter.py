"""What a reporter is: :class:`Reporter`, the seam between a document and one output format, and
:class:`TextReporter`, the reporter of a format that is one text file. The registry that chooses reporters
by ``--format`` name is leaktrace.report.formats."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from leaktrace.atomic import atomic_write_text

if TYPE_CHECKING:
    from leaktrace.analysis.figures import Figures


class Reporter(Protocol):
    """Writes one format of a document into ``out_dir`` and returns the file written. ``figures`` are what
    the analysis took besides the document, for the reporters that plot (a hunt's Figures: time series,
    stacks; a comparison's: each hunt's flame graph views); the others ignore them. A reporter renders what it is given and never reopens a session."""

    name: str  # the format's name in --format
    filename: str  # the file it writes in out_dir

    def write(self, doc: Mapping[str, Any], out_dir: Path,
              figures: Figures | Mapping[str, Any] | None = None) -> Path: ...


@dataclass(frozen=True)
class TextReporter:
    """A reporter whose format is one text file rendered from the document (and the figures)."""

    name: str
    filename: str
    render: Callable[[Mapping[str, Any], Any], str]

    def write(self, doc: Mapping[str, Any], out_dir: Path,
              figures: Figures | Mapping[str, Any] | None = None) -> Path:
        return atomic_write_text(Path(out_dir) / self.filename, self.render(doc, figures))
