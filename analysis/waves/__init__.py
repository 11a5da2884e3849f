"""Two waves of one campaign compared per model: did the answer distribution change?

* ``options``   — the comparison's choices (alpha, permutations, bootstrap replicates, seed);
* ``mmd``       — one model's test: node-set Jaccard kernel MMD, within-prompt permutation
  p-value, the Jaccard effect with its bootstrap interval (:class:`mmd.WaveRuns` in);
* ``fdr``       — Benjamini–Hochberg q-values across models;
* ``availability`` — each model's availability status around the two waves;
* ``served``    — what the provider said it served, per model and wave, and its display text;
* ``compare``   — a runs table → :class:`compare.WaveComparison` (every campaign and model), and
  its JSON form;
* ``pairs``     — which two waves of a campaign are compared, and one pair's comparison with the
  unfinished-wave check and availability (what ``irbench waves`` and the viewer both show).
"""

__all__ = ["availability", "compare", "fdr", "mmd", "options", "pairs", "served"]
