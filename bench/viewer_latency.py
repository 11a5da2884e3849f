"""Server time of every ``irbench view`` page and API call on a large synthetic store.

Writes a store of ``--models × --prompts × --runs`` synthetic runs (default 20 × 500 × 10 =
100,000) with :class:`storage.runs.RunStore`'s batch writer — IR JSON answers of ~8 nodes whose
ids, counts and metadata drift, reasoning text on a third, retries with 429/Retry-After, a
mix of failure outcomes, spread over ``--days`` measurement dates — the prompts' texts and
messages (``DATA/prompts/``, ~4 KB each, as a campaign records them) and a matching synthetic
analysis output (cells and model tables). Then starts the real ``irbench view`` in a child
process on a free loopback port, requests each URL kind ``--repeat`` times over HTTP and prints
per kind the server time (the app's ``Server-Timing`` header, ms: p50/p95/max) and the client
wall time, the load average, the startup (index load) time and the server's resident memory.

Usage: python bench/viewer_latency.py [--models 20] [--prompts 500] [--runs 10] [--days 10]
       [--repeat 20] [--data DIR (reuse/keep the store there)]
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from storage.prompts import PromptStore, PromptText
from storage.records import Attempt, Outcome, ParseOutcome, RunRecord
from storage.runs import RunStore

KINDS = ("Rule", "Condition", "Breakpoint", "Directive", "Section")
WORDS = ("placeholder", "budget", "locale", "tone", "escalate", "refund", "summary", "privacy")
FAIL_OUTCOMES = (Outcome.TIMEOUT_READ, Outcome.SERVER_ERROR, Outcome.TRUNCATED,
                 Outcome.RATE_LIMITED)


def _ir(rng: random.Random, prompt: int, stability: float) -> str:
    """An IR document whose nodes drift more as ``stability`` falls."""
    nodes = []
    for k in range(8):
        if rng.random() > stability and rng.random() < 0.3:
            continue  # dropped node: count drift
        nid = f"RULE:{WORDS[(prompt + k) % len(WORDS)]}_{k}"
        if rng.random() > stability and rng.random() < 0.2:
            nid = nid.lower()  # renamed id: id-label drift
        prio = k % 3 + 1 if rng.random() < stability + 0.5 else (k + 1) % 3 + 1
        nodes.append({"id": nid, "kind": KINDS[k % len(KINDS)], "label": f"{WORDS[k]} rule {k}",
                      "meta": {"category": "policy", "priority": prio, "inferred": k > 5,
                               "triggers": [WORDS[(k + 3) % len(WORDS)]]},
                      "range": {"start_line": 2 * k + 1, "start_col": 0,
                                "end_line": 2 * k + 2, "end_col": 40}})
    return json.dumps({"version": 1, "uri": f"prompt-{prompt}", "nodes": nodes},
                      sort_keys=True, separators=(",", ":"))


def synthetic_records(models: int, prompts: int, runs: int, days: int, seed: int,
                      model_slice: range) -> list[RunRecord]:
    """Records of the models in ``model_slice`` (deterministic for a seed)."""
    rng = random.Random(seed * 7919 + model_slice.start)
    start = dt.datetime(2026, 11, 1, 8, 0, tzinfo=dt.UTC)
    out = []
    for m in model_slice:
        model = f"org/model-{m:02d}"  # a "/" in the name, as hosted models have
        stability = 0.97 - 0.5 * m / max(1, models - 1)
        for p in range(prompts):
            sha = hashlib.sha256(f"prompt-{p}".encode()).hexdigest()
            for r in range(runs):
                at = start + dt.timedelta(days=(p + r) % days, seconds=rng.randrange(36000))
                retries = 1 if rng.random() < 0.05 else 0
                attempts = [Attempt(attempt=1, outcome=Outcome.RATE_LIMITED, started_at=at,
                                    latency_ms=12.0, status_code=429, retry_after_s=2.0)] * retries
                fail = rng.random() < 0.04
                outcome = rng.choice(FAIL_OUTCOMES) if fail else Outcome.OK
                latency = rng.lognormvariate(7.0, 0.5)
                attempts.append(Attempt(attempt=retries + 1, outcome=outcome, started_at=at,
                                        latency_ms=latency, status_code=None if fail else 200,
                                        bytes_received=2000))
                ir = None if fail else _ir(rng, p, stability)
                text = ir if ir else ""
                reasoning = (f"Considering the {WORDS[p % 8]} clause of prompt {p}. " * 20
                             if r % 3 == 0 else None)
                ids = sorted({n["id"] for n in json.loads(ir)["nodes"]}) if ir else []
                out.append(RunRecord(
                    run_id=hashlib.sha256(f"{m}/{p}/{r}".encode()).hexdigest()[:32],
                    campaign="bench", panel="bench", prompt_sha256=sha,
                    prompt_name=f"p{p:04d}.prompt.rtpl", model=model, endpoint="sim",
                    wire_format="openai", run_index=r, instruction_version="irbench-v1",
                    instruction_sha256="0" * 64, measured_at=at, measurement_date=at.date(),
                    outcome=outcome, attempts=attempts, latency_ms=latency,
                    status_code=None if fail else 200,
                    finish_reason="length" if outcome == Outcome.TRUNCATED else "stop",
                    response_text=text, reasoning_text=reasoning, answer_chars=len(text),
                    reasoning_chars=len(reasoning or ""), prompt_tokens=900,
                    completion_tokens=len(text) // 4, reasoning_tokens=len(reasoning or "") // 4,
                    parse_outcome=ParseOutcome.OK if ir else ParseOutcome.NOT_ATTEMPTED,
                    ir_json=ir, node_ids=ids, node_count=len(ids)))
    return out


def write_store(data: Path, models: int, prompts: int, runs: int, days: int, seed: int) -> float:
    """Write the synthetic store (one batch per model); returns seconds taken."""
    started = time.perf_counter()
    store = RunStore(data, fsync=False)
    for m in range(models):
        store.write(synthetic_records(models, prompts, runs, days, seed, range(m, m + 1)))
    return time.perf_counter() - started


def prompt_text(p: int) -> str:
    """Prompt ``p``'s text (~4 KB): only prompt p says ``clause<p>zz``, a word in no answer."""
    body = "".join(f"// @rule RULE:{WORDS[(p + k) % len(WORDS)]}_{k} priority={k % 3 + 1}\n"
                   f"When the {WORDS[k]} matters, say so in one sentence.\n" for k in range(8))
    return f"# prompt {p}: clause{p}zz\n" + body * 8


def write_prompts(data: Path, prompts: int) -> None:
    """The store's ``prompts/`` rows for every prompt (a no-op when they are there)."""
    PromptStore(data, fsync=False).add(
        PromptText(hashlib.sha256(f"prompt-{p}".encode()).hexdigest(), f"p{p:04d}.prompt.rtpl",
                   "0" * 64, "irbench-v1", prompt_text(p),
                   f"Emit the IR.\n--- BEGIN PROMPT ---\n{prompt_text(p)}--- END PROMPT ---\n")
        for p in range(prompts))


def write_analysis(out: Path, models: int, prompts: int, seed: int) -> None:
    """A synthetic ``irbench analyze`` output for panel "bench" (cells and model table)."""
    rng = np.random.default_rng(seed)
    pdir = out / "bench"
    pdir.mkdir(parents=True, exist_ok=True)
    names = [f"org/model-{m:02d}" for m in range(models)]
    jac = np.clip(np.linspace(0.95, 0.45, models)[:, None] + rng.normal(0, 0.1, (models, prompts)),
                  0, 1)
    mi, pj = np.divmod(np.arange(models * prompts), prompts)
    pq.write_table(pa.table({
        "panel": ["bench"] * len(mi), "campaign": ["bench"] * len(mi),
        "model": [names[i] for i in mi],
        "prompt_sha256": [hashlib.sha256(f"prompt-{p}".encode()).hexdigest() for p in pj],
        "included": np.ones(len(mi), bool), "mean_jaccard": jac[mi, pj],
        "id_stability": jac[mi, pj] * 0.9, "node_set_perfect": jac[mi, pj] > 0.99,
        "mean_nodes": np.full(len(mi), 8.0)}), pdir / "cells.parquet")
    means = jac.mean(axis=1)
    order = np.argsort(-means)
    pq.write_table(pa.table({
        "rank": np.arange(1, models + 1), "model": [names[i] for i in order],
        "n_prompts": np.full(models, prompts), "mean_jaccard": means[order],
        "id_stability": means[order] * 0.9, "perfect": np.zeros(models, np.int64),
        "jaccard_ci_low": means[order] - 0.02, "jaccard_ci_high": means[order] + 0.02,
        "rank_set_low": np.maximum(1, np.arange(models)), "rank_set_high":
        np.minimum(models, np.arange(2, models + 2)),
        "partition": ["undetermined"] * models}), pdir / "models.parquet")
    (pdir / "manifest.json").write_text(json.dumps({"panel": "bench", "seed": seed}))


def start_viewer(data: Path, analysis: Path) -> tuple[subprocess.Popen, str, float]:
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.app", "view", "--data", str(data),
                             "--analysis", str(analysis), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:  # type: ignore[union-attr]
        print("  viewer:", line.rstrip())
        m = re.search(r"serving (http://[0-9.:]+/)", line)
        if m:
            return proc, m.group(1).rstrip("/"), time.perf_counter() - started
    raise SystemExit(f"viewer exited with {proc.wait()}")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--models", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=500)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--days", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--data", type=Path, default=None)
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="viewer-bench-")
    root = args.data or Path(tmp.name)
    data, analysis = root / "data", root / "out"
    n = args.models * args.prompts * args.runs
    if not (data / "runs").is_dir():
        secs = write_store(data, args.models, args.prompts, args.runs, args.days, args.seed)
        print(f"wrote {n} runs in {secs:.1f} s to {data}")
    write_prompts(data, args.prompts)
    write_analysis(analysis, args.models, args.prompts, args.seed)
    proc, base, startup = start_viewer(data, analysis)
    rng = random.Random(args.seed)
    try:
        client = httpx.Client(base_url=base, timeout=60)
        some = client.get("/api/runs", params={"limit": 500, "offset": n // 2}).json()["runs"]
        model = some[0]["model"]

        def cell_of(r: dict) -> str:
            return f"{quote(r['campaign'], safe='')}/{quote(r['model'], safe='')}/{r['prompt_sha256']}"

        kinds = {
            "home /": lambda: "/",
            "leaderboard /panels/bench": lambda: "/panels/bench",
            "model cells": lambda: f"/models/bench/{quote(model, safe='')}",
            "cell + diff": lambda: "/cells/" + cell_of(rng.choice(some)),
            "run": lambda: "/runs/" + rng.choice(some)["run_id"],
            "runs list, filtered": lambda: f"/runs?model={quote(model)}&outcome=ok",
            "runs list, deep page": lambda: f"/runs?offset={rng.randrange(n - 50)}",
            "runs search q=": lambda: f"/runs?q={rng.choice(WORDS)}_{rng.randrange(8)}",
            "runs search, prompt-only word": lambda: f"/runs?q=clause{rng.randrange(args.prompts)}zz",
            "text/prompt (whole)": lambda: "/text/prompt/" + rng.choice(some)["run_id"],
            "health by model": lambda: "/health",
            "health by date": lambda: "/health?by=date",
            "api/runs date range": lambda: "/api/runs?date_from=2026-11-03&date_to=2026-11-05"
                                           "&limit=500",
            "api/cells (45 pairs)": lambda: "/api/cells/" + cell_of(rng.choice(some)),
            "api/health": lambda: "/api/health?by=date",
        }
        print(f"\n{n} runs; viewer startup (load + index) {startup:.1f} s; server RSS "
              f"{rss_mib(proc.pid):.0f} MiB; load average {os.getloadavg()[0]:.2f}")
        print(f"{'request':28s} {'server p50':>10s} {'p95':>7s} {'max':>7s} {'client p50':>10s} "
              f"{'bytes':>8s}   (ms, {args.repeat} requests each)")
        worst = 0.0
        for name, make in kinds.items():
            server, wall, size = [], [], 0
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                resp = client.get(make())
                wall.append((time.perf_counter() - t0) * 1e3)
                resp.raise_for_status()
                server.append(float(resp.headers["server-timing"].split("dur=")[1]))
                size = max(size, len(resp.content))
            s = np.percentile(server, [50, 95, 100])
            worst = max(worst, s[2])
            print(f"{name:28s} {s[0]:10.1f} {s[1]:7.1f} {s[2]:7.1f} "
                  f"{np.percentile(wall, 50):10.1f} {size:8d}")
        print(f"\nworst server time {worst:.1f} ms (target ≤ 500 ms); load average "
              f"{os.getloadavg()[0]:.2f}; server RSS {rss_mib(proc.pid):.0f} MiB")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        tmp.cleanup()


if __name__ == "__main__":
    main()
