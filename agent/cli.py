"""Core subcommands: parse, import, export, info, check."""
from __future__ import annotations

import json
import sys

from agent import coords
from agent.cli_common import open_store
from agent.grammar import parse_response, to_normalized
from agent.schema import ScreenGeometry
from agent.storage.bundle import ImportError_, import_file, write_bundle
from agent.storage.export import ExportRefused, export_jsonl
from agent.storage.store import NotFound
from agent.wording import plural


def _missing_store(args) -> str | None:
    """For commands that only read: the reason to stop when --data names a folder that holds no
    Tandem data (a typo would otherwise create an empty store and report nothing in it)."""
    from pathlib import Path

    data = getattr(args, "data", None)
    if data and not (Path(data) / "tandem.db").is_file():
        return f"{data} holds no Tandem data (no tandem.db there); check the --data path"
    return None


def register(sub, common) -> None:
    p = sub.add_parser(
        "parse",
        parents=[common],
        help="parse a model response (stdin) and print its actions in screen pixels as JSON",
        description="Reads a UI-TARS-style response on standard input and prints "
        '{"thought", "actions": [{"action", "args", "screen_points"}]} or {"error"} (exit 2).',
    )
    p.add_argument("--width", type=int, required=True, help="screenshot width in pixels")
    p.add_argument("--height", type=int, required=True, help="screenshot height in pixels")
    p.add_argument("--coords", choices=coords.SPACES, default=coords.SMART_RESIZE, help="the model's coordinate space")
    p.add_argument("--scale", type=float, default=1.0, help="display scale factor (physical/logical pixels)")
    p.add_argument("--platform", choices=("desktop", "android", "terminal"), help="refuse actions not on this platform")
    p.set_defaults(func=cmd_parse)

    p = sub.add_parser("import", parents=[common], help="import a Tandem bundle (.zip) or episode JSON into the store")
    p.add_argument("file")
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("export", parents=[common], help="export episodes as training JSONL or as a bundle")
    p.add_argument("--out", required=True, help="output file (.jsonl for training samples, .zip for a bundle)")
    p.add_argument("--episode", action="append", dest="episodes", metavar="ID", help="episode id (repeatable; default: all)")
    p.add_argument("--route", choices=("sft", "ct", "rejected", "unscored"), help="only episodes routed here")
    p.add_argument("--coords", choices=coords.SPACES, default=coords.SMART_RESIZE)
    p.add_argument("--images", type=int, default=5, help="screenshots of history per sample (default 5)")
    p.add_argument("--include-originals", action="store_true",
                   help="write every episode as stored, original screenshots and text included (default: the privacy "
                        "review's redacted version, what a sync sends; refused when a recording has no approved review)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("info", parents=[common], help="show the data location and counts")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("check", parents=[common], help="check the store's integrity (database and blob hashes)")
    p.add_argument("--fix", action="store_true", help="remove unused blobs and leftover temp files")
    p.set_defaults(func=cmd_check)


def parse_to_json(text: str, width: int, height: int, space: str, scale: float = 1.0, platform=None) -> tuple[dict, bool]:
    """The `parse` command's result: (json_dict, ok)."""
    if width <= 0 or height <= 0 or not (0 < scale < float("inf")):  # `not (...)` also catches NaN
        return {"error": f"--width, --height and --scale must be positive finite numbers (got {width}, {height}, {scale})"}, False
    parsed = parse_response(text, platform)
    if not parsed:
        return {"error": parsed.reason}, False
    norm = to_normalized(parsed, space, width, height)
    if not norm:
        return {"error": norm.reason}, False
    geometry = ScreenGeometry.simple(width, height, scale)
    actions = []
    for model_a, norm_a in zip(parsed.actions, norm.actions, strict=True):
        args = {k: (list(v) if isinstance(v, tuple) else v) for k, v in model_a.args.items()}
        pts = [list(coords.normalized_to_screen(p, geometry)) for p in norm_a.points()]
        actions.append({"action": model_a.name, "args": args, "screen_points": pts})
    return {"thought": parsed.thought, "actions": actions}, True


def cmd_parse(args) -> int:
    text = sys.stdin.read()
    out, ok = parse_to_json(text, args.width, args.height, args.coords, args.scale, args.platform)
    print(json.dumps(out, ensure_ascii=False))
    return 0 if ok else 2


def cmd_import(args) -> int:
    try:
        res = import_file(open_store(args), args.file)
    except ImportError_ as e:
        print(f"import failed: {e}", file=sys.stderr)
        return 2
    print(f"imported {res['episodes']} episode(s) ({res['replaced']} replaced), {res['blobs']} blob(s)")
    return 0


def cmd_export(args) -> int:
    from tqdm import tqdm

    missing = _missing_store(args)
    if missing:
        print(f"export failed: {missing}", file=sys.stderr)
        return 2
    store = open_store(args)
    ids = args.episodes or [e.id for e in store.list_episodes(route=args.route)]
    try:
        if args.out.endswith(".zip"):
            res = write_bundle(store, args.out, ids, include_originals=args.include_originals)
            print(f"wrote {plural(res['episodes'], 'episode')} and {plural(res['blobs'], 'blob')} to {res['path']}")
        else:
            with tqdm(total=len(ids), unit="episode", disable=None) as bar:
                res = export_jsonl(
                    store, args.out, ids, space=args.coords, max_images=args.images,
                    progress=lambda done, total: bar.update(done - bar.n), include_originals=args.include_originals,
                )
            print(f"wrote {plural(res['samples'], 'sample')} from {plural(res['episodes'], 'episode')}, "
                  f"{plural(res['images'], 'image')} to {res['path']}")
        if res["originals"]:
            print(f"warning: written as stored, original screenshots and text included "
                  f"({len(res['unreviewed'])} without an approved privacy review)", file=sys.stderr)
    except (NotFound, ExportRefused) as e:
        print(f"export failed: {e}", file=sys.stderr)
        return 2
    return 0


def cmd_info(args) -> int:
    missing = _missing_store(args)
    if missing:  # nothing is created; an empty answer, said plainly
        print(f"warning: {missing}", file=sys.stderr)
        c = {"episodes": 0, "steps": 0, "blobs": 0, "blob_bytes": 0, "by_kind": {}, "by_route": {}, "data": args.data,
             "exists": False}
        print(json.dumps(c) if args.json else f"data location: {args.data} (empty: no Tandem data there)")
        return 0
    store = open_store(args)
    c = store.counts()
    c["data"] = str(store.root)
    if args.json:
        print(json.dumps(c))
        return 0
    print(f"data location: {store.root}")
    print(f"episodes: {c['episodes']}  steps: {c['steps']}  blobs: {c['blobs']} ({c['blob_bytes'] / 1e6:.1f} MB)")
    for k, n in sorted(c["by_kind"].items()):
        print(f"  {k}: {n}")
    if c["by_route"]:
        print("routes: " + ", ".join(f"{k} {n}" for k, n in sorted(c["by_route"].items())))
    return 0


def cmd_check(args) -> int:
    missing = _missing_store(args)
    if missing:
        print(f"check failed: {missing}", file=sys.stderr)
        return 2
    store = open_store(args)
    problems = store.check()
    for p in problems:
        print(p)
    if args.fix:
        n = store.gc()
        print(f"removed {n} unused file(s)")
        problems = store.check()
    print("store is sound" if not problems else f"{len(problems)} problem(s)")
    return 0 if not problems else 1
