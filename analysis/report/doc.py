"""The report as a small document tree, rendered by :mod:`analysis.report.html` and
:mod:`analysis.report.md`.

Blocks are frozen dataclasses holding already-formatted text plus, for table cells, the raw
value used for sorting (``Cell.sort``). Section builders (:mod:`analysis.report.sections`)
produce blocks; renderers never compute statistics, they only lay the blocks out.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Paragraph:
    """A line of prose (plain text; renderers escape it)."""

    text: str


@dataclass(frozen=True)
class Note:
    """A one-line notice. ``kind``: "missing" (an input is not available), "warning", "info"."""

    text: str
    kind: str = "info"


@dataclass(frozen=True)
class Heading:
    """A sub-heading inside a section (level 3 in HTML)."""

    text: str


@dataclass(frozen=True)
class Cell:
    """One table cell: ``text`` is shown; ``sort`` (number or string) orders the column;
    ``href`` (optional, relative) makes the text a link."""

    text: str
    sort: float | str | None = None
    href: str | None = None


@dataclass(frozen=True)
class Table:
    """A table. ``highlight[i]`` marks row ``i`` (e.g. rows that change under a variant).

    ``page_rows``: when set and the table is longer, the HTML shows it page by page.
    ``table_id`` names the table in the HTML (``id`` attribute) so tests and readers can find it.
    """

    columns: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    table_id: str = ""
    caption: str = ""
    highlight: tuple[bool, ...] = ()
    page_rows: int | None = None


@dataclass(frozen=True)
class Figure:
    """A PNG figure with a one-line caption saying what to read from it."""

    name: str
    png: bytes
    caption: str
    alt: str


Block = Paragraph | Note | Heading | Table | Figure


@dataclass(frozen=True)
class Section:
    """A numbered top-level section; ``anchor`` is its HTML id."""

    anchor: str
    title: str
    blocks: tuple[Block, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Document:
    """The whole report: a title, a subtitle line (dates), and sections in order."""

    title: str
    subtitle: str
    sections: tuple[Section, ...]
