"""Per-cell stability metrics over the id sets of a cell's successful runs.

Definitions follow ``shared/spec/metrics.md`` exactly. Inputs are the *distinct* node ids of
each successful run (set semantics: a duplicate id within one IR counts once). All metrics are
computed from integer intersection/union counts, so a value of exactly 1.0 means exact
agreement (``x / x == 1.0`` in IEEE arithmetic and a mean of exact 1.0 values is 1.0), never a
rounding accident.

Vectorised: the R runs become a boolean run × id membership matrix ``M``; pairwise
intersections are ``M @ M.T`` and unions follow from the row sums.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Literal

import numpy as np

from analysis.errors import AnalysisError

NormaliserVariant = Literal["unicode", "ascii"]


# ---------------------------------------------------------------- helpers


def _membership(id_sets: Sequence[AbstractSet[str]]) -> np.ndarray:
    """Boolean-as-int64 matrix (runs × distinct ids over all runs); column order is arbitrary."""
    vocab: dict[str, int] = {}
    for ids in id_sets:
        for i in ids:
            vocab.setdefault(i, len(vocab))
    m = np.zeros((len(id_sets), len(vocab)), dtype=np.int64)
    for r, ids in enumerate(id_sets):
        if ids:
            m[r, [vocab[i] for i in ids]] = 1
    return m


def _require_pairs(n: int, what: str) -> None:
    if n < 2:
        raise AnalysisError(
            f"{what} needs at least 2 runs to form a pair, got {n}; "
            "cells with fewer than 2 successful runs have no stability value"
        )


def _as_sets(id_sets: Iterable[Iterable[str]]) -> list[frozenset[str]]:
    # Accept lists too: duplicates collapse here (the metrics use id *sets*).
    return [frozenset(s) for s in id_sets]


@dataclass(frozen=True)
class PairCounts:
    """Integer intersection and union sizes of every unordered pair i<j (row-major order)."""

    intersection: np.ndarray  # int64, shape (R·(R−1)/2,)
    union: np.ndarray  # int64, same shape

    def scores(self) -> np.ndarray:
        """Per-pair Jaccard; a pair of two empty sets scores 1."""
        inter = self.intersection.astype(np.float64)
        union = self.union.astype(np.float64)
        out = np.ones_like(inter)
        nz = self.union > 0
        out[nz] = inter[nz] / union[nz]
        return out

    @property
    def all_equal(self) -> bool:
        """Every pair has identical sets (exact, from integers)."""
        return bool(np.all(self.intersection == self.union))


def pair_counts(id_sets: Sequence[AbstractSet[str]]) -> PairCounts:
    """Pairwise |A∩B| and |A∪B| for all i<j, via one matrix product."""
    sets = _as_sets(id_sets)
    _require_pairs(len(sets), "node-set Jaccard")
    m = _membership(sets)
    inter = m @ m.T
    sizes = m.sum(axis=1)
    union = sizes[:, None] + sizes[None, :] - inter
    iu = np.triu_indices(len(sets), k=1)
    return PairCounts(intersection=inter[iu], union=union[iu])


# ---------------------------------------------------------------- node-set metrics


def node_set_jaccard(id_sets: Sequence[AbstractSet[str]]) -> float:
    """Mean over all unordered pairs i<j of |A∩B|/|A∪B| (two empty sets score 1).

    Input: the id sets of R ≥ 2 successful runs. Output: a fraction in [0, 1].
    Raises AnalysisError for fewer than 2 sets.
    """
    return float(np.mean(pair_counts(id_sets).scores()))


def id_stability(id_sets: Sequence[AbstractSet[str]]) -> float:
    """|∩ of all runs| / |∪ of all runs|; 1 when the union is empty.

    Input: the id sets of R ≥ 1 runs (a single run is trivially stable).
    """
    sets = _as_sets(id_sets)
    if not sets:
        raise AnalysisError("id_stability needs at least 1 run, got 0")
    union = frozenset().union(*sets)
    if not union:
        return 1.0
    inter = frozenset.intersection(*sets)
    return len(inter) / len(union)


def is_node_set_perfect(jaccard: float, id_stab: float) -> bool:
    """Both metrics equal exactly 1 (the id sets agreed; not 'identical IRs').

    Exact comparison is sound because both inputs come from integer ratios: a ratio is 1.0
    only when numerator == denominator, and a mean of pairwise ratios is 1.0 only when every
    ratio is (a single deficit of at least 1/|union| cannot round away at realistic sizes).
    """
    return jaccard == 1.0 and id_stab == 1.0


@dataclass(frozen=True)
class NodeSetAgreement:
    """Jaccard, ID-stability and the exact node-set-perfect flag of one cell."""

    runs: int
    mean_jaccard: float
    id_stability: float
    node_set_perfect: bool


def node_set_agreement(id_sets: Sequence[AbstractSet[str]]) -> NodeSetAgreement:
    """All node-set metrics at once; ``node_set_perfect`` is decided from integer counts."""
    sets = _as_sets(id_sets)
    pc = pair_counts(sets)
    union = frozenset().union(*sets)
    inter = frozenset.intersection(*sets)
    stab = 1.0 if not union else len(inter) / len(union)
    return NodeSetAgreement(
        runs=len(sets),
        mean_jaccard=float(np.mean(pc.scores())),
        id_stability=stab,
        node_set_perfect=pc.all_equal and len(inter) == len(union),
    )


# ---------------------------------------------------------------- counts


def count_agreement(counts: Sequence[int]) -> tuple[float, float]:
    """(mean over pairs of 1 − |n_i − n_j| / max(1, n_i, n_j), share of pairs with n_i == n_j).

    Input: node counts (nodes per IR, duplicates included) of R ≥ 2 runs.
    """
    n = np.asarray(counts, dtype=np.int64)
    _require_pairs(len(n), "count agreement")
    if np.any(n < 0):
        raise AnalysisError(f"node counts must be non-negative, got {n.tolist()}")
    iu = np.triu_indices(len(n), k=1)
    a, b = n[iu[0]], n[iu[1]]
    denom = np.maximum(1, np.maximum(a, b))
    agreement = 1.0 - np.abs(a - b) / denom
    return float(np.mean(agreement)), float(np.mean(a == b))


# ---------------------------------------------------------------- id normalisation

# The prefixes are English keywords; match them ASCII-only so e.g. 'ſ' or the Kelvin sign
# never case-fold into them.
_PREFIX = re.compile(r"^(?:rule|section|condition|breakpoint|directive|node)[:_-]", re.I | re.A)
_NON_ASCII_ALNUM = re.compile(r"[^a-z0-9]+")


def _unicode_word_char(ch: str) -> bool:
    # Letters (L*), digits/numbers (N*) and combining marks (M*). Marks are kept because in
    # scripts such as Devanagari vowel signs and viramas are part of the letter; splitting on
    # them would turn one word into several.
    return unicodedata.category(ch)[0] in "LNM"


def normalise_id(id: str, variant: NormaliserVariant = "unicode") -> str:
    """Map an id to its normal form (metrics.md, 'Normalised-id Jaccard').

    Steps: repeatedly strip a leading ``rule|section|condition|breakpoint|directive|node``
    followed by ``:``, ``_`` or ``-`` (case-insensitive); lower-case; every run of characters
    that are not letters/digits becomes one ``_``; trim ``_`` at both ends.
    ``variant="ascii"``: only ``[a-z0-9]`` count (the study's normaliser; non-Latin ids can
    become ``""``). ``variant="unicode"`` (default): any letter or digit counts (plus combining
    marks, see ``_unicode_word_char``), after NFC composition so composed and decomposed
    spellings of the same text agree.
    """
    if variant not in ("unicode", "ascii"):
        raise AnalysisError(f"unknown normaliser variant {variant!r}; use 'unicode' or 'ascii'")
    s = id
    while True:
        stripped = _PREFIX.sub("", s, count=1)
        if stripped == s:
            break
        s = stripped
    s = s.lower()
    if variant == "ascii":
        s = _NON_ASCII_ALNUM.sub("_", s)
    else:
        s = unicodedata.normalize("NFC", s)
        out: list[str] = []
        for ch in s:
            if _unicode_word_char(ch):
                out.append(ch)
            elif not out or out[-1] != "_":
                out.append("_")
        s = "".join(out)
    return s.strip("_")


@dataclass(frozen=True)
class NormalisedJaccard:
    """Normalised-id Jaccard of one cell and the normaliser's side effects.

    ``empty_ids``: distinct ids (summed over runs) that normalise to ``""``.
    ``colliding_ids``: distinct ids (summed over runs) that share their normal form with
    another distinct id of the same run (e.g. ``SECTION:X`` and ``section-x`` → 2).
    """

    variant: NormaliserVariant
    mean_jaccard: float
    empty_ids: int
    colliding_ids: int


def normalised_jaccard(
    id_sets: Sequence[AbstractSet[str]], variant: NormaliserVariant = "unicode",
    cache: dict[str, str] | None = None,
) -> NormalisedJaccard:
    """Mean pairwise |A∩B| / max(1, |A∪B|) over normalised id sets (R ≥ 2).

    Note the denominator: unlike the raw Jaccard, a pair of two empty normalised sets scores 0.
    Ids normalising to ``""`` are kept as the id ``""`` (as a set comprehension over the
    normaliser does), and counted in ``empty_ids``. ``cache``: a caller-owned id → normal form
    dict for this ``variant``, reused across cells (ids repeat across runs and models).
    """
    sets = _as_sets(id_sets)
    _require_pairs(len(sets), "normalised-id Jaccard")
    empty = 0
    colliding = 0
    normed: list[frozenset[str]] = []
    for ids in sets:
        if cache is None:
            forms = Counter(normalise_id(i, variant) for i in ids)
        else:
            forms = Counter(cache[i] if i in cache else cache.setdefault(i, normalise_id(i, variant))
                            for i in ids)
        empty += forms.get("", 0)
        colliding += sum(c for c in forms.values() if c > 1)
        normed.append(frozenset(forms))
    pc = pair_counts(normed)
    scores = pc.intersection / np.maximum(1, pc.union)
    return NormalisedJaccard(
        variant=variant,
        mean_jaccard=float(np.mean(scores)),
        empty_ids=empty,
        colliding_ids=colliding,
    )
