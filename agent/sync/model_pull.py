"""Models from the backend to this machine, and the models this machine has. Qt-free.

`pull_model` asks the backend for a model (the latest announced by default), then fetches the
chunks it lacks over the sync protocol into <data>/models/<version>.partial/, each verified by
its SHA-256 as it arrives; the files are assembled, checked and moved to <data>/models/<version>/.
A dropped connection is retried; an interrupted pull resumes where it stopped, on the next try
or the next run. A model the backend will not ship (too large) comes back as the endpoint the
backend names instead.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

from agent.model_files import ModelDownload, ModelFilesError, model_manifest, pulled_record
from agent.sync.session import Session, SyncError

WINDOW = 4  # chunks asked for at once: keeps the socket busy without holding much in memory


def models_dir(store) -> Path:
    return Path(store.root) / "models"


async def _pull_once(url: str, token: str, dest_root: Path, version: str | None, progress, ssl) -> dict:
    session = await Session.open(url, token, ssl=ssl, client="tandem-models")
    try:
        reply = (await session.request("get_model", version=version)).body
        version, info = reply["version"], reply.get("info") or {}
        if reply.get("endpoint"):
            return {"version": version, "info": info, "endpoint": reply["endpoint"]}
        dest = dest_root / version
        have = pulled_record(dest)
        if have and have.get("hash") == reply["manifest"].get("hash"):
            return {"version": version, "info": info, "path": str(dest), "hash": have["hash"], "fetched": 0,
                    "already": True}
        dl = ModelDownload(reply["manifest"], dest)
        missing, fetched, total = dl.missing(), 0, reply["manifest"]["bytes"]
        if progress:
            progress(dl.bytes_done(), total)
        for k in range(0, len(missing), WINDOW):
            batch = missing[k:k + WINDOW]
            for digest, data in zip(batch, await asyncio.gather(*(session.get_model_chunk(version, h) for h in batch))):
                dl.add(digest, data)
                fetched += len(data)
            if progress:
                progress(dl.bytes_done(), total)
        path = dl.finish({"version": version, "source": url, "info": info, "pulled_at": time.time()})
        return {"version": version, "info": info, "path": str(path), "hash": reply["manifest"]["hash"],
                "fetched": fetched, "resumed_chunks": dl.resumed, "already": False}
    finally:
        await session.close()


async def pull_model_async(url: str, token: str, dest_root, version: str | None = None, *, progress=None,
                           ssl=None, attempts: int = 3) -> dict:
    """Download a model; returns {"version", "path", "hash", "fetched", ...} or, for a model the
    backend does not ship, {"version", "endpoint": {"url", "model"}}. progress(done_bytes, total)."""
    dest_root = Path(dest_root)
    dest_root.mkdir(parents=True, exist_ok=True)
    for k in range(attempts):
        try:
            return await _pull_once(url, token, dest_root, version, progress, ssl)
        except SyncError as e:
            if e.permanent or k == attempts - 1:
                raise
            await asyncio.sleep(min(8.0, 0.5 * 2 ** k))  # the chunks so far are kept: the next try resumes
    raise AssertionError("unreachable")


def pull_model(url: str, token: str, dest_root, version: str | None = None, *, progress=None, ssl=None) -> dict:
    return asyncio.run(pull_model_async(url, token, dest_root, version, progress=progress, ssl=ssl))


def local_models(store) -> list[dict]:
    """Every model on this machine: the flywheel's versions (its registry) and pulled ones, each
    with {"version", "source", "path", "hash", "bytes", "in_use"}; hashes from agent.model_files."""
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
