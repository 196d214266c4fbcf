"""The recorder's exception types (kept apart so importing them costs nothing)."""
from __future__ import annotations

from agent.errors import TandemError


class RecorderError(TandemError, RuntimeError):
    """Recording cannot start or go on; the message says why, with the offending value."""


class NothingRecorded(RecorderError):
    """The recording stopped with no step in it (every input went to the app's own window, or
    came while paused); nothing was kept. The message says why, in words for the person."""
