"""The corpus format: parse the explicit annotations of a prompt file, the ground truth of its
structure. Part of the data contract (in ``storage`` so that the analysis scoring against it and
the simulator answering from it read one grammar without importing each other).

Grammar (``../shared/spec/ir.md``, "Annotation grammar"): one annotation per line comment
``// @<tag> <ID> [attributes]``, the line starting (after optional whitespace) with ``//``.
Tags ``rule``, ``condition``, ``breakpoint`` and ``provider`` map to node kinds Rule,
Condition, Breakpoint and Directive. Attributes are ``key=value`` tokens (``category``,
``priority``, ``trigger`` as a comma list, ``conditionRef``; unknown keys are kept), also
inside brackets (``[conditionRef=X]``). Anything else after the id (positional tokens,
free-text expressions such as ``severity_level == "critical"``) is kept as ``extra_text``
with a warning.

Input: any ``str``. Output: an ``AnnotationSet``. The parser is deterministic and total: it
never raises; whatever it cannot make sense of becomes a warning. Lines are split on ``\\n``
only (a trailing ``\\r`` is dropped), so line numbers match what editors show for LF and CRLF
files; line numbers are 1-based.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

TAG_KINDS: dict[str, str] = {
    "rule": "Rule",
    "condition": "Condition",
    "breakpoint": "Breakpoint",
    "provider": "Directive",
}

# `//` then optional spaces, `@tag`, then the rest of the line.
_ANNOTATION_LINE = re.compile(r"^\s*//\s*@([A-Za-z_][A-Za-z0-9_-]*)(.*)$", re.DOTALL)
# One token of the attribute part: a bracket group, a key=value pair (value optionally quoted),
# or any other run of non-space characters.
_TOKEN = re.compile(
    r"""\[(?P<bracket>[^\]]*)\]"""
    r"""|(?P<key>[A-Za-z_][\w.-]*)=(?P<value>"[^"]*"|'[^']*'|[^\s=\[\]"'][^\s\[\]]*)(?=\s|\[|$)"""
    r"""|(?P<other>\S+)""",
    re.DOTALL,
)
# key=value pairs inside a bracket group, separated by spaces and/or commas.
_BRACKET_PAIR = re.compile(
    r"""(?P<key>[A-Za-z_][\w.-]*)\s*=\s*(?P<value>"[^"]*"|'[^']*'|[^\s,\]]+(?:,(?![\s]*[A-Za-z_][\w.-]*\s*=)[^\s,\]]+)*)"""
)
_CONDITION_REF_KEYS = frozenset({"conditionref", "condition_ref"})


@dataclass(frozen=True)
class Annotation:
    """One annotation line.

    ``tag`` is lower-case; ``kind`` the IR node kind; ``id`` the declared id verbatim (for
    ``@provider`` the provider name); ``line`` 1-based; ``attributes`` every key=value pair
    (first value wins for a repeated key; ``conditionRef`` holds the first reference);
    ``extra_text`` the positional tokens joined by one space; ``condition_refs`` every
    conditionRef on the line, in order.
    """

    tag: str
    kind: str
    id: str
    line: int
    attributes: dict[str, str] = field(default_factory=dict)
    extra_text: str = ""
    condition_refs: tuple[str, ...] = ()


@dataclass(frozen=True)
class AnnotationSet:
    """All annotations of one file in file order (duplicates kept) plus warnings."""

    annotations: tuple[Annotation, ...]
    warnings: tuple[str, ...]

    @property
    def ids(self) -> frozenset[str]:
        """Distinct declared ids: the ground-truth node set."""
        return frozenset(a.id for a in self.annotations)

    def first_by_id(self) -> dict[str, Annotation]:
        """The first annotation of every distinct id, in file order."""
        out: dict[str, Annotation] = {}
        for a in self.annotations:
            out.setdefault(a.id, a)
        return out


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def _parse_rest(rest: str, line_no: int, warnings: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """Split the text after the id into (key, value) pairs and positional tokens."""
    pairs: list[tuple[str, str]] = []
    positional: list[str] = []
    for m in _TOKEN.finditer(rest):
        if m.group("bracket") is not None:
            inner = m.group("bracket")
            found = list(_BRACKET_PAIR.finditer(inner))
            for p in found:
                pairs.append((p.group("key"), _unquote(p.group("value"))))
            leftover = _BRACKET_PAIR.sub(" ", inner).replace(",", " ").strip()
            if leftover or not found:
                positional.append(m.group(0))
                warnings.append(f"line {line_no}: bracket group {m.group(0)!r} kept as text")
        elif m.group("key") is not None:
            pairs.append((m.group("key"), _unquote(m.group("value"))))
        else:
            positional.append(m.group("other"))
    return pairs, positional


def _parse_line(line_text: str, line_no: int, warnings: list[str]) -> Annotation | None:
    m = _ANNOTATION_LINE.match(line_text)
    if m is None:
        return None
    tag = m.group(1).lower()
    if tag not in TAG_KINDS:
        warnings.append(f"line {line_no}: unknown annotation tag @{m.group(1)} ignored")
        return None
    rest = m.group(2)
    if rest and not rest[0].isspace():
        # `@rulex` is a different tag, `@rule:X` is not a declaration we understand.
        warnings.append(f"line {line_no}: malformed @{tag} annotation ignored (no space after the tag)")
        return None
    rest = rest.strip()
    id_match = re.match(r"\S+", rest)
    if id_match is None:
        warnings.append(f"line {line_no}: @{tag} without an id ignored")
        return None
    ident = id_match.group(0)
    if ident.startswith("[") or re.fullmatch(r"[A-Za-z_][\w.-]*=.*", ident, re.DOTALL):
        warnings.append(f"line {line_no}: @{tag} without an id ignored (starts with {ident!r})")
        return None
    pairs, positional = _parse_rest(rest[id_match.end():], line_no, warnings)
    attributes: dict[str, str] = {}
    refs: list[str] = []
    for key, value in pairs:
        if key.lower() in _CONDITION_REF_KEYS:
            refs.append(value)
        if key in attributes:
            if key.lower() not in _CONDITION_REF_KEYS:
                warnings.append(f"line {line_no}: repeated attribute {key!r} on {ident!r}; first value kept")
            continue
        attributes[key] = value
    if len(refs) > 1:
        warnings.append(f"line {line_no}: {ident!r} has {len(refs)} conditionRefs: {', '.join(refs)}")
    if "priority" in attributes and not re.fullmatch(r"[+-]?\d+", attributes["priority"].strip()):
        warnings.append(f"line {line_no}: priority {attributes['priority']!r} of {ident!r} is not an integer")
    extra = " ".join(positional)
    if extra:
        warnings.append(f"line {line_no}: text after {ident!r} kept as text: {extra!r}")
    return Annotation(
        tag=tag,
        kind=TAG_KINDS[tag],
        id=ident,
        line=line_no,
        attributes=attributes,
        extra_text=extra,
        condition_refs=tuple(refs),
    )


def parse_annotations(text: str) -> AnnotationSet:
    """Parse every annotation of ``text``. Never raises; problems become warnings."""
    warnings: list[str] = []
    annotations: list[Annotation] = []
    if not isinstance(text, str):  # totality even for callers that ignore the type hint
        return AnnotationSet((), (f"input is {type(text).__name__}, not str; nothing parsed",))
    for idx, raw in enumerate(text.split("\n")):
        line_text = raw[:-1] if raw.endswith("\r") else raw
        if "//" not in line_text or "@" not in line_text:
            continue  # fast path: most lines are prose
        ann = _parse_line(line_text, idx + 1, warnings)
        if ann is not None:
            annotations.append(ann)
    first_line: dict[str, int] = {}
    for a in annotations:
        if a.id in first_line:
            warnings.append(f"line {a.line}: duplicate id {a.id!r} (first declared on line {first_line[a.id]}); counted once")
        else:
            first_line[a.id] = a.line
    for a in annotations:
        for ref in a.condition_refs:
            if ref not in first_line:
                warnings.append(f"line {a.line}: conditionRef {ref!r} of {a.id!r} names no declared id")
    return AnnotationSet(tuple(annotations), tuple(warnings))
