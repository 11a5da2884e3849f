"""Statistics over the model × prompt panel: bootstrap intervals (percentile, BCa, and the
small-sample studentized and double bootstrap, the betting intervals for bounded means), their simulated coverage, joint-bootstrap ranks
and rank sets, paired within-family comparisons, stability-versus-correctness correlations."""

__all__ = ["betting", "bootstrap", "correlations", "coverage", "draws", "mean_intervals", "paired", "pairs",
           "ranks", "shared_stream", "small_sample"]
