"""The annotation parser on the study's 83 templates (read in place) and on generated files."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.annotations import AnnotationSet, parse_annotations
from tests.support.paths import ARTIFACT

CORPUS = ARTIFACT / "corpus" / "synthetic"
TEMPLATES = sorted(CORPUS.glob("*.prompt.rtpl"))
KINDS = {"rule": "Rule", "condition": "Condition", "breakpoint": "Breakpoint", "provider": "Directive"}
# Independent, deliberately simple reference for the declared ids: tag then first token.
REFERENCE = re.compile(r"^[ \t]*//[ \t]*@(rule|condition|breakpoint|provider)[ \t]+(\S+)", re.M)



def _read(name: str) -> AnnotationSet:
    return parse_annotations((CORPUS / name).read_text(encoding="utf-8"))


def test_every_template_parses_to_the_reference_ids_and_lines():
    assert len(TEMPLATES) == 83, f"the study's 83 templates are expected at {CORPUS}"
    total = 0
    for path in TEMPLATES:
        text = path.read_text(encoding="utf-8")
        got = parse_annotations(text)
        ref = [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in REFERENCE.finditer(text)]
        assert [(a.tag, a.id, a.line) for a in got.annotations] == ref, path.name
        assert all(a.kind == KINDS[a.tag] for a in got.annotations)
        assert got.ids == frozenset(r[1] for r in ref)
        assert len(got.ids) >= 1, path.name
        total += len(got.ids)
    assert total == sum(len({m.group(2) for m in REFERENCE.finditer(p.read_text(encoding="utf-8"))}) for p in TEMPLATES)


def test_free_text_expression_after_condition_is_kept_with_a_warning():
    s = _read("gen_011_draft_incident_postmortems.prompt.rtpl")
    ann = {a.id: a for a in s.annotations}
    assert ann["CONDITION:IncidentSeverity"].extra_text == 'severity_level == "critical"'
    assert ann["CONDITION:ActionItemsPresent"].extra_text == "actionable_items_count > 0"
    assert ann["CONDITION:IncidentSeverity"].attributes == {}
    assert any("severity_level" in w for w in s.warnings)


def test_two_condition_refs_on_one_line():
    s = _read("gen_015_detect_spam_comments.prompt.rtpl")
    a = next(a for a in s.annotations if a.id == "BREAKPOINT:url_and_caps")
    assert a.condition_refs == ("CONDITION:contains_url", "CONDITION:excessive_caps")
    assert a.attributes["conditionRef"] == "CONDITION:contains_url"
    assert any("2 conditionRefs" in w for w in s.warnings)


def test_bracketed_condition_ref_and_indented_annotation():
    s = _read("gen_002_moderate_forum_posts.prompt.rtpl")
    a = next(a for a in s.annotations if a.id == "BREAKPOINT:example_domain")
    assert a.condition_refs == ("CONDITION:offtopic_severity",)
    assert a.extra_text == ""


def test_duplicate_id_counts_once_and_warns():
    s = _read("gen_039_translate_with_tone_control.prompt.rtpl")
    dups = [a for a in s.annotations if a.id == "RULE:tone_instruction_present"]
    assert [a.line for a in dups] == [15, 23]
    assert [a.attributes["priority"] for a in dups] == ["1", "3"]
    assert len(s.ids) == len({a.id for a in s.annotations}) == len(s.annotations) - 1
    assert any("duplicate id 'RULE:tone_instruction_present'" in w for w in s.warnings)


def test_dangling_condition_ref_warns_and_provider_is_a_directive():
    s = _read("gen_010_classify_incoming_emails.prompt.rtpl")
    assert any("conditionRef 'is_spam'" in w for w in s.warnings)
    p = next(a for a in _read("customer_support.prompt.rtpl").annotations if a.tag == "provider")
    assert (p.kind, p.id, p.attributes) == ("Directive", "openai", {"model": "gpt-4o-mini"})
    q = next(a for a in _read("gen_049_write_sql_from_questions.prompt.rtpl").annotations
             if a.id == "CONDITION:question_complex")
    assert q.attributes == {"condition": "question.complexity"}


def test_quirks_in_a_small_file():
    text = (
        "Intro prose mentioning an email a@b.c // not an annotation\n"
        "  //@Rule RULE:A category=style priority=high trigger=topic:x,topic:y colour=blue\n"
        "// @breakpoint BP:1 [conditionRef=COND:Z, priority=2] stray\n"
        "// @condition\n"
        "// @todo fix this\n"
        "// @rule [category=x]\r\n"
        "/// @rule NOT_AN_ANNOTATION\n"
        "// @condition COND:Z\r\n"
    )
    s = parse_annotations(text)
    assert [(a.tag, a.id, a.line) for a in s.annotations] == [("rule", "RULE:A", 2), ("breakpoint", "BP:1", 3),
                                                              ("condition", "COND:Z", 8)]
    a = s.annotations[0]
    assert a.attributes == {"category": "style", "priority": "high", "trigger": "topic:x,topic:y", "colour": "blue"}
    b = s.annotations[1]
    assert b.attributes == {"conditionRef": "COND:Z", "priority": "2"} and b.extra_text == "stray"
    joined = "\n".join(s.warnings)
    for needle in ("not an integer", "@condition without an id", "unknown annotation tag @todo", "without an id ignored"):
        assert needle in joined
    assert "names no declared id" not in joined  # COND:Z is declared later in the file


def test_deterministic_and_empty():
    assert parse_annotations("") == AnnotationSet((), ())
    text = "// @rule X\n// @rule X\n"
    assert parse_annotations(text) == parse_annotations(text)


# ---- properties -------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(st.text())
def test_never_raises_on_arbitrary_text(text):
    s = parse_annotations(text)
    assert isinstance(s.ids, frozenset)


_fragments = st.sampled_from(["//", " ", "@rule", "@condition", "@breakpoint", "@provider", "@", "[", "]", "=",
                              "conditionRef", "priority", "\n", "\r", "\t", '"', "'", ",", "X", "é", ":", "=="])


@settings(max_examples=300, deadline=None)
@given(st.lists(_fragments | st.text(max_size=3), max_size=40).map("".join))
def test_never_raises_on_annotation_like_text(text):
    s = parse_annotations(text)
    assert all(a.id and not a.id.startswith("[") for a in s.annotations)


ID_CHARS = "ABCXYZabcxyz_:.-0123456789éßλДжü"
VALUE_CHARS = "abcXYZ_.:-019éλж"
KEY = st.from_regex(r"[a-z][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda k: k.lower() not in {"category", "priority", "trigger", "conditionref", "condition_ref"})
IDENT = st.text(ID_CHARS, min_size=1, max_size=12)
VALUE = st.text(VALUE_CHARS, min_size=1, max_size=10)


@st.composite
def annotation_specs(draw):
    tag = draw(st.sampled_from(sorted(KINDS)))
    attrs: dict[str, str] = {}
    if draw(st.booleans()):
        attrs["category"] = draw(VALUE)
    if draw(st.booleans()):
        attrs["priority"] = str(draw(st.integers(-5, 100)))
    if draw(st.booleans()):
        attrs["trigger"] = ",".join(draw(st.lists(VALUE, min_size=1, max_size=3)))
    if draw(st.booleans()):
        attrs["conditionRef"] = draw(IDENT)
    for k in draw(st.lists(KEY, max_size=2, unique=True)):
        attrs[k] = draw(VALUE)
    bracketed = {k: draw(st.booleans()) for k in attrs}
    return tag, draw(IDENT), attrs, bracketed, draw(st.sampled_from(["", " ", "\t  "])), draw(st.sampled_from(["", " "]))


def _render(tag, ident, attrs, bracketed, indent, gap):
    parts = [f"{indent}//{gap}@{tag} {ident}"]
    parts += [f"[{k}={v}]" if bracketed[k] else f"{k}={v}" for k, v in attrs.items()]
    return " ".join(parts)


PROSE = st.text(st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=40).map(
    lambda s: "p " + s if s.lstrip().startswith("//") else s)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(annotation_specs(), st.lists(PROSE, max_size=3), st.booleans()), max_size=12),
       st.lists(PROSE, max_size=3))
def test_round_trip(items, head):
    lines = list(head)
    expected = []
    for (tag, ident, attrs, bracketed, indent, gap), prose, crlf in items:
        lines.extend(prose)
        lines.append(_render(tag, ident, attrs, bracketed, indent, gap) + ("\r" if crlf else ""))
        refs = (attrs["conditionRef"],) if "conditionRef" in attrs else ()
        expected.append((tag, KINDS[tag], ident, len(lines), attrs, "", refs))
    s = parse_annotations("\n".join(lines))
    got = [(a.tag, a.kind, a.id, a.line, a.attributes, a.extra_text, a.condition_refs) for a in s.annotations]
    assert got == expected
    assert s.ids == frozenset(e[2] for e in expected)
    n_dup = len(expected) - len(s.ids)
    assert sum("duplicate id" in w for w in s.warnings) == n_dup
