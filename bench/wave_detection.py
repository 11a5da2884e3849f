"""Wave comparison (``analysis.waves``) validated with known truth on the simulator, and timed.

* Calibration: an unchanged model (``BASE``), the simulator re-seeded between waves; the share of
  ``--calibration`` comparisons whose p-value is ≤ alpha (one model's p-value, before BH), per
  (prompts, runs) design.
* Power: a revision (``drop_prob`` raised until the expected panel Jaccard is the effect lower,
  :func:`simulator.waves.revision_for_drop`) against the unchanged model, for every effect in
  --effects and prompt count in --prompts at --runs runs per wave; the combined test, plus the
  MMD-only and Jaccard-only p-values of the same permutations at --detail-prompts prompts.
* Speed: ``compare_waves`` on a runs table of --speed-models models × 40 prompts × 5 runs × 2
  waves with 1,000 permutations (best of 3, seconds).

Writes a power plot (matplotlib) to --plot.

Usage: python bench/wave_detection.py [--calibration 1000] [--comparisons 200]
       [--permutations 999] [--effects 0.01,...,0.10] [--prompts 10,20,40,80] [--runs 5] [--detail-prompts 40]
       [--plot out/wave_detection.png] [--speed-models 20] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.waves.compare import compare_waves  # noqa: E402
from analysis.waves.mmd import DrawSettings, WaveRuns, WaveTest, wave_test  # noqa: E402
from analysis.waves.options import WaveOptions  # noqa: E402
from bench.reference import load_average  # noqa: E402
from simulator.config import SimModel  # noqa: E402
from simulator.waves import mean_expected_jaccard, panel_truths, revision_for_drop, simulate_node_sets  # noqa: E402

#: An unchanged model like the study's less stable ones (expected Jaccard ≈ 0.64 at 5 runs).
BASE = SimModel(drop_prob=0.1, rename_prob=0.05, add_rate=0.5)
ALPHA = 0.05


def _tests(truths, b_params: SimModel, runs: int, count: int, permutations: int,
           seed: int) -> list[WaveTest]:
    rng = np.random.default_rng(seed)
    names = [str(p) for p in range(len(truths))]
    out = []
    for i in range(count):
        a = simulate_node_sets(truths, BASE, runs, rng)
        b = simulate_node_sets(truths, b_params, runs, rng)
        out.append(wave_test(WaveRuns.of(names, a, b), DrawSettings(permutations, 200, 0.95,
                                                                      seed * 100_003 + i)))
    return out


def _rate(tests: list[WaveTest], attr: str = "p_value") -> float:
    return float(np.mean([getattr(t, attr) <= ALPHA for t in tests]))


def calibration(args: argparse.Namespace) -> None:
    print(f"\n## Calibration: unchanged model, {args.calibration} comparisons, "
          f"{args.permutations} permutations, alpha {ALPHA} (one model's p-value)\n")
    print("| prompts × runs | flag rate | 95% binomial range for 0.05 | MMD only | Jaccard only | "
          "shared only |")
    print("|---|---|---|---|---|---|")
    lo, hi = (float(x) / args.calibration for x in _binom_range(args.calibration))
    for prompts, runs in ((40, 5), (10, 5), (10, 2), (80, 3)):
        t = _tests(panel_truths(prompts), BASE, runs, args.calibration, args.permutations,
                   args.seed + prompts * 10 + runs)
        print(f"| {prompts} × {runs} | {_rate(t):.3f} | {lo:.3f}–{hi:.3f} | "
              f"{_rate(t, 'p_mmd'):.3f} | {_rate(t, 'p_jaccard'):.3f} | {_rate(t, 'p_shared'):.3f} |",
              flush=True)


def _binom_range(n: int) -> tuple[int, int]:
    from scipy import stats
    lo, hi = stats.binom.interval(0.95, n, ALPHA)
    return int(lo), int(hi)


def power(args: argparse.Namespace) -> dict[int, list[float]]:
    effects = [float(e) for e in args.effects.split(",")]
    prompts = [int(p) for p in args.prompts.split(",")]
    # every panel cycles through the same truth sizes, so one revision serves all prompt counts
    ref = panel_truths(max(prompts))
    base_j = mean_expected_jaccard(BASE, ref, args.runs, 400, 0)
    revisions = [revision_for_drop(BASE, ref, e, args.runs, n_sims=400, seed=0) for e in effects]
    print(f"\n## Power: {args.comparisons} comparisons per cell, {args.runs} runs per wave, "
          f"{args.permutations} permutations, alpha {ALPHA}; base expected Jaccard {base_j:.3f}\n")
    print("| effect (ΔJ) | drop_prob | " + " | ".join(f"{p} prompts" for p in prompts)
          + f" | {args.detail_prompts}: MMD only | {args.detail_prompts}: Jaccard only"
          + f" | {args.detail_prompts}: shared only |")
    print("|---" * (len(prompts) + 5) + "|")
    curve: dict[int, list[float]] = {p: [] for p in prompts}
    for k, (e, rev) in enumerate(zip(effects, revisions)):
        cells, detail = [], "| – | – | – |"
        for p in prompts:
            t = _tests(panel_truths(p), rev, args.runs, args.comparisons, args.permutations,
                       args.seed + 7919 * k + p)
            curve[p].append(_rate(t))
            cells.append(f"{curve[p][-1]:.3f}")
            if p == args.detail_prompts:
                detail = (f"| {_rate(t, 'p_mmd'):.3f} | {_rate(t, 'p_jaccard'):.3f} | "
                          f"{_rate(t, 'p_shared'):.3f} |")
        print(f"| {e:.2f} | {rev.drop_prob:.3f} | " + " | ".join(cells) + " " + detail, flush=True)
    _plot(Path(args.plot), effects, curve, args.runs)
    return curve


def _plot(path: Path, effects: list[float], curve: dict[int, list[float]], runs: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for p, values in curve.items():
        ax.plot(effects, values, marker="o", label=f"{p} prompts")
    ax.axhline(0.9, color="grey", lw=0.8, ls="--")
    ax.axhline(ALPHA, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("drop in expected mean node-set Jaccard")
    ax.set_ylabel(f"share flagged at p ≤ {ALPHA}")
    ax.set_title(f"Wave comparison power, {runs} runs per wave")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"\nplot: {path}")


def _speed_table(models: int, seed: int) -> pa.Table:
    truths = panel_truths(40)
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {k: [] for k in ("campaign", "model", "prompt_sha256", "run_id", "wave",
                                            "parse_outcome", "ir_json", "node_ids", "served_model")}
    for m in range(models):
        for wave in (1, 2):
            for p, runs in enumerate(simulate_node_sets(truths, BASE, 5, rng)):
                for r, ids in enumerate(runs):
                    for k, v in (("campaign", "c"), ("model", f"m{m:02d}"), ("prompt_sha256", f"s{p}"),
                                 ("run_id", f"m{m}-{p}-{r}"), ("wave", wave), ("parse_outcome", "ok"),
                                 ("ir_json", "{}"), ("node_ids", sorted(ids)), ("served_model", "x")):
                        cols[k].append(v)
    return pa.table(cols)


def speed(args: argparse.Namespace) -> None:
    table = _speed_table(args.speed_models, args.seed)
    options = WaveOptions(permutations=1000)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        compare_waves(table, 1, 2, options)
        times.append(time.perf_counter() - t0)
    print(f"\n## Speed\n\ncompare_waves, {args.speed_models} models × 40 prompts × 5 runs × 2 waves "
          f"({table.num_rows} rows), 1,000 permutations, 10,000 bootstrap replicates: best "
          f"{min(times):.2f} s (runs {', '.join(f'{t:.2f}' for t in times)}); {load_average()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibration", type=int, default=1000, help="comparisons per design")
    ap.add_argument("--comparisons", type=int, default=200, help="comparisons per power cell")
    ap.add_argument("--permutations", type=int, default=999)
    ap.add_argument("--effects", default="0.01,0.02,0.03,0.04,0.05,0.06,0.07,0.08,0.09,0.10")
    ap.add_argument("--prompts", default="10,20,40,80")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--detail-prompts", type=int, default=40,
                    help="prompt count whose MMD-only and Jaccard-only power is printed too")
    ap.add_argument("--plot", default=str(ROOT / "out" / "wave_detection.png"))
    ap.add_argument("--speed-models", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip", default="", help="comma list of calibration,power,speed to skip")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    print(load_average())
    if "speed" not in skip:
        speed(args)
    if "calibration" not in skip:
        calibration(args)
    if "power" not in skip:
        power(args)


if __name__ == "__main__":
    main()
