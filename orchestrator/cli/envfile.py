"""Read ``./.env`` (KEY=VALUE lines) into the process environment at CLI start-up.

Lets API keys live in a git-ignored ``.env`` file in the working directory instead of being
exported by hand. Variables already set in the environment win over the file; values are never
printed or logged (the redactor learns them when a campaign names them in ``api_key_env``).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

from dotenv import dotenv_values


def load_env_file(path: Path, environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Set each variable of ``path`` that ``environ`` (default ``os.environ``) lacks.

    Returns the names set (never the values); a missing file sets nothing.
    """
    environ = os.environ if environ is None else environ
    if not path.is_file():
        return []
    added = []
    for name, value in dotenv_values(path).items():
        if value is not None and name not in environ:
            environ[name] = value
            added.append(name)
    return added
