"""`python main.py submit EPISODE_ID|--all` queues episodes in the outbox;
`python main.py sync [--server URL --token T]` sends it and exits 0 only when every queued
episode is acknowledged. With no server given or configured, it syncs to the embedded backend
(<data>/backend), as the app does.
"""
from __future__ import annotations

import sys

from agent.cli_common import open_store
from agent.storage.secret_store import SecretStore
from agent.storage.store import NotFound
from agent.sync.client import SyncClient
from agent.sync.outbox import EMBEDDED, Outbox, server_key
from agent.wording import command_name, plural
from app.sync import SERVER_URL_KEY, TOKEN_KEY
from app.sync.embedded import start_embedded_backend


def register(sub, common) -> None:
    p = sub.add_parser("submit", parents=[common], help="queue episodes for upload to the sync server",
                       description="Queues the episodes' current versions in the outbox; `sync` sends them.")
    p.add_argument("episodes", nargs="*", metavar="EPISODE_ID")
    p.add_argument("--all", action="store_true", help="every episode the server lacks in its current revision")
    p.add_argument("--server", metavar="URL", help="with --all: the server to compare with (default: the one this "
                   "data folder syncs to)")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("sync", parents=[common], help="send the outbox to the sync server",
                       description="Exits 0 only when everything queued is acknowledged; prints what was "
                       "sent and what failed and why. Server and token default to the settings "
                       "(sync.server_url, sync.token), else the embedded backend.")
    p.add_argument("--server", metavar="URL", help="ws:// or wss:// URL of the backend")
    p.add_argument("--token", help="your token (from `backend user add`)")
    p.add_argument("--save", action="store_true", help="remember --server and --token in the settings")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="give up retrying an unreachable server after this many seconds (default 120)")
    p.add_argument("--status", action="store_true", help="only print the outbox, send nothing")
    p.set_defaults(func=cmd_sync)


def cmd_submit(args) -> int:
    if not args.episodes and not args.all:
        print("submit: give EPISODE_ID(s) or --all", file=sys.stderr)
        return 2
    store = open_store(args)
    outbox = Outbox(store, server_key(store, args.server) if args.server else None)
    if args.all:
        ids = outbox.submit_all()
        print(f"queued {len(ids)} episode(s)")
        return 0
    status = 0
    for eid in args.episodes:
        try:
            outbox.submit(eid)
            print(f"queued {eid}")
        except NotFound as e:
            print(f"submit: {e}", file=sys.stderr)
            status = 2
    return status


def print_status(outbox) -> None:
    entries = outbox.entries()
    if not entries:
        print("the outbox is empty")
    for e in entries:
        detail = e.detail
        print(f"{e.episode_id}  {e.label}" + (f" ({detail})" if detail else ""))


def cmd_sync(args) -> int:
    import asyncio
    import time

    from tqdm import tqdm

    store = open_store(args)

    outbox = Outbox(store)
    if args.status:
        print_status(outbox)
        return 0

    secrets = SecretStore(store.root)
    url = args.server or store.get_setting(SERVER_URL_KEY)
    token = args.token or secrets.get(TOKEN_KEY, store)
    if args.server and not args.token and args.server != store.get_setting(SERVER_URL_KEY):
        token = None  # the saved token belongs to another server
    if url and not token:
        print(f"sync: no token for {url}: pass --token (an admin issues one with `backend user add`)", file=sys.stderr)
        return 2
    if args.save and args.server:
        store.set_setting(SERVER_URL_KEY, args.server)
        secrets.set(TOKEN_KEY, token)  # the keyring, or a 0600 file: never tandem.db
        print(f"sync: token saved in {secrets.where}", file=sys.stderr)
    stop_embedded, alias = None, url
    if not url:
        url, token, stop_embedded = start_embedded_backend(store)
        alias = EMBEDDED
        print(f"no server configured: syncing to the embedded backend in {store.root / 'backend'}")
    client = SyncClient(store, url, token, alias=alias)  # states from here on are this server's
    client.outbox.requeue_changed(quiet=0)
    pending = outbox.pending()
    if not pending:
        n = len(client.outbox.missing())
        print("nothing to send: the outbox has no queued episodes" + (
            f"; {plural(n, 'episode')} sent to another server {'is' if n == 1 else 'are'} not on this one: "
            f"`{command_name()} submit --all` queues {'it' if n == 1 else 'them'}" if n else ""))
        if stop_embedded:
            stop_embedded()
        return 0
    print(f"sending {len(pending)} episode(s) to {url}")
    bar = tqdm(total=len(pending), unit="episode", disable=None, file=sys.stderr)
    outbox.subscribe(lambda e: bar.update(1) if e.state in ("synced", "held", "failed") and bar.n < bar.total else None)
    try:
        report = asyncio.run(client.sync(deadline=time.monotonic() + args.timeout))
    except KeyboardInterrupt:
        print("interrupted: unsent episodes stay queued", file=sys.stderr)
        return 130
    finally:
        bar.close()
        if stop_embedded:
            stop_embedded()
    for eid, status in report.sent:
        print(f"sent {eid} ({status})")
    for eid, reason in report.failed:
        entry = outbox.get(eid)
        print(f"{'HELD for privacy review' if entry and entry.state == 'held' else 'FAILED'} {eid}: {reason}")
    left = outbox.pending()
    for eid in left:
        print(f"NOT SENT {eid}: still queued")
    if left and report.connection_errors:
        print(f"last connection error: {report.connection_errors[-1]}")
    mb = report.bytes_sent / 1e6
    print(f"{len(report.sent)} acknowledged, {len(report.failed)} failed, {len(left)} still queued; "
          f"{report.blobs_sent} blob(s), {mb:.1f} MB sent")
    return 0 if not report.failed and not left else 1
