"""The simulated model's behaviour as pure functions of (truth, parameters, RNG).

``simulate_ir`` perturbs the ground truth (the prompt's annotations) into one run's IR;
``render_answer`` turns it into answer text (fences, prose) plus a reasoning trace;
``apply_token_budget`` cuts both at a ``max_tokens`` budget. ``expected_node_set_jaccard``
gives the Monte Carlo reference of the stability metric under given parameters, so tests of
the whole pipeline can derive tolerances from the simulation instead of guessing them.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from storage.annotations import Annotation, AnnotationSet
from simulator.config import SimModel

IR_VERSION = 1
_CATEGORIES = ("policy", "safety", "style", "format", "process", "quality")


def _restyle(ident: str, style: int) -> str:
    """One of several id spellings a model might produce for the same node."""
    m = re.match(r"^([^:]+):(.+)$", ident)
    head, tail = (m.group(1), m.group(2)) if m else ("", ident)
    if style == 0:  # RULE:X -> RULE_X
        return f"{head}_{tail}" if head else f"{tail}_node"
    if style == 1:  # RULE:X -> rule:x
        return f"{head}:{tail}".lower() if head else tail.lower()
    if style == 2:  # RULE:X -> Rule-X
        return f"{head.capitalize()}-{tail}" if head else tail.capitalize()
    return f"{head.upper()}::{tail}" if head else f"{tail.upper()}_ID"  # style 3


def rename_id(ident: str, rng: np.random.Generator) -> str:
    """A restyled id that differs from ``ident`` (falls through styles until one differs)."""
    start = int(rng.integers(0, 4))
    for k in range(4):
        cand = _restyle(ident, (start + k) % 4)
        if cand != ident:
            return cand
    return ident + "_renamed"


def inferred_pool(truth: AnnotationSet, uri: str, params: SimModel) -> list[str]:
    """Deterministic candidate ids for inferred nodes: ``SECTION:<word>``, distinct from truth."""
    digest = hashlib.sha256((uri + "\x00" + "\x00".join(sorted(truth.ids))).encode("utf-8")).digest()
    order = np.random.default_rng(int.from_bytes(digest[:8], "big")).permutation(len(params.inferred_words))
    pool: list[str] = []
    for i in order:
        cand = f"SECTION:{params.inferred_words[int(i)]}"
        if cand not in truth.ids and cand not in pool:
            pool.append(cand)
        if len(pool) >= params.inferred_pool_size:
            break
    return pool


def _label(ident: str) -> str:
    tail = ident.split(":", 1)[-1]
    words = re.sub(r"[_\-.]+", " ", tail).strip()
    return (words[:1].upper() + words[1:]) if words else ident


def _priority(ann: Annotation) -> int | None:
    raw = ann.attributes.get("priority", "").strip()
    return int(raw) if re.fullmatch(r"[+-]?\d{1,9}", raw) else None


def _true_node(ann: Annotation) -> dict:
    triggers = [t for t in ann.attributes.get("trigger", "").split(",") if t]
    return {
        "id": ann.id,
        "kind": ann.kind,
        "label": _label(ann.id),
        "meta": {
            "category": ann.attributes.get("category"),
            "priority": _priority(ann),
            "inferred": False,
            "triggers": triggers,
            "condition_ref": ann.condition_refs[0] if ann.condition_refs else None,
        },
        "range": {"start_line": ann.line, "start_col": 0, "end_line": ann.line, "end_col": 0},
    }


def _perturb_meta(node: dict, rng: np.random.Generator) -> None:
    what = int(rng.integers(0, 3))
    if what == 0:
        old = node["meta"]["priority"]
        node["meta"]["priority"] = (old if old is not None else 0) + int(rng.choice([-1, 1]))
    elif what == 1:
        node["meta"]["category"] = str(rng.choice(_CATEGORIES))
    else:
        shift = int(rng.integers(1, 4))
        node["range"]["start_line"] += shift
        node["range"]["end_line"] += shift


def simulate_ir(
    truth: AnnotationSet, uri: str, params: SimModel, rng: np.random.Generator, *, pool: list[str] | None = None
) -> dict:
    """One run's IR (``../shared/spec/ir.md``) for a prompt whose annotations are ``truth``.

    Each distinct annotated id is dropped with ``drop_prob``; a kept one is restyled with
    ``rename_prob`` and its metadata changed with ``metadata_prob``; then
    Poisson(``add_rate``) ids (capped at the pool size) are drawn without replacement from the
    prompt's inferred pool and added with ``inferred=true``. Deterministic given ``rng``'s state.
    ``pool`` may pass a cached ``inferred_pool(truth, uri, params)`` (a speed-up, same result).
    """
    firsts = list(truth.first_by_id().values())
    n = len(firsts)
    keep = rng.random(n) >= params.drop_prob
    rename = rng.random(n) < params.rename_prob
    meta = rng.random(n) < params.metadata_prob
    nodes: list[dict] = []
    for i, ann in enumerate(firsts):
        if not keep[i]:
            continue
        node = _true_node(ann)
        if rename[i]:
            node["id"] = rename_id(ann.id, rng)
        if meta[i]:
            _perturb_meta(node, rng)
        nodes.append(node)
    if pool is None:
        pool = inferred_pool(truth, uri, params)
    k = min(int(rng.poisson(params.add_rate)) if params.add_rate > 0 else 0, len(pool))
    last_line = max((a.line for a in firsts), default=1)
    for j in sorted(rng.choice(len(pool), size=k, replace=False).tolist()) if k else []:
        line = int(rng.integers(1, last_line + 2))
        nodes.append({
            "id": pool[j],
            "kind": "Section",
            "label": _label(pool[j]),
            "meta": {"category": None, "priority": None, "inferred": True, "triggers": [], "condition_ref": None},
            "range": {"start_line": line, "start_col": 0, "end_line": line, "end_col": 0},
        })
    confidence = round(float(0.97 - 0.2 * rng.random() * (params.drop_prob + params.rename_prob)), 3)
    return {
        "version": IR_VERSION,
        "uri": uri,
        "meta": {"engine": "llm", "confidence": confidence, "parser_version": "irbench-sim"},
        "nodes": nodes,
    }


def node_set_jaccard(id_sets: list[frozenset[str]] | list[set[str]]) -> float:
    """Mean pairwise Jaccard |A∩B|/|A∪B| over all pairs; two empty sets score 1."""
    if len(id_sets) < 2:
        raise ValueError("node_set_jaccard needs at least 2 runs")
    vals = [len(a & b) / len(a | b) if (a or b) else 1.0 for a, b in combinations(id_sets, 2)]
    return float(np.mean(vals))


def expected_node_set_jaccard(
    params: SimModel, truth: AnnotationSet, runs: int, n_sims: int, seed: int
) -> tuple[float, float]:
    """Monte Carlo (mean, SD) of one cell's mean pairwise node-set Jaccard over ``runs`` runs.

    ``n_sims`` independent cells are simulated with ``simulate_ir``; SD is the sample SD
    (ddof=1) of the per-cell values, i.e. the spread one cell of ``runs`` runs shows.
    """
    if runs < 2 or n_sims < 2:
        raise ValueError(f"need runs >= 2 and n_sims >= 2 (got runs={runs}, n_sims={n_sims})")
    rng = np.random.default_rng(seed)
    pool = inferred_pool(truth, "sim", params)
    cells = np.empty(n_sims)
    for s in range(n_sims):
        sets = [frozenset(n["id"] for n in simulate_ir(truth, "sim", params, rng, pool=pool)["nodes"])
                for _ in range(runs)]
        cells[s] = node_set_jaccard(sets)
    return float(cells.mean()), float(cells.std(ddof=1))


_REASONING_SENTENCES = (
    "Let me read the prompt line by line and collect the annotation comments. ",
    "Each annotated rule, condition and breakpoint becomes a node with inferred set to false. ",
    "I should check the priorities and categories against the attributes. ",
    "There may be further implicit sections worth inferring. ",
    "Now I will assemble the JSON object with version, uri, meta and nodes. ",
)
_PROSE_BEFORE = ("Here is the IR for the prompt:", "Sure! The structure is below.", "Result:")
_PROSE_AFTER = ("Let me know if you need changes.", "All annotated nodes are included.", "Hope this helps.")


def reasoning_text(params: SimModel, rng: np.random.Generator) -> str:
    """Reasoning trace of Gamma(shape 4)-distributed length with mean ``reasoning_chars_mean``."""
    if params.reasoning_chars_mean <= 0:
        return ""
    n = int(rng.gamma(4.0, params.reasoning_chars_mean / 4.0))
    base = "".join(_REASONING_SENTENCES)
    return (base * (n // len(base) + 1))[:n]


def render_answer(ir: dict, params: SimModel, rng: np.random.Generator, *, structured: bool = False) -> str:
    """Answer text: the IR JSON (``json_indent``), maybe fenced (``fence_prob``), maybe with prose.

    ``structured`` (the request asked for JSON / a JSON schema) suppresses fences and prose, as
    constrained decoding would; the same RNG draws are made either way.
    """
    fence, prose, before, after = rng.random(4)
    text = json.dumps(ir, indent=params.json_indent, ensure_ascii=False)
    if structured:
        return text
    if fence < params.fence_prob:
        text = f"```json\n{text}\n```"
    if prose < params.prose_prob:
        if before < 0.5:
            text = f"{_PROSE_BEFORE[int(after * 3) % 3]}\n\n{text}"
        else:
            text = f"{text}\n\n{_PROSE_AFTER[int(after * 3) % 3]}"
    return text


@dataclass(frozen=True)
class BudgetedOutput:
    """What the model returns under a token budget; tokens ≈ ceil(chars / chars_per_token)."""

    content: str
    reasoning: str
    finish_reason: str  # "stop" | "length"
    completion_tokens: int
    reasoning_tokens: int


def count_tokens(text: str, chars_per_token: float) -> int:
    return math.ceil(len(text) / chars_per_token) if text else 0


def apply_token_budget(content: str, reasoning: str, max_tokens: int | None, chars_per_token: float) -> BudgetedOutput:
    """Reasoning consumes the budget first; the answer gets what is left, cut at the budget."""
    r_tok = count_tokens(reasoning, chars_per_token)
    a_tok = count_tokens(content, chars_per_token)
    if max_tokens is None or r_tok + a_tok <= max_tokens:
        return BudgetedOutput(content, reasoning, "stop", r_tok + a_tok, r_tok)
    budget = max(int(max_tokens), 0)
    if r_tok >= budget:
        cut = reasoning[: int(budget * chars_per_token)]
        return BudgetedOutput("", cut, "length", budget, budget)
    left = budget - r_tok
    return BudgetedOutput(content[: int(left * chars_per_token)], reasoning, "length", budget, r_tok)
