"""The root of the trainer's errors: `TrainerError`, a agent.errors.TandemError, so the command
line reports every one of them the same way; each subclass keeps its built-in base too."""
from __future__ import annotations

from agent.errors import TandemError


class TrainerError(TandemError):
    """A training, rollout, sandbox, flywheel or backend error with a message a person can act on."""
