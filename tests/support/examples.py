"""How many examples a property test draws: a fifth in the default lane (CI), all of them when
``IRBENCH_FULL_EXAMPLES=1`` (``make soak`` sets it and runs the ``property`` tests too)."""

from __future__ import annotations

import os

#: the fewest examples a reduced property test still draws
MIN_EXAMPLES = 40


def examples(full: int) -> int:
    """``full`` in the thorough lane, else a fifth of it (at least ``MIN_EXAMPLES``)."""
    if os.environ.get("IRBENCH_FULL_EXAMPLES") == "1":
        return full
    return min(full, max(MIN_EXAMPLES, full // 5))
