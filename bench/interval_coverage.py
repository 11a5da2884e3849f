"""Coverage of each mean-interval method, and of the rank sets, at the study's sample sizes.

Sources of per-prompt cell scores (Jaccard, [0, 1]):
* ``sim``: the study-like simulated models of :data:`analysis.stats.coverage.STUDY_MODELS`
  (cells of 2–5 runs, mass at 1, skewed), truth = Monte-Carlo mean;
* ``artifact``: each model of the artifact's annotated panel with at least 12 cells
  (highest-budget-first cells of the campaign CSVs); its own cells are the population, samples
  of n are drawn from them with replacement, truth = their mean;
* ``shapes``: held-out bounded shapes none of the methods was chosen on (Beta(2, 5),
  Beta(0.5, 0.5), Beta(0.3, 0.1), Bernoulli(0.1) and (0.9), a two-point 0.25 / 0.9 mix with
  a fifth at 0.9), truth in closed form.
For n in --sizes and each method: the coverage over --datasets samples per model, printed per
source as min / mean over models, plus the median width. With --ranks: panels of the simulated
models (each model's cells independent, 20 % of cells missing; a "separated" design of the four
models and a "tied" one of three exactly tied pairs), the family-wise coverage of the
simultaneous rank set (all true ranks inside at once) and the marginal rank interval's
coverage per model and for all models at once.

Usage: python bench/interval_coverage.py [--sizes 5,8,12,22] [--datasets 1000]
       [--replicates 1000] [--inner 200] [--methods percentile,...,calibrated_betting]
       [--ranks 400] [--artifact DIR] [--sources sim,artifact,shapes] [--per-model]
       [--markdown] [--threshold-scales '0.5,0.65,0.8,1,n/(n+2)']
With --threshold-scales: instead of the table, the calibrated betting interval with its
threshold scaled (min / mean / max coverage over models), the evidence for docs/intervals.md's
"where it falls short". ``--sources fresh``: a second held-out set of eight bounded shapes
(Beta(5, 1), (1, 1), (1, 4), a zero-one-inflated Beta, a three-point law, Bernoulli(0.5) and
(0.97), a 0.05 / 0.6 mix), for checking a choice made on the other sources.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
import time
import tomllib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.stats.coverage import (  # noqa: E402
    STUDY_MODELS,
    CellFit,
    simulate_cells,
    simulated_coverage,
    true_mean,
)
from analysis.stats.mean_intervals import METHODS, betting_with_bounds, endpoints  # noqa: E402
from analysis.stats.small_sample import Resampling  # noqa: E402
from bench.reference import load_average  # noqa: E402

ARTIFACT = ROOT.parent / "shared" / "paper-artifact"


def artifact_cells(root: Path, min_cells: int = 12) -> dict[str, np.ndarray]:
    """{model: mean_jaccard of its highest-budget-first annotated cells} from the CSVs."""
    mapping = tomllib.loads((ROOT / "examples" / "artifact_campaigns.toml").read_text())
    best: dict[tuple[str, str], tuple[tuple[int, int], float]] = {}
    for c in mapping["campaign"]:
        if c.get("panel") != "annotated":
            continue
        rank = (int(c["budget_rank"]), int(c["time_order"]))
        with open(root / "results" / c["file"], newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                key = (row["model"], row["prompt"])
                if key not in best or best[key][0] < rank:
                    best[key] = (rank, float(row["mean_jaccard"]))
    out: dict[str, list[float]] = {}
    for (model, _), (_, value) in best.items():
        out.setdefault(model, []).append(value)
    return {m: np.array(v) for m, v in sorted(out.items()) if len(v) >= min_cells}


def _resampler(pop: np.ndarray):
    def draw(size, rng):
        return pop[rng.integers(0, pop.size, size)]
    return draw


def _sim_draw(model):
    def draw(size, rng):
        return simulate_cells(model, size, rng)
    return draw


def _beta(a: float, b: float):
    def draw(size, rng):
        return rng.beta(a, b, size)
    return draw


def _two_point(p: float, low: float, high: float):
    def draw(size, rng):
        return np.where(rng.random(size) < p, high, low)
    return draw


SHAPES = {"beta(2,5)": (_beta(2, 5), 2 / 7), "beta(.5,.5)": (_beta(0.5, 0.5), 0.5),
          "beta(.3,.1)": (_beta(0.3, 0.1), 0.75), "bernoulli(.1)": (_two_point(0.1, 0, 1), 0.1),
          "bernoulli(.9)": (_two_point(0.9, 0, 1), 0.9),
          "0.25/0.9": (_two_point(0.2, 0.25, 0.9), 0.2 * 0.9 + 0.8 * 0.25)}


def _three_point(size, rng):
    u = rng.random(size)
    return np.where(u < 0.3, 0.1, np.where(u < 0.6, 0.5, 1.0))


_INFLATED = CellFit(0.05, 0.3, 3.0, 2.0)
# a second held-out set, for checking a choice made on the three sources above
FRESH = {"beta(5,1)": (_beta(5, 1), 5 / 6), "beta(1,1)": (_beta(1, 1), 0.5),
         "beta(1,4)": (_beta(1, 4), 0.2), "inflated": (_INFLATED.draw, _INFLATED.mean),
         "0.1/0.5/1": (_three_point, 0.3 * 0.1 + 0.3 * 0.5 + 0.4),
         "bernoulli(.5)": (_two_point(0.5, 0, 1), 0.5),
         "bernoulli(.97)": (_two_point(0.97, 0, 1), 0.97),
         "0.05/0.6": (_two_point(0.1, 0.05, 0.6), 0.1 * 0.6 + 0.9 * 0.05)}


def _width(draw, n: int, method: str, spec: Resampling) -> float:
    x = draw((200, n), np.random.default_rng([spec.seed, n, 1]))
    lo, hi = endpoints(x, method, spec)
    return float(np.median(hi - lo))


def coverage_row(models: dict, sizes: list[int], method: str, spec: Resampling, datasets: int
                 ) -> list[tuple[list[float], float]]:
    """Per n: (coverage of each model, median width over models) of ``method``."""
    out = []
    for n in sizes:
        cov = [simulated_coverage(draw, truth, n, method, spec, datasets)
               for draw, truth in models.values()]
        out.append((cov, float(np.median([_width(d, n, method, spec) for d, _ in models.values()]))))
    return out


def markdown_row(source: str, method: str, row: list[tuple[list[float], float]]) -> str:
    """One row of docs/intervals.md's coverage table: min / mean over models (w median width)."""
    return (f"| {source} | {method} | "
            + " | ".join(f"{min(c):.3f} / {np.mean(c):.3f} (w {w:.2f})" for c, w in row) + " |")


def coverage_table(sources: dict, sizes: list[int], methods: list[str], spec: Resampling,
                   datasets: int, per_model: bool = False, markdown: bool = False) -> None:
    """Print one row per (source, method): min / mean coverage over models at each n (and,
    with ``per_model``, one line per model below it; with ``markdown``, the rows of
    docs/intervals.md's table instead)."""
    if markdown:
        print("| source | method | " + " | ".join(f"n = {n}" for n in sizes) + " |\n|---|---|"
              + "---|" * len(sizes))
    else:
        print(f"{'source':9} {'method':12} " + " ".join(f"{'n=' + str(n):>22}" for n in sizes))
    for source, models in sources.items():
        for method in methods:
            t0 = time.perf_counter()
            row = coverage_row(models, sizes, method, spec, datasets)
            if markdown:
                print(markdown_row(source, method, row), flush=True)
                continue
            cells = [f"{min(c):.3f}/{np.mean(c):.3f} w{w:.2f}" for c, w in row]
            print(f"{source:9} {method:12} " + " ".join(f"{c:>22}" for c in cells)
                  + f"   ({time.perf_counter() - t0:.0f} s)", flush=True)
            for i, name in enumerate(models if per_model else ()):
                print(f"{'':9} {'':12} " + " ".join(f"{c[i]:>22.3f}" for c, _ in row)
                      + f"   {name}")


def scale_of(token: str):
    """n → threshold scale of one --threshold-scales entry: a number, or "n/(n+A)"."""
    m = re.fullmatch(r"n/\(n\+([0-9.]+)\)", token.replace(" ", ""))
    if m:
        a = float(m.group(1))
        return lambda n: n / (n + a)
    value = float(token)
    return lambda n: value


def sweep_row(models: dict, sizes: list[int], scale: float | str, spec: Resampling,
              datasets: int) -> list[list[float]]:
    """Per n: the coverage of each model by the calibrated betting interval with its threshold
    z²/2 multiplied by ``scale`` (a number, or "n/(n+A)"; bets and test; 1 =
    ``calibrated_betting``)."""
    factor = scale_of(str(scale))
    out = []
    for n in sizes:
        def interval(x: np.ndarray, call: Resampling, f: float = factor(n)
                     ) -> tuple[np.ndarray, np.ndarray]:
            return betting_with_bounds(x, call, calibrated=True, threshold_scale=f)
        out.append([simulated_coverage(draw, truth, n, interval, spec, datasets)
                    for draw, truth in models.values()])
    return out


def sweep_line(scale: float | str, source: str, row: list[list[float]]) -> str:
    """One row of docs/intervals.md's sweep table: min / mean / max over models per n."""
    label = f"{scale:g}" if isinstance(scale, float) else scale
    return f"| {label} · z²/2 | {source} | " + " | ".join(
        f"{min(c):.3f} / {np.mean(c):.3f} / {max(c):.3f}" for c in row) + " |"


def threshold_sweep(sources: dict, sizes: list[int], scales: list[str], spec: Resampling,
                    datasets: int) -> None:
    """Print docs/intervals.md's sweep table: per threshold scale and source, min / mean / max
    coverage over models at each n."""
    print("| threshold | source | " + " | ".join(f"n = {n}" for n in sizes) + " |\n|---|---|"
          + "---|" * len(sizes))
    for scale in scales:
        label: float | str = scale if "n" in scale else float(scale)
        for source, models in sources.items():
            print(sweep_line(label, source, sweep_row(models, sizes, scale, spec, datasets)),
                  flush=True)


RANK_DESIGNS = {
    "separated": STUDY_MODELS,
    # exact ties: two models of each kind (true ranks with "min" ties)
    "tied": (STUDY_MODELS[1], STUDY_MODELS[1], STUDY_MODELS[2], STUDY_MODELS[2],
             STUDY_MODELS[3], STUDY_MODELS[3]),
}


def _rank_panel(models, n: int, rng: np.random.Generator) -> np.ndarray:
    """(M, n) cells of the models, 20 % missing, every model keeping its first prompt."""
    s = np.stack([simulate_cells(m, (n,), rng) for m in models])
    keep_first = s[:, 0].copy()
    s[rng.random(s.shape) < 0.2] = np.nan
    s[:, 0] = keep_first
    return s


def rank_coverage(sizes: list[int], panels: int, replicates: int, seed: int) -> None:
    """Per design and n: family-wise coverage of the simultaneous rank set (all true ranks
    inside at once) and the per-model coverage of the marginal rank interval."""
    from analysis.stats.ranks import joint_cluster_bootstrap, min_ranks

    for design, models in RANK_DESIGNS.items():
        truth_rank = min_ranks(np.array([true_mean(m, seed) for m in models]))
        for n in sizes:
            rng = np.random.default_rng([seed, n, len(models)])
            fw, marginal, marginal_all, informative = 0, 0.0, 0, 0
            for _ in range(panels):  # one panel per iteration; each bootstrap is vectorised
                rb = joint_cluster_bootstrap(_rank_panel(models, n, rng), replicates=replicates,
                                             seed=int(rng.integers(2**31)))
                sim, mg = rb.simultaneous, rb.marginal
                fw += bool(np.all((sim.low <= truth_rank) & (truth_rank <= sim.high)))
                informative += bool(np.any(sim.high - sim.low < len(models) - 1))
                inside = (mg.low <= truth_rank) & (truth_rank <= mg.high)
                marginal += float(np.mean(inside))
                marginal_all += bool(np.all(inside))
            print(f"ranks {design} n={n}: simultaneous family-wise {fw / panels:.3f} "
                  f"(informative in {informative / panels:.2f} of panels); marginal per-model "
                  f"{marginal / panels:.3f}, all at once {marginal_all / panels:.3f}", flush=True)


def build_sources(artifact: Path, seed: int, names: list[str]) -> dict[str, dict]:
    """{source: {model: (draw(size, rng), truth)}} for the named sources (module docstring)."""
    out: dict[str, dict] = {}
    if "sim" in names:
        out["sim"] = {m.name: (_sim_draw(m), true_mean(m, seed)) for m in STUDY_MODELS}
    if "artifact" in names:
        out["artifact"] = {m: (_resampler(v), float(v.mean()))
                           for m, v in artifact_cells(artifact).items()}
    if "shapes" in names:
        out["shapes"] = SHAPES
    if "fresh" in names:
        out["fresh"] = FRESH
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="5,8,12,22")
    ap.add_argument("--datasets", type=int, default=1000)
    ap.add_argument("--replicates", type=int, default=1000)
    ap.add_argument("--inner", type=int, default=200)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--ranks", type=int, default=400, help="panels for the rank check; 0 = skip")
    ap.add_argument("--artifact", type=Path, default=ARTIFACT)
    ap.add_argument("--seed", type=int, default=20260601)
    ap.add_argument("--sources", default="sim,artifact,shapes")
    ap.add_argument("--per-model", action="store_true", help="one coverage line per model")
    ap.add_argument("--markdown", action="store_true", help="docs/intervals.md's table rows")
    ap.add_argument("--threshold-scales", default="",
                    help="instead of the table: calibrated_betting's threshold times each of "
                         "these (e.g. '0.5,0.65,0.8,1,n/(n+2)'), min/mean/max "
                         "over models")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    spec = Resampling(replicates=args.replicates, seed=args.seed, inner_replicates=args.inner)
    sources = build_sources(args.artifact, args.seed, args.sources.split(","))
    print(f"coverage at nominal {spec.level}: min/mean over models, median width; "
          f"{args.datasets} datasets, {args.replicates} replicates ({args.inner} inner); "
          "models: " + ", ".join(f"{k} {len(v)}" for k, v in sources.items()), flush=True)
    if args.threshold_scales:
        threshold_sweep(sources, sizes, args.threshold_scales.split(","), spec, args.datasets)
    else:
        coverage_table(sources, sizes, args.methods.split(","), spec, args.datasets,
                       args.per_model, args.markdown)
    if args.ranks:
        rank_coverage(sizes, args.ranks, args.replicates, args.seed)
    print(load_average())


if __name__ == "__main__":
    main()
