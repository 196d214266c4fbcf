"""Episode bundles: a zip of episodes/<id>.json and blobs/<hash>, for moving episodes between
machines (an export writes what a sync would send, the privacy review's redacted version, unless
the originals are asked for); and import of plain episode JSON whose screenshots are image files.

Import validates everything (schema, every blob's hash) before it writes anything, so a corrupt
or truncated file is refused whole, with the reason, and the store is left as it was; the
episodes of a file are saved in one transaction. A file is untrusted input:
- a bundle's members are read in chunks against limits (MAX_MEMBER_BYTES each, MAX_TOTAL_BYTES in
  all, a compression ratio of at most MAX_RATIO: a 1 MB zip that inflates to gigabytes is refused
  before it is inflated), encrypted or unknown-compression members are refused by name, and only
  blobs an episode refers to are kept;
- an episode JSON's screenshot paths must lie inside the JSON file's folder (symlinks resolved)
  and be image files: a path to ~/.bashrc or /proc/self/environ imports nothing;
- memory stays bounded whatever the file holds: JSON is refused by its size and its count of
  values before it is parsed (parsed JSON takes ~25x its text for tiny values), a bundle's episodes
  are parsed one at a time (once to check them all, once to save them), and blobs and image files
  stream to disk in chunks, checked against their hash; a refused file leaves no blob behind.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import zipfile
import zlib
from pathlib import Path

from agent.errors import TandemError
from agent.schema import Episode, SchemaError
from agent.storage.export import check_exportable, export_view
from agent.storage.store import Store, StoreError


class ImportError_(TandemError):
    """A file that cannot be imported, and why."""


MAX_MEMBER_BYTES = 256 * 2**20  # one blob (a long audio take is the largest a recording makes)
MAX_TOTAL_BYTES = 4 * 2**30  # everything a bundle inflates to
MAX_RATIO = 100  # inflated / compressed, per member; screenshots barely compress, JSON ~10x
MAX_MEMBERS = 200_000
MAX_IMAGE_BYTES = 64 * 2**20  # a screenshot file named by an episode JSON
IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"RIFF", b"GIF8", b"BM")
MAX_JSON_BYTES = 64 * 2**20  # one episode JSON (a bundle member, a .json/.jsonl file)
# JSON values one such document may hold, bounded on its text (commas and brackets, strings
# included: an over-count) before parsing. A recorded step is ~45 values: 1M is ~20,000 steps,
# and ~100 MB once parsed, where 40 MB of `[{}, {}, ...]` (13M values) took 1.1 GB.
MAX_JSON_VALUES = 1_000_000
CHUNK = 1 << 20


def _json_text(chunks, where: str) -> bytes:
    """The bytes of a JSON document read in chunks, refused (before parsing, and as soon as the
    reading shows it) when it would parse into too much memory."""
    out, size, values = [], 0, 0
    for chunk in chunks:
        size += len(chunk)
        values += chunk.count(b",") + chunk.count(b"[") + chunk.count(b"{")
        if size > MAX_JSON_BYTES:
            raise ImportError_(f"{where}: more than {MAX_JSON_BYTES} bytes of JSON")
        if values > MAX_JSON_VALUES:
            raise ImportError_(f"{where}: holds more than {MAX_JSON_VALUES} JSON values")
        out.append(chunk)
    return b"".join(out)


def _load_json(data: bytes, where: str):
    """Parse JSON text that _json_text let through."""
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


def _member_chunks(z: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path, budget: list[int],
                   limit: int = MAX_MEMBER_BYTES):
    """A member's bytes in chunks, refused past the limits whatever its header claims."""
    name = info.filename
    if info.flag_bits & 0x1:
        raise ImportError_(f"{path}: member {name} is encrypted")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA):
        raise ImportError_(f"{path}: member {name} uses an unknown compression method ({info.compress_type})")
    ratio_limit = max(info.compress_size * MAX_RATIO, 8 * 2**20) if info.compress_type != zipfile.ZIP_STORED else limit
    limit = min(limit, budget[0], ratio_limit)
    if info.file_size > limit:
        raise ImportError_(f"{path}: member {name} inflates to {info.file_size} bytes, over the limit of {limit} "
                           f"(a compression bomb or an oversized file)")
    n = 0
    try:
        with z.open(info) as f:
            while chunk := f.read(CHUNK):
                n += len(chunk)
                if n > limit:  # the header lied about the size
                    raise ImportError_(f"{path}: member {name} inflates past the limit of {limit} bytes")
                budget[0] -= len(chunk)
                yield chunk
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError, ValueError, zlib.error) as e:
        raise ImportError_(f"{path}: member {name} is corrupt or unreadable ({e})") from None


def _member_episode(z: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path, budget: list[int]) -> Episode:
    where = f"{path}: {info.filename}"
    return _episode(_load_json(_json_text(_member_chunks(z, info, path, budget, MAX_JSON_BYTES), where), where), where)


def write_bundle(store: Store, out_path, episode_ids, *, include_originals: bool = False) -> dict:
    """A bundle of the episodes as agent.storage.export.export_view gives them: the privacy review's
    redacted version (refused, ExportRefused, when an episode has none), or with
    include_originals every episode as stored. Written beside `out_path`, then moved in place."""
    ids = list(episode_ids)
    unreviewed = check_exportable(store, ids, include_originals)
    out_path = Path(out_path)
    tmp = out_path.with_name(out_path.name + ".tmp")
    n_blobs = 0
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as z:
            seen = set()
            for eid in ids:
                ep = export_view(store, store.load_episode(eid), include_originals)
                z.writestr(f"episodes/{ep.id}.json", json.dumps(ep.to_dict()))
                for h in sorted(ep.blob_hashes() - seen):
                    z.write(store.blob_path(h), f"blobs/{h}")
                    seen.add(h)
                    n_blobs += 1
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return {"episodes": len(ids), "blobs": n_blobs, "path": str(out_path), "unreviewed": unreviewed,
            "originals": include_originals}


def _import_bundle(store: Store, path: Path) -> dict:
    """Check every episode of a bundle, then store the blobs they refer to and the episodes
    (_store_all); each episode is parsed once per pass and let go, blobs stream to disk."""
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, EOFError) as e:
        raise ImportError_(f"{path}: not a readable Tandem bundle ({e})") from None
    with z:
        infos = z.infolist()
        if len(infos) > MAX_MEMBERS:
            raise ImportError_(f"{path}: {len(infos)} members, over the limit of {MAX_MEMBERS}")
        episodes = [i for i in infos if i.filename.startswith("episodes/") and i.filename.endswith(".json")]
        members = {i.filename[6:]: i for i in infos if i.filename.startswith("blobs/")}
        budget, wanted = [MAX_TOTAL_BYTES], set()
        for info in episodes:  # the episodes first: they say which blobs are wanted
            ep = _member_episode(z, info, path, budget)
            _check_blobs(ep, path, lambda h: h in members or store.has_blob(h))
            wanted |= ep.blob_hashes()
        blobs = {h: (lambda info=members[h]: _member_chunks(z, info, path, budget)) for h in wanted if h in members}
        again = (lambda info=info: _member_episode(z, info, path, [MAX_TOTAL_BYTES]) for info in episodes)
        return _store_all(store, path, blobs, again)


def _check_blobs(ep: Episode, path: Path, present) -> None:
    missing = sorted(h for h in ep.blob_hashes() if not present(h))
    if missing:
        raise ImportError_(f"{path}: episode {ep.id} refers to blobs that are not in the file: {missing[0]}")


def _store_all(store: Store, path: Path, blobs: dict, episodes) -> dict:
    """Write the blobs (hash -> a function giving its chunks) the store lacks, then save the
    episodes (functions giving each) in one transaction. Whatever is refused on the way removes
    the blobs this import wrote: the store is left as it was, and `check` stays sound."""
    written, replaced, n = [], 0, 0
    try:
        for h, chunks in sorted(blobs.items()):
            if store.put_blob_chunks(h, chunks()):
                written.append(h)
        with store.transaction():  # the file's episodes all, or none
            for get in episodes:
                ep = get()
                replaced += store.has_episode(ep.id)
                store.save_episode(ep)
                n += 1
    except (StoreError, sqlite3.Error) as e:
        store.remove_unreferenced(written, own=written)
        raise ImportError_(f"{path}: nothing was imported: {e}") from None
    except BaseException:
        store.remove_unreferenced(written, own=written)
        raise
    return {"episodes": n, "replaced": replaced, "blobs": len(blobs)}


def _file_chunks(path: Path):
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


def _import_episode_json(store: Store, path: Path) -> dict:
    """A JSON episode (or JSONL of episodes) whose screenshot fields are hashes already in the
    store or paths of image files relative to the JSON file (hashed here, streamed to the store)."""
    raw = _json_text(_file_chunks(path), str(path))  # the whole file: its lines are parsed together
    if path.suffix == ".json":
        docs = [_load_json(raw, str(path))]
    else:
        docs = [_load_json(line, f"{path} line {k + 1}") for k, line in enumerate(raw.splitlines()) if line.strip()]
    base = path.parent.resolve()
    episodes, images = [], {}
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
                img = _image_file(base, ref, where)
                h = hashlib.sha256()
                for chunk in _file_chunks(img):
                    h.update(chunk)
                images[h.hexdigest()] = img
                obs[key] = h.hexdigest()
        episodes.append(_episode(doc, str(path)))
    for ep in episodes:
        _check_blobs(ep, path, lambda h: h in images or store.has_blob(h))
    blobs = {h: (lambda img=img: _file_chunks(img)) for h, img in images.items()}
    return _store_all(store, path, blobs, (lambda ep=ep: ep for ep in episodes))


def _image_file(base: Path, ref: str, where: str) -> Path:
    """The image file a screenshot path names, inside `base` (symlinks resolved)."""
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
    with open(img, "rb") as f:
        if not f.read(16).startswith(IMAGE_MAGIC):
            raise ImportError_(f"{where} is not an image file (PNG, JPEG, WebP, GIF or BMP)")
    return img


def import_file(store: Store, path) -> dict:
    path = Path(path)
    if not path.exists():
        raise ImportError_(f"{path}: no such file")
    if zipfile.is_zipfile(path):
        return _import_bundle(store, path)
    if path.suffix in (".json", ".jsonl"):
        return _import_episode_json(store, path)
    raise ImportError_(f"{path}: expected a Tandem bundle (.zip), an episode .json or .jsonl")
