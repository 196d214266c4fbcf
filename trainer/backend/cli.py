"""`python main.py backend ...`: run the sync server and manage its users.

    python main.py backend [--host 127.0.0.1] [--port 8765] [--data DIR] [--tls-cert F --tls-key F]
    python main.py backend user add NAME --role annotator|supervisor|admin   # prints the token once
    python main.py backend user list
    python main.py backend user revoke NAME
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agent.storage.store import default_data_dir
from agent.wording import command_name
from trainer.backend.server import BackendServer
from trainer.backend.store import DEFAULT_TOKEN_DAYS, BackendError, BackendStore

DEFAULT_PORT = 8765


def backend_dir(args) -> Path:
    """--data names the backend's own data directory; default: <local data dir>/backend."""
    if getattr(args, "data", None):
        return Path(args.data)

    return default_data_dir() / "backend"


def _data_arg(p) -> None:
    # SUPPRESS: an absent --data must not overwrite one given before the subcommand
    # (argparse copies a subparser's defaults over the outer parser's values).
    p.add_argument("--data", metavar="DIR", default=argparse.SUPPRESS,
                   help="the backend's data directory (default: <local data dir>/backend)")


def register(sub, common) -> None:
    p = sub.add_parser(
        "backend", help="run the sync backend (websocket server) or manage its users",
        description="With no subcommand, serves until SIGTERM/SIGINT, then finishes the writes in flight. "
        "--data is the backend's data directory (default: <data>/backend).",
    )
    _data_arg(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free port)")
    p.add_argument("--tls-cert", metavar="F", help="TLS certificate (PEM); serves wss:// with --tls-key")
    p.add_argument("--tls-key", metavar="F", help="TLS private key (PEM)")
    p.add_argument("--model-readers", default="supervisor,admin",
                   help="roles that may download models (default: supervisor,admin)")
    p.add_argument("--max-model-mb", type=float, default=4096,
                   help="models larger than this are not shipped to apps (default 4096)")
    p.add_argument("--model-endpoint", metavar="URL",
                   help="an OpenAI-compatible endpoint that serves the current model, offered for models too large to ship")
    p.add_argument("--model-endpoint-name", metavar="NAME", help="the model's name at --model-endpoint")
    p.set_defaults(func=cmd_serve)
    users = p.add_subparsers(dest="backend_command", metavar="user")
    u = users.add_parser("user", help="manage users and tokens")
    uc = u.add_subparsers(dest="user_command", metavar="add|list|revoke", required=True)
    a = uc.add_parser("add", help="add a user and print its token (shown once)")
    _data_arg(a)
    a.add_argument("name")
    a.add_argument("--role", required=True, choices=("annotator", "supervisor", "admin"))
    a.add_argument("--days", type=float, default=None,
                   help="the token expires after this many days (default 90; 0: never)")
    a.set_defaults(func=cmd_user_add)
    ls = uc.add_parser("list", help="list users, roles and revocations")
    _data_arg(ls)
    ls.set_defaults(func=cmd_user_list)
    r = uc.add_parser("revoke", help="revoke a user's token (connected sessions are cut)")
    _data_arg(r)
    r.add_argument("name")
    r.set_defaults(func=cmd_user_revoke)


def _store(args):
    return BackendStore(backend_dir(args))


def cmd_user_add(args) -> int:
    store = _store(args)
    try:
        token = store.add_user(args.name, args.role, DEFAULT_TOKEN_DAYS if args.days is None else args.days)
    except BackendError as e:
        print(f"user add failed: {e}", file=sys.stderr)
        return 2
    finally:
        store.close()
    print(token)
    print(f"added {args.role} {args.name!r}; the token above is shown only once", file=sys.stderr)
    return 0


def cmd_user_list(args) -> int:
    import time

    store = _store(args)
    users = store.users()
    store.close()
    if not users:
        print(f"no users (add one: {command_name()} backend user add NAME --role annotator)")
    for u in users:
        state = "active" if u.active else "revoked " + time.strftime("%Y-%m-%d %H:%M", time.localtime(u.revoked_at))
        print(f"{u.name}\t{u.role}\t{state}")
    return 0


def cmd_user_revoke(args) -> int:
    store = _store(args)
    try:
        store.revoke_user(args.name)
    except BackendError as e:
        print(f"revoke failed: {e}", file=sys.stderr)
        return 2
    finally:
        store.close()
    print(f"revoked {args.name!r}")
    return 0


def cmd_serve(args) -> int:
    import asyncio
    import logging
    import signal
    import ssl

    if bool(args.tls_cert) != bool(args.tls_key):
        print("--tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    ctx = None
    if args.tls_cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            ctx.load_cert_chain(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as e:
            print(f"cannot load the TLS certificate/key: {e}", file=sys.stderr)
            return 2
    readers = tuple(r.strip() for r in args.model_readers.split(",") if r.strip())
    bad = [r for r in readers if r not in ("annotator", "supervisor", "admin")]
    if bad:
        print(f"--model-readers: unknown role {bad[0]!r} (roles: annotator, supervisor, admin)", file=sys.stderr)
        return 2
    if args.max_model_mb <= 0:
        print(f"--max-model-mb must be positive, got {args.max_model_mb}", file=sys.stderr)
        return 2
    endpoint = {"url": args.model_endpoint, "model": args.model_endpoint_name} if args.model_endpoint else None
    models = {"readers": readers, "max_bytes": int(args.max_model_mb * 2**20), "endpoint": endpoint}
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    async def main() -> None:
        server = BackendServer(backend_dir(args), args.host, args.port, ssl_context=ctx, models=models)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        port = await server.start()
        scheme = "wss" if ctx else "ws"
        # The first line on stdout says where it listens (tests and scripts read it).
        print(f"listening on {scheme}://{args.host}:{port} data={server.store.root}", flush=True)
        if not server.store.users():
            print(f"no users yet: {command_name()} backend user add NAME --role annotator", flush=True)
        await stop.wait()
        print("shutting down: finishing writes in flight", flush=True)
        await server.stop()
        print("stopped", flush=True)

    try:
        asyncio.run(main())
    except OSError as e:
        print(f"cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 2
    return 0
