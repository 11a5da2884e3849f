"""Render a :class:`analysis.report.doc.Document` as Markdown (GitHub-flavoured pipe tables).

Figures are written as PNG files into ``figures_dir`` and linked relative to the Markdown file
(which lives in ``figures_dir``'s parent). Highlighted table rows are marked with "**›**" in an
extra first column; notes become block quotes.
"""

from __future__ import annotations

from pathlib import Path

from analysis.report.doc import Block, Document, Figure, Heading, Note, Paragraph, Table
from storage.parquet.atomic import write_bytes_atomic

NOTE_PREFIX = {"missing": "ℹ️ ", "warning": "⚠️ ", "info": ""}


def _esc(text: str) -> str:
    """Table-cell text as Markdown that shows it verbatim: a pipe ends no cell, and a ``<`` opens
    no HTML tag in a viewer that renders inline HTML (cells carry endpoint-given text, such as a
    served model's name)."""
    return (text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
            .replace("<", "&lt;").replace(">", "&gt;"))


def _table(t: Table) -> str:
    marks = any(t.highlight)
    head = (["", *t.columns] if marks else list(t.columns))
    lines = ["| " + " | ".join(_esc(c) for c in head) + " |",
             "|" + "|".join("---" for _ in head) + "|"]
    for i, row in enumerate(t.rows):
        cells = [f"[{_esc(c.text)}]({c.href})" if c.href else _esc(c.text) for c in row]
        if marks:
            cells.insert(0, "**›**" if i < len(t.highlight) and t.highlight[i] else "")
        lines.append("| " + " | ".join(cells) + " |")
    if marks:
        lines.append("")
        lines.append("Rows marked **›** are highlighted (changed, or small n).")
    return "\n".join(lines)


def _write_figure(f: Figure, figures_dir: Path, used: dict[str, int]) -> Path:
    n = used.get(f.name, 0)
    used[f.name] = n + 1
    path = figures_dir / (f"{f.name}.png" if n == 0 else f"{f.name}-{n + 1}.png")
    write_bytes_atomic(f.png, path)
    return path


def render_md(doc: Document, figures_dir: Path) -> tuple[str, tuple[Path, ...]]:
    """Markdown text and the figure files written (``figures_dir`` is created)."""
    figures_dir = Path(figures_dir)
    figures_dir.mkdir(parents=True, exist_ok=True)
    out = [f"# {doc.title}", "", doc.subtitle, ""]
    written: list[Path] = []
    used: dict[str, int] = {}

    def block(b: Block) -> str:
        if isinstance(b, Paragraph):
            return b.text
        if isinstance(b, Note):
            return f"> {NOTE_PREFIX.get(b.kind, '')}{b.text}"
        if isinstance(b, Heading):
            return f"### {b.text}"
        if isinstance(b, Table):
            return _table(b)
        if isinstance(b, Figure):
            path = _write_figure(b, figures_dir, used)
            written.append(path)
            return f"![{b.alt}]({figures_dir.name}/{path.name})\n\n*{b.caption}*"
        raise TypeError(f"unknown report block {type(b).__name__}")

    for s in doc.sections:
        out += [f"## {s.title}", ""]
        for b in s.blocks:
            out += [block(b), ""]
    return "\n".join(out), tuple(written)
