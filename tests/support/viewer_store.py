"""A small, hand-built run store for the viewer's tests, and the real ``irbench view`` process.

The store (campaign "cam", panel "pan", 3 models × 4 prompts × 3 runs, 36 runs; one model's
name contains "/" and one contains characters that need URL escaping) has known answers:

* prompt 0 of every model: run 0 is the base IR, run 1 drops a node (count drift), run 2
  renames one id at the same range (id-label drift, a rename);
* prompt 1: run 1 changes one node's ``meta.priority`` (metadata drift), run 2 only its label;
* prompt 2 of model 0: hostile answers — ``<script>`` and ``<img onerror>`` in the response,
  reasoning and an IR label; the run is also truncated after a 429 with Retry-After 3 s;
* prompt 3 of model 1: run 2 times out (no IR) after two 429 answers (Retry-After 1.5 s each).

Measurement dates: run r of prompt p is measured on 2026-11-(1 + p).

Prompt texts (``DATA/prompts/``) are stored for prompts 0-2, not 3: prompt 0's is longer than a
page shows (28,000 characters), prompt 1's holds
:data:`PROMPT_ONLY_WORD` (in no response), prompt 2's holds :data:`HOSTILE_SCRIPT`, and every
message sent is the instruction :data:`INSTRUCTION_HEAD` followed by the prompt.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from storage.prompts import PromptStore, PromptText
from storage.records import Attempt, Outcome, ParseOutcome, RunRecord
from storage.runs import RunStore
from tests.support.cli import run_cli
from tests.support import forked

MODELS = ("org/model-a", "model b&c?", "model-c")
HOSTILE_SCRIPT = "<script>window.__pwned='script'</script>"
HOSTILE_IMG = "<img src=x onerror=\"window.__pwned='img'\">"
PROMPT_ONLY_WORD = "quokkaflange"
INSTRUCTION_HEAD = "Emit the IR of the prompt below as JSON."
INSTRUCTION_SHA = "0" * 64


def prompt_text_of(prompt: int) -> str:
    """The corpus text of prompt ``prompt`` (0-3; only 0-2 are stored)."""
    extra = {0: "a long prompt line\n" * 1500 + "THE LAST LINE OF PROMPT 0\n",
             1: f"// @rule RULE:b mentions {PROMPT_ONLY_WORD} once\n",
             2: f"{HOSTILE_SCRIPT}\n{HOSTILE_IMG}\n"}.get(prompt, "")
    return f"You are prompt {prompt}.\n{extra}{{% if user %}}Hello {{{{ user }}}}{{% endif %}}\n"


def message_of(prompt: int) -> str:
    return (f"{INSTRUCTION_HEAD}\n--- BEGIN PROMPT ---\n{prompt_text_of(prompt).rstrip()}\n"
            "--- END PROMPT ---\n")


def sha_of(prompt: int) -> str:
    return hashlib.sha256(f"viewer-test-prompt-{prompt}".encode()).hexdigest()


def _node(nid: str, line: int, *, priority: int = 1, label: str | None = None,
          kind: str = "Rule") -> dict:
    return {"id": nid, "kind": kind, "label": label or f"label of {nid}",
            "meta": {"category": "policy", "priority": priority, "inferred": False,
                     "triggers": []},
            "range": {"start_line": line, "start_col": 0, "end_line": line, "end_col": 10}}


def base_nodes() -> list[dict]:
    return [_node("RULE:a", 1), _node("RULE:b", 2), _node("COND:c", 3, kind="Condition")]


def ir_for(model: int, prompt: int, run: int) -> list[dict] | None:
    """The nodes of one run (None: the run failed)."""
    nodes = base_nodes()
    if prompt == 0 and run == 1:
        return nodes[:2]
    if prompt == 0 and run == 2:
        return [nodes[0], _node("RULE:b_renamed", 2), nodes[2]]
    if prompt == 1 and run == 1:
        return [nodes[0], _node("RULE:b", 2, priority=3), nodes[2]]
    if prompt == 1 and run == 2:
        return [nodes[0], _node("RULE:b", 2, label="another label"), nodes[2]]
    if prompt == 2 and model == 0:
        return [_node("RULE:a", 1, label=HOSTILE_IMG), nodes[1], nodes[2]]
    if prompt == 3 and model == 1 and run == 2:
        return None
    return nodes


def run_id_of(model: int, prompt: int, run: int) -> str:
    return hashlib.sha256(f"{model}/{prompt}/{run}".encode()).hexdigest()[:32]


def build_records() -> list[RunRecord]:
    out = []
    for m, model in enumerate(MODELS):
        for p in range(4):
            for r in range(3):
                at = dt.datetime(2026, 11, 1 + p, 9, m, r, tzinfo=dt.UTC)
                nodes = ir_for(m, p, r)
                attempts: list[Attempt] = []
                outcome, finish, reasoning = Outcome.OK, "stop", f"thinking about prompt {p}"
                if p == 2 and m == 0:
                    attempts.append(Attempt(attempt=1, outcome=Outcome.RATE_LIMITED,
                                            started_at=at, latency_ms=5.0, status_code=429,
                                            retry_after_s=3.0))
                    outcome, finish = Outcome.TRUNCATED, "length"
                    reasoning = f"{HOSTILE_SCRIPT} and {HOSTILE_IMG}"
                if nodes is None:
                    for k in range(2):
                        attempts.append(Attempt(attempt=k + 1, outcome=Outcome.RATE_LIMITED,
                                                started_at=at, latency_ms=4.0, status_code=429,
                                                retry_after_s=1.5))
                    outcome, finish = Outcome.TIMEOUT_READ, None
                latency = 100.0 * (m + 1) + 10.0 * p + r
                attempts.append(Attempt(attempt=len(attempts) + 1, outcome=outcome,
                                        started_at=at, latency_ms=latency,
                                        status_code=None if nodes is None else 200))
                ir = (json.dumps({"version": 1, "nodes": nodes}, sort_keys=True,
                                 separators=(",", ":")) if nodes is not None else None)
                text = json.dumps({"version": 1, "nodes": nodes}, indent=1) if nodes else ""
                if p == 2 and m == 0:
                    text = f"{HOSTILE_SCRIPT}\n{HOSTILE_IMG}\n{text}"
                ids = sorted({n["id"] for n in nodes or []})
                out.append(RunRecord(
                    run_id=run_id_of(m, p, r), campaign="cam", panel="pan",
                    prompt_sha256=sha_of(p), prompt_name=f"prompt{p}.rtpl", model=model,
                    endpoint="sim", wire_format="openai", run_index=r,
                    instruction_version="v1", instruction_sha256=INSTRUCTION_SHA, measured_at=at,
                    measurement_date=at.date(), outcome=outcome, attempts=attempts,
                    latency_ms=latency, finish_reason=finish, response_text=text,
                    reasoning_text=reasoning, answer_chars=len(text),
                    reasoning_chars=len(reasoning), prompt_tokens=100, completion_tokens=50 + r,
                    parse_outcome=ParseOutcome.OK if ir else ParseOutcome.NOT_ATTEMPTED,
                    ir_json=ir, node_ids=ids, node_count=len(nodes or [])))
    return out


def write_store(data: Path) -> list[RunRecord]:
    records = build_records()
    RunStore(data, fsync=False).write(records)
    PromptStore(data, fsync=False).add(
        PromptText(sha_of(p), f"prompt{p}.rtpl", INSTRUCTION_SHA, "v1", prompt_text_of(p),
                   message_of(p)) for p in range(3))
    return records


def analyze(data: Path, out: Path) -> None:
    """The real ``irbench analyze`` (few replicates) over the store."""
    proc = run_cli(["analyze", "--data", str(data), "--out", str(out), "--replicates", "200"], timeout_s=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


@dataclass
class ViewerProcess:
    """A running ``irbench view`` child process and its base URL."""

    proc: subprocess.Popen
    url: str

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=20)


def report(data: Path, analysis: Path, out: Path) -> None:
    """The real ``irbench report`` of the store and its analysis."""
    proc = run_cli(["report", "--data", str(data), "--analysis", str(analysis), "--out", str(out)], timeout_s=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def start_viewer(data: Path, analysis: Path | None = None, report_dir: Path | None = None,
                 timeout_s: float = 120) -> ViewerProcess:
    """Start the real CLI on a free port (``--port 0``) and wait for its "serving" line."""
    args = [sys.executable, "-m", "orchestrator.cli.app", "view", "--data", str(data), "--port", "0"]
    if analysis is not None:
        args += ["--analysis", str(analysis)]
    if report_dir is not None:
        args += ["--report", str(report_dir)]
    proc = forked.popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in proc.stdout:  # type: ignore[union-attr]
        seen.append(line)
        m = re.search(r"serving (http://[0-9.:]+)/", line)
        if m:  # keep draining, so later output can never block the server on a full pipe
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # type: ignore[union-attr]
            return ViewerProcess(proc, m.group(1))
    proc.wait(timeout=timeout_s)
    raise AssertionError(f"irbench view exited {proc.returncode}: {''.join(seen)[-2000:]}")
