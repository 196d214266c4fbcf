"""Lossless episode bundles: a zip of episodes/<id>.json and blobs/<hash>, for moving episodes
between machines; and import of plain episode JSON whose screenshots are image files.

Import validates everything (schema, every blob's hash) before it writes anything, so a corrupt
or truncated file is refused whole, with the reason, and the store is left as it was; the
episodes of a file are saved in one transaction. A file is untrusted input:
- a bundle's members are read in chunks against limits (MAX_MEMBER_BYTES each, MAX_TOTAL_BYTES in
  all, a compression ratio of at most MAX_RATIO: a 1 MB zip that inflates to gigabytes is refused
  before it is inflated), encrypted or unknown-compression members are refused by name, and only
  blobs an episode refers to are kept;
- an episode JSON's screenshot paths must lie inside the JSON file's folder (symlinks resolved)
  and be image files: a path to ~/.bashrc or /proc/self/environ imports nothing.
"""
from __future__ import annotations

import json
import zipfile
import zlib
from pathlib import Path

from agent.schema import Episode, SchemaError
from agent.store import Store, sha256


class ImportError_(Exception):
    """A file that cannot be imported, and why."""


MAX_MEMBER_BYTES = 256 * 2**20  # one blob (a long audio take is the largest a recording makes)
MAX_TOTAL_BYTES = 4 * 2**30  # everything a bundle inflates to
MAX_RATIO = 100  # inflated / compressed, per member; screenshots barely compress, JSON ~10x
MAX_MEMBERS = 200_000
MAX_IMAGE_BYTES = 64 * 2**20  # a screenshot file named by an episode JSON
IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"RIFF", b"GIF8", b"BM")


def _load_json(data: bytes, where: str):
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ImportError_(f"{where}: not UTF-8 text ({e})") from None
    except json.JSONDecodeError as e:
        raise ImportError_(f"{where}: not valid JSON: {e}") from None
    except RecursionError:
        raise ImportError_(f"{where}: JSON nested too deeply") from None


def _episode(doc, where: str) -> Episode:
    """An Episode from a decoded document, or ImportError_ naming what is wrong with it."""
    try:
        return Episode.from_dict(doc)
    except (SchemaError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise ImportError_(f"{where}: not a valid episode ({type(e).__name__}: {e})") from None


def _read_member(z: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path, budget: list[int]) -> bytes:
    """A member's bytes, refused past the limits whatever its header claims."""
    name = info.filename
    if info.flag_bits & 0x1:
        raise ImportError_(f"{path}: member {name} is encrypted")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA):
        raise ImportError_(f"{path}: member {name} uses an unknown compression method ({info.compress_type})")
    ratio_limit = max(info.compress_size * MAX_RATIO, 8 * 2**20) if info.compress_type != zipfile.ZIP_STORED else MAX_MEMBER_BYTES
    limit = min(MAX_MEMBER_BYTES, budget[0], ratio_limit)
    if info.file_size > limit:
        raise ImportError_(f"{path}: member {name} inflates to {info.file_size} bytes, over the limit of {limit} "
                           f"(a compression bomb or an oversized file)")
    out, n = [], 0
    try:
        with z.open(info) as f:
            while chunk := f.read(1 << 20):
                n += len(chunk)
                if n > limit:  # the header lied about the size
                    raise ImportError_(f"{path}: member {name} inflates past the limit of {limit} bytes")
                out.append(chunk)
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError, ValueError, zlib.error) as e:
        raise ImportError_(f"{path}: member {name} is corrupt or unreadable ({e})") from None
    budget[0] -= n
    return b"".join(out)


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
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, EOFError) as e:
        raise ImportError_(f"{path}: not a readable Tandem bundle ({e})") from None
    episodes, blobs, budget = [], {}, [MAX_TOTAL_BYTES]
    with z:
        infos = z.infolist()
        if len(infos) > MAX_MEMBERS:
            raise ImportError_(f"{path}: {len(infos)} members, over the limit of {MAX_MEMBERS}")
        for info in infos:  # the episodes first: they say which blobs are wanted
            name = info.filename
            if name.startswith("episodes/") and name.endswith(".json"):
                doc = _load_json(_read_member(z, info, path, budget), f"{path}: {name}")
                episodes.append(_episode(doc, f"{path}: {name}"))
        wanted = set().union(*(ep.blob_hashes() for ep in episodes)) if episodes else set()
        for info in infos:
            name = info.filename
            if name.startswith("blobs/") and name[6:] in wanted:
                data = _read_member(z, info, path, budget)
                if sha256(data) != name[6:]:
                    raise ImportError_(f"{path}: blob {name[6:]} does not match its content hash")
                blobs[name[6:]] = data
    return episodes, blobs


def _read_episode_json(path: Path, store: Store) -> tuple[list[Episode], dict[str, bytes]]:
    """A JSON episode (or JSONL of episodes) whose screenshot fields are hashes already in the
    store or paths of image files relative to the JSON file."""
    raw = path.read_bytes()
    if path.suffix == ".json":
        docs = [_load_json(raw, str(path))]
    else:
        docs = [_load_json(line, f"{path} line {k + 1}") for k, line in enumerate(raw.splitlines()) if line.strip()]
    base = path.parent.resolve()
    episodes, blobs = [], {}
    for doc in docs:
        steps = doc.get("steps") if isinstance(doc, dict) else None
        for s in steps if isinstance(steps, list) else []:
            obs = s.get("observation") if isinstance(s, dict) else None
            if not isinstance(obs, dict):
                continue  # the schema check below names what is wrong
            for key in ("screenshot", "post_screenshot"):
                ref = obs.get(key)
                if not ref:
                    continue
                where = f"{path}: step {s.get('index')}: {key} {ref!r}"
                if not isinstance(ref, str):
                    raise ImportError_(f"{where} must be a blob hash or a file path")
                if len(ref) == 64 and all(c in "0123456789abcdef" for c in ref) and store.has_blob(ref):
                    continue
                try:
                    img = (base / ref).resolve()
                except (ValueError, OSError) as e:  # a NUL byte, a path too long...
                    raise ImportError_(f"{where} is not a usable path ({e})") from None
                if not img.is_relative_to(base):
                    raise ImportError_(f"{where} lies outside the JSON file's folder {base}; nothing was imported")
                if not img.is_file():
                    raise ImportError_(f"{where} is neither a stored blob nor a file")
                if img.stat().st_size > MAX_IMAGE_BYTES:
                    raise ImportError_(f"{where} is larger than {MAX_IMAGE_BYTES} bytes")
                data = img.read_bytes()
                if not data.startswith(IMAGE_MAGIC):
                    raise ImportError_(f"{where} is not an image file (PNG, JPEG, WebP, GIF or BMP)")
                h = sha256(data)
                blobs[h] = data
                obs[key] = h
        episodes.append(_episode(doc, str(path)))
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
    with store.transaction():  # the file's episodes all, or none
        for ep in episodes:
            if store.has_episode(ep.id):
                replaced += 1
            store.save_episode(ep)
    return {"episodes": len(episodes), "replaced": replaced, "blobs": len(blobs)}
