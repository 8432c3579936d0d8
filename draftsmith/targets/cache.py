"""Where built and converted targets are cached."""

from __future__ import annotations

import os
from pathlib import Path


def cache_home() -> Path:
    """``$DRAFTSMITH_HOME`` (default ``~/.cache/draftsmith``)."""
    return Path(os.environ.get("DRAFTSMITH_HOME", Path.home() / ".cache" / "draftsmith"))
