"""Run store → tables, statistics and the dated report.

Where things live (each room's ``__init__`` says more):

* ``pipeline``  — ``irbench analyze``: ``inputs`` reads the store, the pipeline builds each
  panel's tables, ``outputs`` writes them (files on disk, manifest); ``progress`` names the
  stages a front end may show; ``errors`` is the analysis error tree;
* ``options``   — every analysis choice, with its unit and default;
* ``metrics/``  — per-cell and per-run measures (Jaccard, id-stability, drift, correctness,
  stabilisation);
* ``stats/``    — bootstrap intervals, ranks and rank sets, paired comparisons, correlations;
* ``tables/``   — cells, imported measurements and merge rules, model tables, families,
  sensitivity, timeouts, probes, the per-panel audit;
* ``report/``   — the Markdown/HTML report built from the analysis outputs;
* ``waves/``    — two measurement waves compared per model (permutation test, effect, BH).
"""

__all__ = ["errors", "inputs", "memory", "metrics", "options", "outputs", "pipeline", "progress", "report",
           "stats", "tables", "waves"]
