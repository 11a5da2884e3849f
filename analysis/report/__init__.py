"""The dated report: a document tree (doc), its sections and tables, plots, provenance,
renderers (HTML, Markdown, terminal), and ``build`` which assembles it from analysis outputs."""

__all__ = ["build", "doc", "health", "html", "md", "overtime", "plots", "provenance", "sections", "spend", "tables",
           "terminal"]
