"""Synthetic run stores for the analysis benchmarks (20k and 100k runs in seconds).

Writes :class:`storage.records.RunRecord` rows straight through the store's batch writer
(``RunStore.write`` of ``batch_runs`` records → one ``batch-<uuid>.parquet`` per call, as the
batched worker writes do), without going through HTTP: the point is the analysis of a store of
that size, not the campaign. Each run's IR comes from the simulator's own generator
(:func:`simulator.model.simulate_ir`, seeded per run) on the annotated example prompts, so ids,
drift classes, correctness against annotations and node counts are what a real simulated
campaign stores; ``response_text`` holds the rendered answer (fenced/prose like the simulator's)
so the files carry realistic text columns. Models are graded from steady to chaotic.

Usage: python bench/run_store.py OUT_DIR --models 50 --prompts 80 --runs 5 [--batch-runs 1000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import time
from pathlib import Path

import numpy as np

DEFAULT_PROMPTS_DIR = Path(__file__).resolve().parents[1] / "examples" / "prompts"


def write_run_store(data_dir: Path, *, models: int, prompts: int, runs: int,
                    batch_runs: int = 1000, seed: int = 1,
                    prompts_dir: Path = DEFAULT_PROMPTS_DIR) -> int:
    """Write ``models × prompts × runs`` successful runs (campaign ``bench``, panel ``bench``)
    under ``data_dir``; returns the number of runs written. Prompt ``i`` reuses the annotations
    of example prompt ``i mod 12`` under its own name and sha256 (the analysis keys on those)."""
    from storage.annotations import parse_annotations
    from simulator.config import SimModel
    from simulator.model import inferred_pool, render_answer, simulate_ir
    from storage.ir import IRDocument
    from storage.records import Attempt, Outcome, ParseOutcome, RunRecord
    from storage.runs import RunStore

    files = sorted(Path(prompts_dir).glob("*.prompt.rtpl"))
    truths = [parse_annotations(f.read_text(encoding="utf-8")) for f in files]
    store = RunStore(Path(data_dir), fsync=False)
    started = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
    instr = hashlib.sha256(b"bench-instruction").hexdigest()
    batch: list[RunRecord] = []
    written = 0
    for j in range(models):
        g = j / max(models - 1, 1)  # 0 = steady … 1 = chaotic
        params = SimModel(drop_prob=0.3 * g, rename_prob=0.2 * g, add_rate=1.5 * g,
                          metadata_prob=0.3 * g, fence_prob=0.5, prose_prob=0.3 * g)
        name = f"fam{j // 5:02d}:{(j % 5 + 1) * 7}b"  # families of five sizes, as real line-ups
        for i in range(prompts):
            truth = truths[i % len(truths)]
            pname = f"p{i:05d}.prompt.rtpl"
            sha = hashlib.sha256(f"prompt {i}".encode()).hexdigest()
            pool = inferred_pool(truth, pname, params)
            for r in range(runs):
                rng = np.random.default_rng([seed, j, i, r])
                ir = IRDocument.model_validate(simulate_ir(truth, pname, params, rng, pool=pool))
                ids = sorted({n.id for n in ir.nodes})
                at = started + dt.timedelta(seconds=(j * prompts + i) * runs + r)
                latency = float(20 + 200 * rng.random())
                run_id = hashlib.sha256(f"{name}|{sha}|{r}".encode()).hexdigest()[:32]
                batch.append(RunRecord(
                    run_id=run_id, campaign="bench", panel="bench", prompt_sha256=sha,
                    prompt_name=pname, model=name, endpoint="sim", wire_format="openai",
                    run_index=r, instruction_version="bench", instruction_sha256=instr,
                    measured_at=at, measurement_date=at.date(), date_is_window=False,
                    outcome=Outcome.OK, latency_ms=latency, status_code=200,
                    total_timeout_s=60.0, finish_reason="stop",
                    attempts=[Attempt(attempt=1, outcome=Outcome.OK, started_at=at,
                                      latency_ms=latency, status_code=200)],
                    response_text=render_answer(ir.model_dump(mode="json"), params, rng),
                    parse_outcome=ParseOutcome.OK, ir_json=ir.canonical_json(), node_ids=ids,
                    node_count=len(ir.nodes)))
                if len(batch) >= batch_runs:
                    written += store.write(batch)
                    batch = []
    if batch:
        written += store.write(batch)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--models", type=int, default=50)
    ap.add_argument("--prompts", type=int, default=80)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--batch-runs", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    t0 = time.perf_counter()
    n = write_run_store(args.out, models=args.models, prompts=args.prompts, runs=args.runs,
                        batch_runs=args.batch_runs, seed=args.seed)
    print(f"{n} runs written under {args.out} in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
