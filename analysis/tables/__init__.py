"""Tables built from runs: cells, imported measurements and their merge, model tables,
families and pairs, sensitivity, timeouts, probes, and the per-panel audit tables."""

__all__ = ["audit", "cells", "families", "intervals", "measurements", "merge", "models", "part_summaries", "partial", "probes", "sensitivity", "timeouts"]
