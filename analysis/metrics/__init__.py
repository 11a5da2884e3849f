"""Per-cell and per-run measures: id-set agreement (Jaccard, id-stability, counts), drift
classes, correctness against annotations, stabilisation (reruns needed)."""

__all__ = ["agreement", "correctness", "drift", "stabilisation"]
