"""Tandem: `python main.py` opens the app; subcommands run everything headless.

Each command module below has `register(subparsers, common)`, which adds its subcommands with
`set_defaults(func=...)`; a func takes the parsed args and returns an exit status. Modules
import their heavy dependencies inside the functions, so `--help` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from agent.errors import TandemError
from agent.wording import command_name
from app.main import run_app

COMMANDS = [
    "agent.cli",  # parse, import, export, info, check
    "agent.run.cli",  # agent: run the agent with a policy, a gate and the store
    "agent.recorder.cli",  # record: record a demonstration headless, re-reduce, transcribe
    "trainer.rollout.sandbox_cli",  # sandbox: show, families, generate, eval
    "trainer.backend.cli",  # backend: the sync server; backend user add|list|revoke
    "app.sync.cli",  # submit, sync; the sync client behind `agent --publish`
    "app.sync.models_cli",  # models pull, models list
    "agent.redaction.cli",  # redact: find and blur personal data before upload
    "trainer.learn.cli",  # train: sft, ct, ppo, default
    "trainer.flywheel.cli",  # flywheel: run, status, merge, undo, plot
]


def build_parser() -> argparse.ArgumentParser:
    data_help = "data directory (default: $TANDEM_DATA or the per-user data folder)"
    # Subcommands take --data too; SUPPRESS keeps their default from overwriting a --data
    # given before the subcommand.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data", metavar="DIR", default=argparse.SUPPRESS, help=data_help)
    parser = argparse.ArgumentParser(
        prog=command_name(),
        description="Tandem: collect data for, supervise and train computer-use agents. "
        "With no command, opens the desktop app.",
    )
    parser.add_argument("--data", metavar="DIR", default=None, help=data_help)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    app = sub.add_parser("app", parents=[common], help="open the desktop app (the default)")
    app.add_argument("--server", help="sync server URL (default: an embedded backend on loopback)")
    app.set_defaults(func=_run_app)
    for name in COMMANDS:
        importlib.import_module(name).register(sub, common)
    return parser


def _run_app(args) -> int:
    return run_app(args)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args.server = None
    try:
        return int((args.func if args.command else _run_app)(args) or 0)
    except TandemError as e:  # bad input or state, said in words: one line, no traceback
        print(f"error: {one_line(e)}", file=sys.stderr)
        return e.exit_code


def one_line(e: BaseException) -> str:
    """The error's message on one line (a multi-line message's lines joined by "; ")."""
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    return "; ".join(lines) or type(e).__name__


if __name__ == "__main__":
    sys.exit(main())
