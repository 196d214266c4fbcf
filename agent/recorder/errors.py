"""The recorder's one exception type (kept apart so importing it costs nothing)."""
from __future__ import annotations


class RecorderError(RuntimeError):
    """Recording cannot start or go on; the message says why, with the offending value."""
