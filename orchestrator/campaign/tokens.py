"""Counting prompt tokens before a call, for the plan preview.

No tokenizer works offline on a bare install (``tiktoken`` fetches its tables on first use, a
Hugging Face ``tokenizer.json`` comes from a hub, a llama.cpp server's ``/tokenize`` is a call),
so the counter here is characters ÷ ``chars_per_token``, and it states its error. A real
tokenizer plugs in as another ``TokenCounter``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class TokenCounter(Protocol):
    """Counts the tokens of each text, and says how (method and error bound, one line)."""

    def count_many(self, texts: Sequence[str]) -> list[int]: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class CharsPerToken:
    """``ceil(characters / chars_per_token)``, the count the simulator reports itself.

    ``error_factor``: the stated bound, a real tokenizer's count lies within a factor of it of
    this estimate (4 characters a token is typical of English prose under BPE tokenizers; code,
    numbers and non-Latin scripts take more tokens a character)."""

    chars_per_token: float = 4.0
    error_factor: float = 2.0

    def count_many(self, texts: Sequence[str]) -> list[int]:
        return [math.ceil(len(t) / self.chars_per_token) for t in texts]

    def describe(self) -> str:
        return (f"estimated as characters / {self.chars_per_token:g} (no offline tokenizer): a model's own "
                f"tokenizer may count up to {self.error_factor:g}x more or fewer, plus a few template tokens a call")
