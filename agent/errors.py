"""The root of the errors Tandem raises on purpose.

Every error the project raises to say "this input or this state cannot be used, and here is
why" derives from `TandemError`, so a caller that only reports (the command line in main.py,
a background task in the app) catches one type and prints its message. Each class keeps the
built-in base it had (`class SchemaError(TandemError, ValueError)`), so code that catches
ValueError or RuntimeError catches it as before. Bugs (TypeError, KeyError...) stay outside.
"""
from __future__ import annotations


class TandemError(Exception):
    """An error with a message a person can act on; `exit_code` is the status a command exits
    with when it reaches the command line uncaught."""

    exit_code = 2
