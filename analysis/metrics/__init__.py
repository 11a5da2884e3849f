"""Per-cell and per-run measures: id-set agreement (Jaccard, id-stability, counts; ``batch``
computes them for all cells at once), drift classes, correctness against annotations,
stabilisation (reruns needed)."""

__all__ = ["agreement", "batch", "correctness", "drift", "stabilisation"]
