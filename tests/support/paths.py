"""Where the shared reference material lives.

CI clones the repository into a folder with a copy of ``shared/`` beside it, so the default is
``<repo>/../shared``; ``IRBENCH_SHARED_DIR`` overrides it.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("IRBENCH_SHARED_DIR", REPO.parent / "shared"))
ARTIFACT = SHARED / "paper-artifact"
