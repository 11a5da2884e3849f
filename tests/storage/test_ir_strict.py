"""The strict fast path of IR validation (``storage.ir_strict``) against ``IRDocument``.

Whatever the fast path accepts, it must give byte for byte what the lenient ``IRDocument`` path
gives; whatever it refuses goes down that path. Checked three ways: ``strict_ir`` against
``IRDocument`` on odd and hostile IR values, ``extract_ir`` with the fast path against
``extract_ir`` without it on hostile answer texts (every field of the result), and the twin's
fields against the models'.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import msgspec
import pytest
from pydantic import ValidationError
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

import workers.ir_extract as ir_extract
import workers.ir_validate as ir_validate
from storage import ir
from storage.ir import IRDocument
from storage.ir_strict import TWINS, strict_ir
from workers.ir_extract import extract_ir
from tests.workers.test_hostile_property import jsonish
from tests.workers.test_ir_extract import ARTIFACT_IRS, needs_artifact
from tests.support.examples import examples

pytestmark = pytest.mark.property

# every code point, lone surrogates and control characters included
ANY_TEXT = st.text(st.characters(blacklist_categories=()), max_size=12)
ODD_SCALARS = (
    st.none() | st.booleans() | st.integers() | st.integers(min_value=2**62, max_value=2**70)
    | st.floats() | ANY_TEXT | st.sampled_from(["2", " 3 ", "2.0", "null", "", "high", "true", "1e3", "٣"])
)
ODD = st.recursive(ODD_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
                   max_leaves=6)


OPT_INT = st.none() | st.integers(-5, 10**6)
TEXT = st.text(max_size=12) | ANY_TEXT  # control characters, quotes, non-ASCII; now and then a lone surrogate
OPT_STR = st.none() | TEXT
FLOATS = st.floats() | st.sampled_from([0.97, 1e-4, 9.9e-5, 1e16, 9.999999999999998e15, -0.0, 0.0, 1e-320]) | st.integers()
# (field, strategy of a value of its type) per model; a nested model is its field list
RANGE = [(k, OPT_INT) for k in ("start_line", "start_col", "end_line", "end_col")]
NULLABLE = {"range"}  # nested models that may be null (and are, a quarter of the time)
REQUIRED = {"id", "kind"}  # absent only as an odd value
NODE_META = [("category", OPT_STR), ("priority", OPT_INT), ("inferred", st.none() | st.booleans()),
             ("triggers", st.lists(TEXT, max_size=3)), ("condition_ref", OPT_STR)]
NODE = [("id", TEXT | st.sampled_from(["RULE:a", "RULE:b"])), ("kind", TEXT), ("label", TEXT),
        ("meta", NODE_META), ("range", RANGE)]
DOC_META = [("parser_version", OPT_STR), ("confidence", st.none() | FLOATS), ("engine", OPT_STR),
            ("warnings", st.lists(TEXT, max_size=2))]


def _obj(draw: st.DrawFn, fields: list[tuple[str, Any]], odd: float) -> dict[str, Any]:
    """An object with some of ``fields``: each of its type, or with probability ``odd`` anything
    at all or absent (required ones too); with probability ``odd`` an unknown key too."""
    out: dict[str, Any] = {}
    for name, typed in fields:
        if draw(st.floats(0, 1)) < odd:
            if draw(st.booleans()):
                out[name] = draw(ODD)
            continue
        if name not in REQUIRED and not draw(st.integers(0, 4)):
            continue  # absent: its default
        elif not isinstance(typed, list):
            out[name] = draw(typed)
        elif name in NULLABLE and not draw(st.integers(0, 3)):
            out[name] = None
        else:
            out[name] = _obj(draw, typed, odd)
    if draw(st.floats(0, 1)) < odd:
        out[draw(TEXT)] = draw(ODD)
    return out


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    """IR-shaped values: plain ones (every field of its type) and odder ones, at a rate drawn per document."""
    odd = draw(st.sampled_from([0.0, 0.0, 0.01, 0.05, 0.3]))
    doc = _obj(draw, [("version", OPT_INT), ("uri", OPT_STR), ("meta", DOC_META)], odd)
    if draw(st.sampled_from([True, True, True, True, False])):  # a document without nodes now and then
        doc["nodes"] = [_obj(draw, NODE, odd) if draw(st.floats(0, 1)) >= odd else draw(ODD)
                        for _ in range(draw(st.integers(0, 5)))]
    return doc


DOCUMENT = documents()
CLEAN = {
    "version": 1, "uri": "p", "meta": {"engine": "llm", "confidence": 0.97},
    "nodes": [{"id": "RULE:a", "kind": "Rule", "label": "Ünïcode \"quoted\"\n", "meta": {"priority": 1, "triggers": ["x"]},
               "range": {"start_line": 3, "start_col": 0, "end_line": 3, "end_col": 9}},
              {"id": "RULE:a", "kind": "Section"}],
}


def _lenient(value: dict[str, Any]) -> tuple[str, list[str], int] | None:
    try:
        document = IRDocument.model_validate(value)
    except ValidationError:  # refused: the fast path must have refused too
        return None
    return document.canonical_json(), document.node_ids(), len(document.nodes)


@settings(max_examples=examples(2000), deadline=None, suppress_health_check=list(HealthCheck))
@given(value=DOCUMENT)
@example(value=CLEAN)
@example(value={"meta": {"confidence": 1e16}})
@example(value={"meta": {"confidence": 1}})
@example(value={"meta": {"confidence": math.nan}})
@example(value={"nodes": [{"id": "\ud800", "kind": "Rule"}]})
@example(value={"version": 2**64})
@example(value={"nodes": [{"id": "a", "kind": "Rule", "meta": {"priority": True}}]})
def test_what_the_fast_path_accepts_it_gives_as_irdocument_does(value: dict[str, Any]) -> None:
    fast = strict_ir(value)
    event("fast path" if fast is not None else "IRDocument path")  # --hypothesis-show-statistics
    if fast is None:
        return
    assert (fast.ir_json, fast.node_ids, fast.node_count) == _lenient(value)
    assert isinstance(fast.ir_json, str) and json.loads(fast.ir_json) is not None


def _max_depth(text: str) -> int:
    """The deepest bracket nesting in ``text`` (brackets inside strings counted too: an upper bound)."""
    depth = deepest = 0
    for c in text:
        if c in "{[":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "}]":
            depth = max(depth - 1, 0)
    return deepest


def _typed(value: Any) -> Any:
    """``value`` with every scalar's type beside it and dict keys in order (1 == 1.0 == True otherwise)."""
    if isinstance(value, dict):
        return [(k, _typed(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return type(value).__name__, repr(value)


JSON_TEXTS = jsonish() | DOCUMENT.map(json.dumps) | st.builds(
    lambda value, tail, ascii_: json.dumps(value, ensure_ascii=ascii_) + tail,
    DOCUMENT, st.sampled_from(["", " ", "\n```", "}", " }", "\x0c", "\u00a0", ", {}"]), st.booleans(),
) | st.text(st.sampled_from(list('{}[]":,0123456789.eE+-tru\\ nlfsaNI\ud800\x00\u00e9')), max_size=60).map(lambda t: "{" + t)


@settings(max_examples=examples(2000), deadline=None, suppress_health_check=list(HealthCheck))
@given(text=JSON_TEXTS, data=st.data())
@example(text='{"a":"\\ud800"}', data=None)
@example(text='{"a":1,"a":2,"b":1e400}', data=None)
@example(text='{"a":NaN} }', data=None)
def test_decode_at_is_raw_decode(text: str, data: st.DataObject | None) -> None:
    """msgspec's decode, where ``_decode_at`` takes it, gives what ``json``'s raw_decode does.
    Not at a nesting near the recursion limit: there ``json`` accepts or raises RecursionError
    by how deep the caller's stack already is (one frame more in ``_decode_at``, enough to
    flip a hypothesis example), which says nothing about the decoder."""
    assume(_max_depth(text) < sys.getrecursionlimit() // 2)
    starts = [i for i, c in enumerate(text) if c in "{["] or [0]
    start = data.draw(st.sampled_from(starts)) if data is not None else starts[0]
    try:
        expected = json.JSONDecoder().raw_decode(text, start)
    except (json.JSONDecodeError, RecursionError):
        expected = None
    try:
        got = ir_extract._decode_at(text, start)
    except (json.JSONDecodeError, RecursionError):
        got = None
    try:  # which decoder answered (--hypothesis-show-statistics)
        msgspec.json.decode(text[start : text.rfind("}") + 1])
        event("msgspec decoded")
    except (msgspec.DecodeError, ValueError, RecursionError):
        event("json decoded" if got is not None else "refused")
    assert (got is None) == (expected is None)
    if got is not None:
        assert (_typed(got[0]), got[1]) == (_typed(expected[0]), expected[1])


def test_the_fast_path_takes_plain_irs_and_refuses_what_needs_leniency() -> None:
    assert strict_ir(CLEAN) is not None
    for odd in ({**CLEAN, "extra": 1}, {**CLEAN, "version": "1"}, {**CLEAN, "meta": None},
                {**CLEAN, "meta": {"confidence": 1e-5}}, {**CLEAN, "nodes": [{"id": 5, "kind": "Rule"}]},
                {**CLEAN, "nodes": [{"id": "a", "kind": "Rule", "meta": {"triggers": "x"}}]}):
        assert strict_ir(odd) is None, odd


def _extractions(text: str, budget: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """``extract_ir`` as it is, and with neither fast path (msgspec's decode, the strict twin)."""
    fast = extract_ir(text, budget_exhausted=budget)
    with monkeypatch.context() as patch:
        patch.setattr(ir_validate, "strict_ir", lambda _value: None)
        patch.setattr(ir_extract, "_decode_at", lambda text, start: json.JSONDecoder().raw_decode(text, start))
        slow = extract_ir(text, budget_exhausted=budget)
    return fast, slow


def _same(fast: Any, slow: Any) -> None:
    for name in ("parse_outcome", "repairs", "ir_json", "node_ids", "node_count", "duplicate_id_count", "error"):
        assert getattr(fast, name) == getattr(slow, name), name
    assert fast.document == slow.document


@settings(max_examples=examples(1000), deadline=None, suppress_health_check=list(HealthCheck))
@given(value=DOCUMENT, shape=st.sampled_from(["plain", "fence", "prose", "cut", "comma", "list"]), budget=st.booleans(),
       data=st.data())
def test_extract_ir_gives_the_same_result_with_and_without_the_fast_path(
    value: dict[str, Any], shape: str, budget: bool, data: st.DataObject, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = json.dumps(value.get("nodes", []) if shape == "list" else value, ensure_ascii=data.draw(st.booleans()))
    if shape == "fence":
        text = f"```json\n{text}\n```"
    elif shape == "prose":
        text = f"Here it is: {text} done."
    elif shape == "cut":
        text = text[: data.draw(st.integers(0, len(text)))]
    elif shape == "comma":
        text = text.replace("}", ",}", 1)
    fast, slow = _extractions(text, budget, monkeypatch)
    event(f"{fast.parse_outcome.value}, {'fast path' if isinstance(fast.validated, dict) else 'IRDocument path'}")
    _same(fast, slow)


@settings(max_examples=examples(500), deadline=None, suppress_health_check=list(HealthCheck))
@given(text=jsonish(), budget=st.booleans())
def test_extract_ir_on_hostile_answers_is_the_same_with_and_without_the_fast_path(
    text: str, budget: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    _same(*_extractions(text, budget, monkeypatch))


@needs_artifact
def test_the_study_irs_extract_the_same_with_and_without_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    for path in ARTIFACT_IRS:
        _same(*_extractions(path.read_text(encoding="utf-8"), False, monkeypatch))


@pytest.mark.parametrize("name", sorted(TWINS))
def test_the_twin_has_the_fields_and_defaults_of_its_model(name: str) -> None:
    model, twin = getattr(ir, name), TWINS[name]
    fields = msgspec.structs.fields(twin)
    assert [f.name for f in fields] == list(model.model_fields)
    for f in fields:
        info = model.model_fields[f.name]
        assert info.is_required() == (f.required), f.name
        if f.required:
            continue
        default = f.default_factory() if f.default is msgspec.NODEFAULT else f.default
        expected = info.get_default(call_default_factory=True)
        as_builtin = msgspec.to_builtins(default)
        assert as_builtin == (expected.model_dump() if hasattr(expected, "model_dump") else expected), f.name
