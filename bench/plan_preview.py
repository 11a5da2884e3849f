"""How long ``irbench plan`` takes for a 10M-run campaign: 50 models x 20,000 prompts x 10 runs,
the prompts in a generated corpus, an empty store. Prints the seconds of each step.

    python bench/plan_preview.py [--models 50] [--prompts 20000] [--runs 10]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from orchestrator.campaign.corpus import load_corpus
from orchestrator.campaign.instruction import load_instruction
from orchestrator.campaign.preview import preview_plan
from orchestrator.campaign.spec import load_campaign
from storage.runs import RunStore


def _write(root: Path, models: int, prompts: int, runs: int) -> Path:
    folder = root / "prompts"
    folder.mkdir()
    for i in range(prompts):
        (folder / f"p{i:05d}.txt").write_text(f"Prompt {i}: list the steps, then answer in JSON. " * 8 + "\n")
    body = "".join(f"[models.m{j:02d}]\nrequests_per_minute = 600\ninput_usd_per_mtok = 0.5\n"
                   f"output_usd_per_mtok = 1.5\nmax_tokens = 2000\n" for j in range(models))
    path = root / "big.toml"
    path.write_text(f'name = "big"\nruns = {runs}\n[corpus]\npaths = ["prompts"]\n'
                    f'[endpoints.s]\nbase_url = "http://127.0.0.1:9"\n{body}')
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=50)
    ap.add_argument("--prompts", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), args.models, args.prompts, args.runs)
        t0 = time.perf_counter()
        spec = load_campaign(path)
        corpus = load_corpus(spec.corpus, spec.base_dir)
        t1 = time.perf_counter()
        preview = preview_plan(spec, corpus, load_instruction(spec.instruction), RunStore(Path(tmp) / "data"))
        t2 = time.perf_counter()
    print(f"planned runs: {preview.total.planned:,}; prompt tokens: {preview.total.prompt_tokens_planned:,}; "
          f"cost: ${preview.total.cost_usd_min:,.0f}-${preview.total.cost_usd_max:,.0f}")
    print(f"load spec + corpus: {t1 - t0:.2f} s; preview: {t2 - t1:.2f} s; total: {t2 - t0:.2f} s")


if __name__ == "__main__":
    main()
