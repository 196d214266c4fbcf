"""Lossless episode bundles: a zip of episodes/<id>.json and blobs/<hash>, for moving episodes
between machines; and import of plain episode JSON whose screenshots are image files.

Import validates everything (schema, every blob's hash) before it writes anything, so a corrupt
or truncated file is refused whole, with the reason, and the store is left as it was.
"""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

from agent.schema import Episode, SchemaError
from agent.store import Store, sha256


class ImportError_(Exception):
    """A file that cannot be imported, and why."""


def write_bundle(store: Store, out_path, episode_ids) -> dict:
    out_path = Path(out_path)
    n_blobs = 0
    with zipfile.ZipFile(out_path, "w", compression=zipfile.ZIP_STORED) as z:
        seen = set()
        for eid in episode_ids:
            ep = store.load_episode(eid)
            z.writestr(f"episodes/{ep.id}.json", json.dumps(ep.to_dict()))
            for h in sorted(ep.blob_hashes() - seen):
                z.write(store.blob_path(h), f"blobs/{h}")
                seen.add(h)
                n_blobs += 1
    return {"episodes": len(list(episode_ids)), "blobs": n_blobs, "path": str(out_path)}


def _read_bundle(path: Path) -> tuple[list[Episode], dict[str, bytes]]:
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise ImportError_(f"{path}: not a readable Tandem bundle ({e})") from None
    episodes, blobs = [], {}
    with z:
        for info in z.infolist():
            name = info.filename
            try:
                data = z.read(info)
            except (zipfile.BadZipFile, OSError, EOFError) as e:
                raise ImportError_(f"{path}: member {name} is corrupt ({e})") from None
            if name.startswith("blobs/") and len(name) > 6:
                h = name[6:]
                if sha256(data) != h:
                    raise ImportError_(f"{path}: blob {h} does not match its content hash")
                blobs[h] = data
            elif name.startswith("episodes/") and name.endswith(".json"):
                try:
                    episodes.append(Episode.from_dict(json.loads(data)))
                except (json.JSONDecodeError, SchemaError) as e:
                    raise ImportError_(f"{path}: {name}: {e}") from None
    return episodes, blobs


def _read_episode_json(path: Path, store: Store) -> tuple[list[Episode], dict[str, bytes]]:
    """A JSON episode (or JSONL of episodes) whose screenshot fields are hashes already in the
    store or paths of image files relative to the JSON file."""
    text = path.read_text(encoding="utf-8")
    try:
        docs = [json.loads(text)] if path.suffix == ".json" else [json.loads(l) for l in text.splitlines() if l.strip()]
    except json.JSONDecodeError as e:
        raise ImportError_(f"{path}: not valid JSON: {e}") from None
    episodes, blobs = [], {}
    for doc in docs:
        for s in doc.get("steps", []) if isinstance(doc, dict) else []:
            obs = s.get("observation") or {}
            for key in ("screenshot", "post_screenshot"):
                ref = obs.get(key)
                if not ref or (len(ref) == 64 and store.has_blob(ref)):
                    continue
                img = (path.parent / ref).resolve()
                if not img.is_file():
                    raise ImportError_(f"{path}: step {s.get('index')}: {key} {ref!r} is neither a stored blob nor a file")
                data = img.read_bytes()
                h = sha256(data)
                blobs[h] = data
                obs[key] = h
        try:
            episodes.append(Episode.from_dict(doc))
        except SchemaError as e:
            raise ImportError_(f"{path}: {e}") from None
    return episodes, blobs


def import_file(store: Store, path) -> dict:
    path = Path(path)
    if not path.exists():
        raise ImportError_(f"{path}: no such file")
    if zipfile.is_zipfile(path):
        episodes, blobs = _read_bundle(path)
    elif path.suffix in (".json", ".jsonl"):
        episodes, blobs = _read_episode_json(path, store)
    else:
        raise ImportError_(f"{path}: expected a Tandem bundle (.zip), an episode .json or .jsonl")
    for ep in episodes:
        missing = [h for h in ep.blob_hashes() if h not in blobs and not store.has_blob(h)]
        if missing:
            raise ImportError_(f"{path}: episode {ep.id} refers to blobs that are not in the file: {missing[0]}")
    for data in blobs.values():
        store.put_blob(data)
    replaced = 0
    for ep in episodes:
        if store.has_episode(ep.id):
            replaced += 1
        store.save_episode(ep)
    return {"episodes": len(episodes), "replaced": replaced, "blobs": len(blobs)}
