"""`python main.py models pull --server URL --token T [--version V]` downloads a model from the
backend into <data>/models/<version>/ (resumable, verified by hash, with a progress bar);
`python main.py models list [--json]` lists the models on this machine with their hashes.
"""
from __future__ import annotations

import json
import sys

from agent.cli_common import open_store
from agent.storage.model_files import ModelFilesError
from agent.storage.secret_store import saved_secret
from agent.sync.model_pull import local_models, max_pull_bytes, models_dir, pull_model
from agent.sync.session import SyncError
from agent.wording import command_name


def register(sub, common) -> None:
    p = sub.add_parser("models", help="models on this machine; pull the backend's current model",
                       description="Models reach apps through the sync protocol: chunked, resumable, verified.")
    ms = p.add_subparsers(dest="models_command", metavar="pull|list", required=True)
    pull = ms.add_parser("pull", parents=[common], help="download a model from the backend")
    pull.add_argument("--server", metavar="URL", help="ws:// or wss:// URL of the backend (default: sync.server_url)")
    pull.add_argument("--token", help="a token whose role may read models (default: sync.token)")
    pull.add_argument("--version", help="the version to pull (default: the latest announced)")
    pull.add_argument("--max-gib", type=float, metavar="GIB",
                      help="refuse a model larger than this (default: the setting models.max_gib, else 16)")
    pull.add_argument("--json", action="store_true", help="print the result as JSON")
    pull.set_defaults(func=cmd_pull)
    ls = ms.add_parser("list", parents=[common], help="models on this machine with their hashes")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)


def cmd_pull(args) -> int:
    from tqdm import tqdm

    store = open_store(args)
    try:
        url = args.server or store.get_setting("sync.server_url")
        token = args.token or saved_secret(store, "sync.token")
        dest = models_dir(store)
        max_bytes = int(args.max_gib * 2**30) if args.max_gib else max_pull_bytes(store)
    finally:
        store.close()
    if not url or not token:
        print("models pull: give --server and --token (or save them with `sync --save`)", file=sys.stderr)
        return 2
    bar = tqdm(total=0, unit="B", unit_scale=True, desc="model", file=sys.stderr, disable=None)

    def progress(done, total):
        bar.total = total
        bar.update(done - bar.n)

    try:
        res = pull_model(url, token, dest, args.version, progress=progress, max_bytes=max_bytes)
    except (SyncError, ModelFilesError) as e:
        print(f"models pull: {e}", file=sys.stderr)
        return 1
    finally:
        bar.close()
    if args.json:
        print(json.dumps(res, default=str))
    elif res.get("endpoint"):
        ep = res["endpoint"]
        print(f"{res['version']} is not shipped by the backend (too large); it is served at {ep.get('url')} "
              f"as {ep.get('model') or '?'}: {command_name()} agent --policy endpoint --url {ep.get('url')} ...")
    else:
        how = "already here" if res["already"] else f"{res['fetched'] / 2**20:.1f} MiB fetched"
        print(f"{res['version']} -> {res['path']} ({how}; hash {res['hash']})")
    return 0


def cmd_list(args) -> int:
    store = open_store(args)
    try:
        rows = local_models(store)
    finally:
        store.close()
    if args.json:
        print(json.dumps(rows, default=str))
        return 0
    if not rows:
        print(f"no models on this machine ({command_name()} models pull --server URL --token T)")
    for r in rows:
        size = f"{r['bytes'] / 2**20:.1f} MiB" if r.get("bytes") else "-"
        mark = " (in use)" if r.get("in_use") else ""
        print(f"{r['version']:<8} {size:>10}  {(r.get('hash') or '-')[:16]}  {r['source']}{mark}  {r['path']}")
    return 0
