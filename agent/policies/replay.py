"""Replay: model responses read from a JSONL file, one JSON string (the raw response) a line.

For tests and demos: it runs the whole real path (prompt and messages built, the response parsed
exactly as a model's would be) with the model's text scripted."""
from __future__ import annotations

import json
from pathlib import Path

from agent.policies.base import Policy, PolicyError


def load_responses(path) -> list[str]:
    """The responses in a replay file; a line that is not a JSON string is an error naming it."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise PolicyError(f"cannot read the replay file {str(p)!r}: {e.strerror or e}") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise PolicyError(f"{p}:{n}: not JSON ({e.msg}); each line must be one JSON string") from None
        if not isinstance(value, str):
            raise PolicyError(f"{p}:{n}: expected a JSON string (the raw response), got {type(value).__name__}")
        out.append(value)
    return out


class ReplayPolicy(Policy):
    name = "replay"

    def __init__(self, responses, **kw):
        """responses: a JSONL file path, or a list of raw response strings."""
        super().__init__(**kw)
        self.responses = list(responses) if isinstance(responses, (list, tuple)) else load_responses(responses)
        self.position = 0

    def generate(self, messages) -> str:
        if self.position >= len(self.responses):
            raise PolicyError(f"the replay ran out after {len(self.responses)} responses")
        text = self.responses[self.position]
        self.position += 1
        return text
