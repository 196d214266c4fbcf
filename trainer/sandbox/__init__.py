"""The sandbox: generated GUI tasks on real Qt widgets, rendered offscreen, with a verifier and a
scripted expert per task, as a Gymnasium environment ("Tandem/Sandbox-v0").

Importing this package imports no Qt; `trainer.sandbox.env.SandboxEnv` starts Qt on first reset.
"""
from __future__ import annotations

ENV_ID = "Tandem/Sandbox-v0"


def register() -> None:
    from trainer.sandbox.env import register as _register  # lazy: cycle with trainer.sandbox.env

    _register()
