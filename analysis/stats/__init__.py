"""Statistics over the model × prompt panel: bootstrap intervals, joint-bootstrap ranks and
rank sets, paired within-family comparisons, stability-versus-correctness correlations."""

__all__ = ["bootstrap", "correlations", "draws", "paired", "pairs", "ranks", "shared_stream"]
