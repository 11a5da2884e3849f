"""IR extraction on every persisted IR of the study, and on synthesized model quirks."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.ir import IRDocument
from storage.records import ERROR_TEXT_MAX_CHARS, ParseOutcome
from workers.ir_extract import extract_ir
from tests.support.paths import ARTIFACT

RESULTS = ARTIFACT / "results"
ARTIFACT_IRS = sorted(RESULTS.glob("irs/**/*.json")) + sorted(RESULTS.glob("irs_crossed/**/*.json"))
needs_artifact = pytest.mark.usefixtures("artifact_dir")  # fails, never skips, without the artifact

SMALL = {
    "version": 1,
    "uri": "p",
    "meta": {"engine": "llm", "confidence": 0.9},
    "nodes": [
        {"id": "RULE:a", "kind": "Rule", "label": "Use {braces} and \"quotes\".", "meta": {"priority": 1}},
        {"id": "CONDITION:b", "kind": "Condition", "label": "b", "meta": {"inferred": True}},
        {"id": "SECTION:c", "kind": "Section", "label": "c", "meta": {}},
    ],
}
SMALL_TEXT = json.dumps(SMALL, indent=2)


def _doc(**changes: object) -> str:
    return json.dumps({**SMALL, **changes})


# ---------------------------------------------------------------- the study's persisted IRs


@needs_artifact
def test_every_persisted_ir_parses_ok() -> None:
    assert len(ARTIFACT_IRS) == 288  # 283 annotated + 5 crossed (NOTES.md)
    total_duplicates = 0
    for path in ARTIFACT_IRS:
        raw = path.read_text(encoding="utf-8")
        data = json.loads(raw)
        result = extract_ir(raw)
        assert result.parse_outcome == ParseOutcome.OK, (path, result.error)
        assert result.repairs == (), path
        ids = [node["id"] for node in data["nodes"]]
        assert result.node_count == len(data["nodes"]) == len(result.document.nodes)
        assert result.node_ids == tuple(sorted(set(ids)))
        assert result.duplicate_id_count == len(ids) - len(set(ids))
        total_duplicates += result.duplicate_id_count
        # nothing lost: the typed nodes carry the raw values, and ir_json round-trips
        for node, raw_node in zip(result.document.nodes, data["nodes"], strict=True):
            assert (node.id, node.kind, node.label) == (raw_node["id"], raw_node["kind"], raw_node["label"])
            assert node.meta.priority == raw_node["meta"].get("priority")
            assert node.meta.category == raw_node["meta"].get("category")
            assert node.range.model_dump() == raw_node["range"]
        assert IRDocument.from_json(result.ir_json) == result.document
        assert result.document.meta.confidence == data["meta"]["confidence"]
    assert total_duplicates > 0  # the artifact holds at least one IR with a duplicate id


@needs_artifact
def test_artifact_ir_fenced_and_in_prose() -> None:
    raw = ARTIFACT_IRS[0].read_text(encoding="utf-8")
    plain = extract_ir(raw)
    fenced = extract_ir(f"```json\n{raw}\n```")
    assert fenced.parse_outcome == ParseOutcome.OK and fenced.repairs == ("stripped_fence",)
    assert fenced.ir_json == plain.ir_json
    prose = extract_ir(f"Here is the IR:\n\n```json\n{raw}\n```\nLet me know if you need more.")
    assert prose.parse_outcome == ParseOutcome.REPAIRED
    assert prose.repairs == ("stripped_fence", "extracted_from_prose")
    assert prose.ir_json == plain.ir_json


@needs_artifact
def test_artifact_ir_truncated_at_many_points() -> None:
    raw = ARTIFACT_IRS[0].read_text(encoding="utf-8")
    full = extract_ir(raw).document
    for cut in range(1, len(raw) - 1, 53):
        result = extract_ir(raw[:cut], budget_exhausted=cut % 2 == 0)
        assert result.parse_outcome == ParseOutcome.TRUNCATED, cut
        if result.document is not None:
            # only complete nodes come back, in order, identical to the full IR's
            assert result.document.nodes == full.nodes[: result.node_count]
            assert "closed_truncated_json" in result.repairs


# ---------------------------------------------------------------- synthesized quirks


def test_plain_object_is_ok_and_canonical() -> None:
    result = extract_ir(SMALL_TEXT)
    assert result.parse_outcome == ParseOutcome.OK and result.repairs == () and result.error is None
    assert result.node_ids == ("CONDITION:b", "RULE:a", "SECTION:c")
    reparsed = json.loads(result.ir_json)
    assert result.ir_json == json.dumps(reparsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert reparsed["nodes"][0]["label"] == 'Use {braces} and "quotes".'


@pytest.mark.parametrize(
    ("text", "outcome", "repairs"),
    [
        (f"```json\n{SMALL_TEXT}\n```", ParseOutcome.OK, ("stripped_fence",)),
        (f"```\n{SMALL_TEXT}\n```\n", ParseOutcome.OK, ("stripped_fence",)),
        (f"  \n```JSON\n{SMALL_TEXT}```", ParseOutcome.OK, ("stripped_fence",)),
        (f"Sure! Here it is:\n{SMALL_TEXT}\nDone.", ParseOutcome.REPAIRED, ("extracted_from_prose",)),
        (f"The template uses {{{{ var }}}} twice.\n{SMALL_TEXT}", ParseOutcome.REPAIRED, ("extracted_from_prose",)),
        (f"<think>nodes: [ {{ </think>\n{SMALL_TEXT}", ParseOutcome.REPAIRED, ("stripped_think",)),
    ],
)
def test_wrappers(text: str, outcome: ParseOutcome, repairs: tuple[str, ...]) -> None:
    result = extract_ir(text)
    assert (result.parse_outcome, result.repairs) == (outcome, repairs)
    assert result.ir_json == extract_ir(SMALL_TEXT).ir_json


def test_string_priorities_are_coerced() -> None:
    text = _doc(nodes=[{"id": "a", "kind": "Rule", "label": "", "meta": {"priority": "2"}},
                       {"id": "b", "kind": "Rule", "label": "", "meta": {"priority": " 3 "}}])
    result = extract_ir(text)
    assert result.parse_outcome == ParseOutcome.REPAIRED and result.repairs == ("coerced_priority",)
    assert [n.meta.priority for n in result.document.nodes] == [2, 3]


def test_unknown_kinds_and_fields_are_kept() -> None:
    text = _doc(
        meta={"engine": "llm", "model_note": "x"},
        nodes=[{"id": "s", "kind": "SkillInstruction", "label": "l", "weight": 0.5,
                "meta": {"category": "null", "inferred": False, "custom": [1, 2]}}],
    )
    result = extract_ir(text)
    assert result.parse_outcome == ParseOutcome.OK
    node = json.loads(result.ir_json)["nodes"][0]
    assert node["kind"] == "SkillInstruction" and node["weight"] == 0.5
    assert node["meta"]["custom"] == [1, 2] and node["meta"]["category"] == "null"
    assert json.loads(result.ir_json)["meta"]["model_note"] == "x"


def test_missing_document_fields_are_repaired() -> None:
    result = extract_ir(json.dumps({"nodes": SMALL["nodes"]}))
    assert result.parse_outcome == ParseOutcome.REPAIRED
    assert result.repairs == ("missing_version", "missing_uri", "missing_meta")
    assert result.document.version is None and result.document.uri is None and result.node_count == 3


def test_bare_node_list_and_missing_node_meta() -> None:
    result = extract_ir(json.dumps([{"id": "a", "kind": "Rule", "label": "x"}, {"id": "b", "kind": "Rule"}]))
    assert result.parse_outcome == ParseOutcome.REPAIRED
    assert result.repairs[0] == "wrapped_node_list"
    assert {"missing_node_meta", "missing_label"} <= set(result.repairs)
    assert result.node_ids == ("a", "b")


def test_duplicate_ids_are_kept_and_counted() -> None:
    nodes = [{"id": i, "kind": "Rule", "label": str(n), "meta": {}} for n, i in enumerate("aabcaa")]
    result = extract_ir(_doc(nodes=nodes))
    assert result.parse_outcome == ParseOutcome.OK
    assert result.node_count == 6 and len(result.document.nodes) == 6
    assert result.node_ids == ("a", "b", "c") and result.duplicate_id_count == 3


def test_trailing_commas_are_repaired() -> None:
    text = '{"version": 1, "uri": "p", "meta": {}, "nodes": [{"id": "a,]", "kind": "Rule", "label": "x", "meta": {},},],}'
    result = extract_ir(text)
    assert result.parse_outcome == ParseOutcome.REPAIRED and result.repairs == ("trailing_comma",)
    assert result.node_ids == ("a,]",)  # the comma inside the string is untouched


def test_truncated_json_recovers_complete_nodes() -> None:
    cut = SMALL_TEXT.index('"SECTION:c"') + 4
    result = extract_ir(SMALL_TEXT[:cut])
    assert result.parse_outcome == ParseOutcome.TRUNCATED
    assert result.node_ids == ("CONDITION:b", "RULE:a") and result.node_count == 2
    # cut inside a string holding braces and an escaped quote
    cut = SMALL_TEXT.index("braces} and \\\"") + 10
    result = extract_ir(f"```json\n{SMALL_TEXT[:cut]}", budget_exhausted=True)
    assert result.parse_outcome == ParseOutcome.TRUNCATED and result.document is None
    assert "no complete node" in result.error


def test_budget_exhausted_but_complete_is_ok() -> None:
    assert extract_ir(SMALL_TEXT, budget_exhausted=True).parse_outcome == ParseOutcome.OK


@pytest.mark.parametrize(
    ("text", "budget", "outcome"),
    [
        (None, False, ParseOutcome.EMPTY),
        ("", True, ParseOutcome.EMPTY),
        ("  \n\t", False, ParseOutcome.EMPTY),
        ("<think>I should list the rules.</think>", False, ParseOutcome.EMPTY),
        ("<think>I should list the rules", False, ParseOutcome.EMPTY),
        ("<think>I should list the rules", True, ParseOutcome.TRUNCATED),
        ("I cannot help with that.", False, ParseOutcome.INVALID_JSON),
        ("Let me think step by step about", True, ParseOutcome.TRUNCATED),
        ('{"nodes": [{"id": "a", "kind": }]}', False, ParseOutcome.INVALID_JSON),
        ("{'nodes': []}", False, ParseOutcome.INVALID_JSON),
        ('{"answer": 42}', False, ParseOutcome.SCHEMA_INVALID),
        ('{"nodes": {"id": "a"}}', False, ParseOutcome.SCHEMA_INVALID),
        ('{"nodes": [{"kind": "Rule", "label": "no id"}]}', False, ParseOutcome.SCHEMA_INVALID),
        ('{"nodes": [{"id": "a", "kind": "Rule", "meta": {"priority": "high"}}]}', False, ParseOutcome.SCHEMA_INVALID),
        ('{"nodes": ["a", "b"]}', False, ParseOutcome.SCHEMA_INVALID),
    ],
)
def test_failures(text: str | None, budget: bool, outcome: ParseOutcome) -> None:
    result = extract_ir(text, budget_exhausted=budget)
    assert result.parse_outcome == outcome
    assert result.ir_json is None and result.node_count == 0
    assert result.error and len(result.error) <= ERROR_TEXT_MAX_CHARS


def test_schema_error_names_the_field() -> None:
    result = extract_ir('{"nodes": [{"id": "a", "kind": "Rule", "meta": {"priority": "high"}}]}')
    assert "nodes.0.meta.priority" in result.error


def test_long_prose_with_many_braces_is_bounded_and_found() -> None:
    prose = "{x} " * 5000
    result = extract_ir(prose + SMALL_TEXT, max_start_candidates=10_000)
    assert result.parse_outcome == ParseOutcome.REPAIRED and result.node_count == 3


def test_unbalanced_brace_in_prose_before_a_complete_document() -> None:
    result = extract_ir("Sets look like {a, b\n" + SMALL_TEXT + "\nthat's all")
    assert result.parse_outcome == ParseOutcome.REPAIRED and result.node_count == 3
    assert result.repairs == ("extracted_from_prose",)


def test_cut_after_the_node_array_is_truncated_not_a_bare_list() -> None:
    text = json.dumps({"nodes": SMALL["nodes"], "uri": "a-long-uri-that-gets-cut"})
    result = extract_ir(text[:-8])
    assert result.parse_outcome == ParseOutcome.TRUNCATED and result.node_count == 3


def test_trailing_comma_repair_leaves_commas_inside_strings() -> None:
    text = '{"nodes": [{"id": "a", "kind": "Rule", "label": "x,]", "meta": {"note": "y, }"}},]}'
    result = extract_ir(text)
    assert result.parse_outcome == ParseOutcome.REPAIRED and "trailing_comma" in result.repairs
    assert result.document is not None and result.document.nodes[0].label == "x,]"


def test_deep_and_huge_answers_are_refused_quickly() -> None:
    assert extract_ir("[" * 100_000 + "]" * 100_000).parse_outcome == ParseOutcome.INVALID_JSON
    assert "max_json_depth" in (extract_ir("{" * 65 + "}" * 65).error or "")
    assert "max_answer_chars" in (extract_ir("x" * 2048, max_chars=1024).error or "")
    many = json.dumps({"nodes": [{"id": f"n{i}", "kind": "Rule"} for i in range(11)]})
    assert "max_ir_nodes=10" in (extract_ir(many, max_nodes=10).error or "")
    assert extract_ir(many, max_nodes=11).parse_outcome == ParseOutcome.REPAIRED


def _nested(depth: int) -> str:
    """An IR object whose containers nest exactly ``depth`` deep (document, nodes, node, meta, lists)."""
    inner = "[" * (depth - 4) + "]" * (depth - 4)
    return '{"nodes": [{"id": "R1", "kind": "Rule", "label": "x", "meta": {"deep": ' + inner + "}}]}"


def test_a_well_formed_ir_is_still_bounded_by_max_json_depth() -> None:
    # the decode-first path for a whole IR object checks the same depth the bracket scan does
    assert json.loads(_nested(12))  # the fixture is what it says
    ok = extract_ir(_nested(12), max_depth=12)
    assert ok.parse_outcome in (ParseOutcome.OK, ParseOutcome.REPAIRED) and ok.node_count == 1
    deep = extract_ir(_nested(13), max_depth=12)
    assert deep.parse_outcome == ParseOutcome.INVALID_JSON and "max_json_depth=12" in (deep.error or "")


@pytest.mark.parametrize(
    "text",
    [
        '{"nodes": [{"id": "R1", "kind": "Rule", "label": "a"}, {"id": "R1", "kind": "Rule"}]}',
        'Here it is:\n{"nodes": [{"id": "R1", "kind": "Rule"}]}\nThanks',
        '```json\n{"nodes": [{"id": "R1", "kind": "Rule"}], "meta": null}\n```',
        '  {"version": 1, "nodes": [{"id": "A", "kind": "Rule", "range": {"start_line": 1}}]}  ',
        '{"nodes": "not a list"}',
        '{"nodes": [{"id": 3}]}',
        '{"nodes": []} {"nodes": [{"id": "B", "kind": "Rule"}]}',
        _nested(64),
        _nested(65),
    ],
)
def test_decode_first_gives_the_answer_of_the_full_search(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from workers import ir_extract

    fast = extract_ir(text)
    monkeypatch.setattr(ir_extract, "_decode_ir_at", lambda *args: None)
    assert extract_ir(text) == fast


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(["```", "`", "``", "json", " ", "\t", "\n", "{", "[", "x", "é", "```json\n"]), max_size=30))
def test_fence_finder_matches_the_fence_regex(parts: list[str]) -> None:
    from workers import ir_extract

    text = "".join(parts)
    expected = [(m.start(), m.end(), m.group(2)) for m in ir_extract._FENCE_RE.finditer(text)]
    assert list(ir_extract._fences(text)) == expected


def test_depth_shortcut_accepts_at_the_limit_and_refuses_past_it() -> None:
    text = '{"nodes": [{"id": "R1", "kind": "Rule"}]}'  # three brackets, three levels deep
    assert extract_ir(text, max_depth=3).node_count == 1
    refused = extract_ir(text, max_depth=2)
    assert refused.parse_outcome == ParseOutcome.INVALID_JSON and "max_json_depth=2" in (refused.error or "")


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("where", ["meta_confidence", "extra_field", "node_extra"])
def test_non_finite_numbers_are_stored_as_null_valid_json(token: str, where: str) -> None:
    """Python's json reads NaN/Infinity; a stored ir_json must be JSON any parser reads (it held a
    bare NaN), and both validation paths write the same null."""
    node = '{"id": "a", "kind": "Rule"' + (f', "score": {token}' if where == "node_extra" else "") + "}"
    meta = f'"meta": {{"confidence": {token}}}, ' if where == "meta_confidence" else ""
    extra = f'"x": {token}, ' if where == "extra_field" else ""
    got = extract_ir("{" + meta + extra + '"nodes": [' + node + "]}")
    assert got.ir_json is not None and got.node_ids == ("a",)

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in stored ir_json")

    json.loads(got.ir_json, parse_constant=refuse)


@pytest.mark.parametrize("value", [{"extra": {"\ud800": None}, "nodes": []}, {"extra": ["a\udfff"], "nodes": []}])
def test_an_unpaired_surrogate_in_a_kept_field_is_schema_invalid_not_a_crash(value: dict) -> None:
    # json.dumps escapes the surrogate as \ud800: valid JSON, but no UTF-8 text can hold it
    got = extract_ir(json.dumps(value))
    assert got.parse_outcome is ParseOutcome.SCHEMA_INVALID
    assert got.error is not None and "lone UTF-16 surrogate" in got.error
