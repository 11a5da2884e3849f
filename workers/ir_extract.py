"""Find, parse and leniently validate the IR in a model's raw answer text.

This module finds the JSON in the text; ``workers.ir_validate`` turns the value found into an
IR (normalising, the repairs that change content, validation, canonical JSON).

``extract_ir(raw_text, budget_exhausted=...)`` never raises on model output: every input maps to
exactly one ``ParseOutcome`` (``../shared/spec/ir.md``), and the raw text itself is kept by the
caller in every case.

Outcomes and repairs (``IRExtraction.repairs`` names every change, in the order applied):

* ``ok`` — the answer is the JSON, possibly inside one ```json fence (repair ``stripped_fence``).
  The study's harness stripped that fence too, so a fence alone is *not* a content change and
  keeps the outcome ``ok``; ``repairs`` still records it so fence use can be counted.
* ``repaired`` — the IR was usable only after changing content: ``extracted_from_prose`` (text
  before/after the JSON), ``stripped_think`` (a leading ``<think>…</think>`` block),
  ``trailing_comma``, ``wrapped_node_list`` (a bare list of nodes), ``missing_version``,
  ``missing_uri``, ``missing_meta``, ``missing_node_meta``, ``missing_label``,
  ``coerced_priority``, ``coerced_id``, ``coerced_triggers``, ``coerced_range``,
  ``coerced_inferred``, ``coerced_version``.
* ``truncated`` — the JSON is unterminated (cut mid-value), or parsing failed while the provider
  said the budget ran out (``budget_exhausted=True``). Complete nodes are still recovered
  (repair ``closed_truncated_json``) and returned in ``document``/``ir_json``, but the outcome
  stays ``truncated`` so metrics do not count the run as successful.
* ``invalid_json`` — no parseable JSON value found; ``schema_invalid`` — JSON found but it is not
  an IR (no ``nodes`` list, a node without ``id``/``kind``, an uncoercible priority, …);
  ``empty`` — no answer text, whitespace only, or a reasoning block with nothing after it. An
  empty answer stays ``empty`` even when the budget ran out: nothing was cut mid-JSON (the
  attempt's own outcome, ``truncated``, records the budget).

Bounds (every answer is hostile): an answer longer than ``max_chars`` is refused before any
parsing, JSON nested deeper than ``max_depth`` is ``invalid_json``, and a ``RecursionError`` or
``MemoryError`` anywhere inside becomes ``invalid_json`` too, so the work per answer is linear in
its length with a small constant and nothing raises.

A complete, valid IR with ``budget_exhausted=True`` is ``ok``/``repaired``: the text is whole.
Duplicate ids are never dropped: ``node_count`` counts every node, ``node_ids`` is the distinct
sorted id set, ``duplicate_id_count = node_count - len(node_ids)``.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Iterator
from typing import Any

import msgspec

from storage.records import ParseOutcome
from workers.ir_validate import COSMETIC_REPAIRS, IRExtraction, clip_error, is_ir_like, validate_ir

__all__ = ["COSMETIC_REPAIRS", "IRExtraction", "extract_ir"]


# The fence grammar; ``_fences`` matches it with str.find (tests/workers/test_ir_extract.py compares them).
_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(```|\Z)", re.S)
_THINK_RE = re.compile(r"\s*<think>(.*?)</think>", re.S)
# A closed JSON string (group 1, skipped by the scan), a string cut off by the end of the text
# (possibly right after a backslash), or a bracket.
# (Strings use the unrolled form [^"\\]*(?:\\.[^"\\]*)*: several times faster in ``re`` than an
# alternation inside the repeat, which matters on megabyte-long strings.)
_TOKEN_RE = re.compile(r'("[^"\\]*(?:\\.[^"\\]*)*")|"[^"\\]*(?:\\.[^"\\]*)*\\?\Z|[{}\[\]]', re.S)
_STRING_RE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.S)
_TRAILING_COMMA_RE = re.compile(r",(?=\s*[}\]])")
_CLOSER = {"{": "}", "[": "]"}
# Stacks (open brackets, outermost first) at which a cut leaves only complete nodes behind:
# inside the document object, inside its nodes array, inside a bare node list.
_RECOVERY_STACKS = frozenset({"{", "{[", "["})


# Defaults sized far above real IRs (the study's largest is ~6 KB, ~60 nodes) and so that the
# worst case stays well under a second (bench/hostile_extract.py prints the figures).
DEFAULT_MAX_CHARS = 1024 * 1024
DEFAULT_MAX_DEPTH = 64
DEFAULT_MAX_NODES = 2000


def extract_ir(
    raw_text: str | None,
    *,
    budget_exhausted: bool = False,
    max_start_candidates: int = 64,
    max_chars: int = DEFAULT_MAX_CHARS,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_nodes: int = DEFAULT_MAX_NODES,
) -> IRExtraction:
    """Extract the IR from ``raw_text``; never raises.

    ``budget_exhausted``: the provider reported finish/done reason ``length``.
    ``max_start_candidates``: how many ``{``/``[`` positions to try as the JSON's start (bounds
    the work on long prose answers). ``max_chars``: longer answers are ``invalid_json`` without
    parsing. ``max_depth``: deepest bracket nesting accepted. ``max_nodes``: an IR with more
    nodes is ``schema_invalid`` without validating them (validation is the costly step).
    """
    if raw_text is None or not raw_text.strip():
        return IRExtraction(ParseOutcome.EMPTY, error="no answer text")
    if len(raw_text) > max_chars:
        return IRExtraction(
            ParseOutcome.INVALID_JSON,
            error=f"answer of {len(raw_text)} chars exceeds max_answer_chars={max_chars}; not parsed",
        )
    try:
        found = _extract(raw_text, budget_exhausted, max_start_candidates, max_depth, max_nodes)
    except (RecursionError, MemoryError) as exc:
        return IRExtraction(ParseOutcome.INVALID_JSON, error=f"answer could not be parsed ({type(exc).__name__})")
    return found


def _extract(
    raw_text: str, budget_exhausted: bool, max_start_candidates: int, max_depth: int, max_nodes: int
) -> IRExtraction:
    repairs: list[str] = []
    text = raw_text
    think = _THINK_RE.match(text)
    if think:
        text = text[think.end() :]
        repairs.append("stripped_think")
    elif text.lstrip().startswith("<think>"):
        outcome = ParseOutcome.TRUNCATED if budget_exhausted else ParseOutcome.EMPTY
        return IRExtraction(outcome, tuple(repairs), error="answer is an unterminated <think> block")
    if not text.strip():
        return IRExtraction(ParseOutcome.EMPTY, tuple(repairs), error="answer is reasoning only")

    text, prose = _unfence(text, repairs)
    first = _first_start(text)
    if first is None:
        outcome = ParseOutcome.TRUNCATED if budget_exhausted else ParseOutcome.INVALID_JSON
        return IRExtraction(outcome, tuple(repairs), error=clip_error(f"no JSON object in the answer ({len(raw_text)} chars)"))
    fast = _decode_ir_at(text, first, max_depth)
    if fast is not None:  # the common case: a well-formed IR object is the first JSON value
        value, end = fast
        if prose or text[:first].strip() or text[end:].strip():
            repairs.append("extracted_from_prose")
        return validate_ir(value, repairs, ParseOutcome.OK, max_nodes)
    status, cuts = _scan(text, first, max_depth)
    if status == "too_deep":
        return IRExtraction(
            ParseOutcome.INVALID_JSON, tuple(repairs), error=f"JSON nested deeper than max_json_depth={max_depth}"
        )
    found = _find_json(text, max_start_candidates, first, status)
    if found is None:
        cleaned = _strip_trailing_commas(text)
        if cleaned != text:
            # dropping commas changes neither brackets nor strings: the first scan's status holds
            found = _find_json(cleaned, max_start_candidates, _first_start(cleaned) or 0, status)
            if found is not None:
                repairs.append("trailing_comma")
                text = cleaned
    if found is not None:
        value, start, end = found
        if prose or text[:start].strip() or text[end:].strip():
            repairs.append("extracted_from_prose")
        return validate_ir(value, repairs, ParseOutcome.OK, max_nodes)
    if status == "unterminated" or budget_exhausted:
        return _recover_truncated(text, first, cuts, repairs, max_nodes)
    fallback = _any_json(text, max_start_candidates)
    if fallback is not None:
        return validate_ir(fallback, repairs, ParseOutcome.OK, max_nodes)
    return IRExtraction(ParseOutcome.INVALID_JSON, tuple(repairs), error=clip_error(_json_error(text, first)))


def _decode_ir_at(text: str, first: int, max_depth: int) -> tuple[dict[str, Any], int] | None:
    """``(value, end)`` when the JSON value at ``first`` decodes, is an object with ``nodes`` and
    nests at most ``max_depth`` deep; else None (the full search decides). Same answer as the
    bracket scan followed by ``_find_json`` for that case: the scan from ``first`` covers exactly
    this value, and its depth is the value's container depth. The C decoder's own recursion
    guard bounds what a hostile nesting costs before it fails here (bench/hostile_extract.py
    measures it). The bracket scan this skips is ~30 % of the extraction's CPU per run."""
    try:
        value, end = _decode_at(text, first)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(value, dict) or "nodes" not in value:
        return None
    # Nesting depth never exceeds the number of opening brackets in the value's text (a C-speed
    # count), so the walk over every container is needed only when that count passes the limit.
    if text.count("{", first, end) + text.count("[", first, end) > max_depth and _deeper_than(value, max_depth):
        return None
    return value, end


def _decode_at(text: str, start: int) -> tuple[Any, int]:
    """``json.JSONDecoder().raw_decode(text, start)``; by msgspec, at half the CPU, when the value
    is all of the text up to its last ``}`` (the common answer: the JSON, then at most whitespace
    or a closing fence). msgspec refuses every JSON text ``json`` refuses and decodes the rest
    to the same values, key order included (tests/storage/test_ir_strict.py); what it refuses besides
    (a lone surrogate, NaN, a number past float range, prose after the JSON) goes to ``json``."""
    last = text.rfind("}")
    if last > start:
        try:
            return msgspec.json.decode(text[start : last + 1]), last + 1
        except (msgspec.DecodeError, ValueError, RecursionError):  # ValueError: a lone surrogate
            pass
    return json.JSONDecoder().raw_decode(text, start)


def _deeper_than(value: Any, max_depth: int) -> bool:
    """Whether containers nest more than ``max_depth`` deep in the decoded ``value`` (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            return True
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


def _fences(text: str) -> Iterator[tuple[int, int, str]]:
    """``(start, end, body)`` of each fenced block, as ``_FENCE_RE.finditer`` would match them:
    an opening fence runs to the end of its line, the body to the next fence or the end of the
    text. With ``str.find`` instead of the regex's lazy ``.*?``, which cost ~80 us per 2 KB
    answer (a fifth of the extraction; bench/writer_cpu.py measures the extraction)."""
    pos = 0
    while (start := text.find("```", pos)) >= 0:
        newline = text.find("\n", start + 3)
        if newline < 0:  # no opening line ends after here: no later fence can open either
            return
        close = text.find("```", newline + 1)
        body_end = len(text) if close < 0 else close
        pos = len(text) if close < 0 else close + 3
        yield start, pos, text[newline + 1 : body_end]


def _unfence(text: str, repairs: list[str]) -> tuple[str, bool]:
    """Return the first fenced block holding a bracket, and whether prose surrounds it."""
    for start, end, body in _fences(text):
        if "{" in body or "[" in body:
            repairs.append("stripped_fence")
            prose = bool(text[:start].strip() or text[end:].strip())
            return body, prose
    return text, False


def _starts(text: str, limit: int) -> list[int]:
    out: list[int] = []
    for match in re.finditer(r"[{\[]", text):
        out.append(match.start())
        if len(out) >= limit:
            break
    return out


def _first_start(text: str) -> int | None:
    match = re.search(r"[{\[]", text)
    return match.start() if match else None


def _decode_all(text: str, limit: int) -> Iterator[tuple[Any, int, int]]:
    """Yield ``(value, start, end)`` for each JSON value decodable at a bracket, left to right,
    skipping brackets inside an already decoded value."""
    decoder = json.JSONDecoder()
    skip_until = -1
    for pos in _starts(text, limit):
        if pos < skip_until:
            continue
        try:
            value, end = decoder.raw_decode(text, pos)
        except (json.JSONDecodeError, RecursionError):
            continue
        skip_until = end
        yield value, pos, end


def _find_json(text: str, limit: int, first: int, first_status: str) -> tuple[Any, int, int] | None:
    """The JSON value that holds the IR: the first decodable object with ``nodes``, else the
    first decodable list of objects. A list nested inside an unterminated value that starts at
    ``first`` is the node array of a cut-off document, not an answer, so it is not returned."""
    bare_list: tuple[Any, int, int] | None = None
    for value, start, end in _decode_all(text, limit):
        if isinstance(value, dict) and "nodes" in value:
            return value, start, end
        if bare_list is None and is_ir_like(value):
            bare_list = (value, start, end)
    if bare_list is not None and bare_list[1] > first and first_status == "unterminated":
        return None
    return bare_list


def _any_json(text: str, limit: int) -> Any | None:
    """The first decodable object of any shape (it will be reported as schema_invalid). Lists
    are not considered: a ``[]`` inside a broken object is not the answer."""
    for value, _start, _end in _decode_all(text, limit):
        if isinstance(value, dict):
            return value
    return None


def _scan(text: str, start: int, max_depth: int) -> tuple[str, list[tuple[int, str]]]:
    """Bracket-match from ``start``: ``complete``, ``unterminated``, ``mismatch`` or
    ``too_deep`` (more than ``max_depth`` open brackets), plus the cut points (index just after
    a closing bracket, open stack there) usable for recovery."""
    stack: list[str] = []
    cuts: list[tuple[int, str]] = []
    for match in _TOKEN_RE.finditer(text, start):
        if match.lastindex:  # a closed string: nothing to track
            continue
        token = match.group()
        if token in "{[":
            stack.append(token)
            if len(stack) > max_depth:
                return "too_deep", cuts
        elif token in "}]":
            if not stack or _CLOSER[stack[-1]] != token:
                return "mismatch", cuts
            stack.pop()
            if not stack:
                return "complete", cuts
            if len(stack) <= 2:  # recovery stacks are at most two deep; never join a deep stack
                shape = "".join(stack)
                if shape in _RECOVERY_STACKS:
                    cuts.append((match.end(), shape))
        else:
            return "unterminated", cuts  # a string cut off by the end of the text
    return ("unterminated" if stack else "complete"), cuts


def _recover_truncated(
    text: str, start: int, cuts: list[tuple[int, str]], repairs: list[str], max_nodes: int
) -> IRExtraction:
    """Close the JSON after the last complete node; the outcome stays ``truncated``."""
    for end, shape in reversed(cuts[-32:]):
        candidate = text[start:end] + "".join(_CLOSER[c] for c in reversed(shape))
        try:
            value = json.loads(candidate)
        except (json.JSONDecodeError, RecursionError):
            continue
        if not is_ir_like(value):
            continue
        count = len(value["nodes"]) if isinstance(value, dict) and isinstance(value["nodes"], list) else len(value)
        if count > max_nodes:  # earlier cuts hold fewer nodes, but the answer is far past the bound
            return IRExtraction(
                ParseOutcome.TRUNCATED, tuple(repairs), error=f"JSON cut mid-value; {count} nodes > max_ir_nodes={max_nodes}"
            )
        result = validate_ir(value, [*repairs, "closed_truncated_json"], ParseOutcome.OK, max_nodes)
        if result.validated is None:
            continue
        return IRExtraction(
            ParseOutcome.TRUNCATED,
            result.repairs,
            result.validated,
            result.ir_json,
            result.node_ids,
            result.node_count,
            result.duplicate_id_count,
            error=f"JSON cut mid-value; recovered {result.node_count} complete nodes",
        )
    return IRExtraction(ParseOutcome.TRUNCATED, tuple(repairs), error="JSON cut mid-value; no complete node to recover")


def _strip_trailing_commas(text: str) -> str:
    """Remove commas directly before ``}``/``]`` outside strings. Candidates are found first
    (usually none or a few); only then are string spans listed to tell which are outside."""
    commas = [m.start() for m in _TRAILING_COMMA_RE.finditer(text)]
    if not commas:
        return text
    spans = [m.span() for m in _STRING_RE.finditer(text)]
    starts = [a for a, _ in spans]
    out, pos = [], 0
    for at in commas:
        i = bisect.bisect_right(starts, at) - 1
        if i >= 0 and at < spans[i][1]:
            continue  # inside a string
        out.append(text[pos:at])
        pos = at + 1
    out.append(text[pos:])
    return "".join(out)


def _json_error(text: str, start: int) -> str:
    try:
        json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as exc:
        return f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    except RecursionError:
        return "invalid JSON: nested too deeply"
    return "invalid JSON"


