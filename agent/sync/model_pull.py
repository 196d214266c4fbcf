"""Models from the backend to this machine, and the models this machine has. Qt-free.

`pull_model` asks the backend for a model (the latest announced by default), then fetches the
chunks it lacks over the sync protocol into <data>/models/<version>.partial/, each verified by
its SHA-256 as it arrives; the files are assembled, checked and moved to <data>/models/<version>/.
A dropped connection is retried; an interrupted pull resumes where it stopped, on the next try
or the next run. A model the backend will not ship (too large) comes back as the endpoint the
backend names instead.

What the backend says is checked before it touches the disk: the version must be a plain name
(agent.storage.model_files.is_model_version) and its folder a child of <data>/models/; the manifest
must pass check_manifest, with the model at most `max_bytes` (DEFAULT_MAX_PULL_BYTES unless
told otherwise). A reply or a chunk that does not arrive within `timeout` ends the try with a
SyncError naming it, and the pull is tried again (what arrived is kept).
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

from agent.retry import Backoff, retry_async
from agent.storage.model_files import (
    DEFAULT_MAX_PULL_BYTES,
    ModelDownload,
    ModelFilesError,
    check_model_version,
    inside,
    model_manifest,
    pulled_record,
)
from agent.sync.session import Session, SyncError

WINDOW = 4  # chunks asked for at once: keeps the socket busy without holding much in memory
TIMEOUT = 120.0  # seconds for the model reply, or for one window's chunks (4 x 8 MiB: 2.2 Mbit/s at least)


def models_dir(store) -> Path:
    return Path(store.root) / "models"


def max_pull_bytes(store) -> int:
    """The most one pull may write: the setting models.max_gib, else DEFAULT_MAX_PULL_BYTES."""
    gib = store.get_setting("models.max_gib")
    ok = isinstance(gib, (int, float)) and not isinstance(gib, bool) and gib > 0
    return int(gib * 2**30) if ok else DEFAULT_MAX_PULL_BYTES


async def _pull_once(url: str, token: str, dest_root: Path, version: str | None, progress, ssl, max_bytes: int,
                     timeout: float) -> dict:
    session = await Session.open(url, token, ssl=ssl, client="tandem-models")
    try:
        reply = (await session.request("get_model", timeout, version=version)).body
        if version is not None and reply["version"] != version:
            raise SyncError(f"asked the backend for model {version} and it answered {reply['version']!r:.80}",
                            permanent=True)
        version, info = check_model_version(reply["version"]), reply.get("info") or {}
        if reply.get("endpoint"):
            return {"version": version, "info": info, "endpoint": reply["endpoint"]}
        dest = inside(dest_root, version)
        have = pulled_record(dest)
        if have and have.get("hash") == (reply.get("manifest") or {}).get("hash"):
            return {"version": version, "info": info, "path": str(dest), "hash": have["hash"], "fetched": 0,
                    "already": True}
        dl = ModelDownload(reply.get("manifest"), dest, max_bytes)
        missing, fetched, total = dl.missing(), 0, dl.manifest["bytes"]
        if progress:
            progress(dl.bytes_done(), total)
        for k in range(0, len(missing), WINDOW):
            batch = missing[k:k + WINDOW]
            got = await asyncio.gather(*(session.get_model_chunk(version, h, timeout) for h in batch),
                                       return_exceptions=True)
            for digest, data in zip(batch, got, strict=True):  # what arrived is kept even when a chunk of the window did not
                if not isinstance(data, BaseException):
                    dl.add(digest, data)
                    fetched += len(data)
            failed = next((e for e in got if isinstance(e, BaseException)), None)
            if failed is not None:
                raise failed
            if progress:
                progress(dl.bytes_done(), total)
        path = dl.finish({"version": version, "source": url, "info": info, "pulled_at": time.time()})
        return {"version": version, "info": info, "path": str(path), "hash": dl.manifest["hash"],
                "fetched": fetched, "resumed_chunks": dl.resumed, "already": False}
    finally:
        await session.close()


async def pull_model_async(url: str, token: str, dest_root, version: str | None = None, *, progress=None,
                           ssl=None, attempts: int = 3, max_bytes: int = DEFAULT_MAX_PULL_BYTES,
                           timeout: float = TIMEOUT) -> dict:
    """Download a model; returns {"version", "path", "hash", "fetched", ...} or, for a model the
    backend does not ship, {"version", "endpoint": {"url", "model"}}. progress(done_bytes, total).
    ModelFilesError for a version, manifest or model this machine refuses; SyncError for the rest."""
    if version is not None:
        check_model_version(version)
    dest_root = Path(dest_root)
    dest_root.mkdir(parents=True, exist_ok=True)
    # the chunks so far are kept: the next try resumes; delays 0.5, 1, 2, ... 8 s
    return await retry_async(lambda: _pull_once(url, token, dest_root, version, progress, ssl, max_bytes, timeout),
                             attempts=attempts, backoff=Backoff(0.5, 8.0, jitter=0.0),
                             retry_if=lambda e: isinstance(e, SyncError) and not e.permanent)


def pull_model(url: str, token: str, dest_root, version: str | None = None, *, progress=None, ssl=None,
               **kw) -> dict:
    return asyncio.run(pull_model_async(url, token, dest_root, version, progress=progress, ssl=ssl, **kw))


def local_models(store) -> list[dict]:
    """Every model on this machine: the flywheel's versions (its registry) and pulled ones, each
    with {"version", "source", "path", "hash", "bytes", "in_use"}; hashes from agent.storage.model_files."""
    out = []
    in_use = store.get_setting("models.in_use")
    if store.has_table("flywheel_models"):  # the flywheel's registry (trainer.flywheel.registry), read only
        for v in store.query("SELECT version, status, path FROM flywheel_models ORDER BY created_at, version"):
            row = {"version": v["version"], "source": "flywheel", "status": v["status"], "path": v["path"]}
            try:
                m = model_manifest(v["path"])
                row.update(hash=m["hash"], bytes=m["bytes"])
            except ModelFilesError as e:
                row.update(hash=None, bytes=None, problem=str(e))
            out.append(row)
    root = models_dir(store)
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        rec = pulled_record(d)
        if d.is_dir() and rec:
            out.append({"version": rec.get("version", d.name), "source": f"pulled from {rec.get('source', '?')}",
                        "path": str(d), "hash": rec.get("hash"), "bytes": rec.get("bytes")})
        elif d.name.endswith(".partial"):
            out.append({"version": d.name[: -len(".partial")], "source": "incomplete download (resumes on pull)",
                        "path": str(d), "hash": None, "bytes": None})
    for row in out:
        row["in_use"] = row["version"] == in_use and row["source"] != "incomplete download (resumes on pull)"
    return out
