"""What every command-line module does the same way: open the store that --data names, and
report a refusal as one `error: ...` line with exit status 2 (main.py reports an uncaught
agent.errors.TandemError the same way)."""
from __future__ import annotations

import sys


def open_store(args):
    """The agent.storage.store.Store that --data names, or the per-user default (imported here: `--help`
    stays fast)."""
    from agent.storage.store import Store  # lazy: keeps sqlite_utils out of a light package

    return Store(getattr(args, "data", None))


def fail(msg: str, code: int = 2) -> int:
    """Print `error: msg` on stderr; returns `code` for the command to return."""
    print(f"error: {msg}", file=sys.stderr)
    return code
