"""The backend's models, as the sync protocol ships them: the announced versions (the backend
store's `models` table, whose info names the checkpoint folder), described by a chunk manifest
(agent.storage.model_files) and read chunk by chunk for whoever may read models.

A model larger than `max_bytes` is not shipped: where the backend is configured with an
OpenAI-compatible endpoint that serves it, the answer names that endpoint instead.
"""
from __future__ import annotations

import threading
from pathlib import Path

from agent.storage.model_files import CHUNK_BYTES, ModelFilesError, chunk_locations, model_manifest
from trainer.backend.store import BackendError

DEFAULT_READERS = ("supervisor", "admin")  # who runs agents; annotators record and never need weights
DEFAULT_MAX_BYTES = 4 * 2**30
SERVER_ONLY_INFO = ("path",)  # where the backend keeps a model is no client's business


def client_info(info: dict | None) -> dict:
    """What clients are told about a model version (`model_version`, `model`): its info without
    the backend's own paths."""
    return {k: v for k, v in (info or {}).items() if k not in SERVER_ONLY_INFO}


class ModelShelf:
    def __init__(self, store, *, readers=DEFAULT_READERS, max_bytes: int = DEFAULT_MAX_BYTES,
                 endpoint: dict | None = None, chunk_bytes: int = CHUNK_BYTES):
        self.store, self.readers, self.max_bytes = store, tuple(readers), int(max_bytes)
        self.chunk_bytes = int(chunk_bytes)
        self.endpoint = endpoint  # {"url": ..., "model": ...} or None
        self._manifests: dict[tuple[str, str], tuple[dict, dict]] = {}  # (version, path) -> (manifest, chunk map)
        self._lock = threading.Lock()

    def _check_reader(self, user) -> None:
        if user.role not in self.readers:
            raise BackendError("forbidden", f"role {user.role!r} may not download models "
                                            f"(readers: {', '.join(self.readers)})")

    def _model(self, version: str | None) -> tuple[str, dict]:
        found = self.store.model(version) if version else self.store.latest_model()
        if not found:
            raise BackendError("not_found", f"no model version {version!r} was announced" if version
                               else "no model has been announced on this backend yet")
        return found

    def _manifest(self, version: str, info: dict) -> tuple[dict, dict]:
        path = info.get("path")
        if not path or not Path(path).is_dir():
            raise BackendError("not_found", f"model {version}'s folder {path or '(none named)'} is not on the backend")
        key = (version, str(path))
        with self._lock:
            if key not in self._manifests:
                try:
                    m = model_manifest(path, self.chunk_bytes)
                except ModelFilesError as e:
                    raise BackendError("not_found", f"model {version}: {e}") from None
                self._manifests[key] = (m, chunk_locations(m))
            return self._manifests[key]

    def describe(self, version: str | None, user) -> dict:
        """The `model` message's fields: the manifest, or the endpoint when the model is too large."""
        self._check_reader(user)
        version, info = self._model(version)
        manifest, _ = self._manifest(version, info)
        if manifest["bytes"] > self.max_bytes:
            if self.endpoint:
                return {"version": version, "info": client_info(info), "endpoint": dict(self.endpoint)}
            raise BackendError("too_large", f"model {version} is {manifest['bytes'] / 2**20:.0f} MiB, more than this "
                                            f"backend ships ({self.max_bytes / 2**20:.0f} MiB), and no endpoint serves it")
        return {"version": version, "info": client_info(info), "manifest": manifest}

    def chunk(self, version: str, digest: str, user) -> bytes:
        """One chunk's bytes, checked against its hash (a file changed under the backend is refused)."""
        import hashlib

        self._check_reader(user)
        version, info = self._model(version)
        manifest, where = self._manifest(version, info)
        if manifest["bytes"] > self.max_bytes:
            raise BackendError("too_large", f"model {version} is not shipped by this backend")
        if digest not in where:
            raise BackendError("not_found", f"chunk {digest} is not part of model {version}")
        rel, offset, length = where[digest]
        with open(Path(info["path"]) / rel, "rb") as f:
            f.seek(offset)
            data = f.read(length)
        if hashlib.sha256(data).hexdigest() != digest:
            with self._lock:  # described again on the next request
                self._manifests.pop((version, str(info["path"])), None)
            raise BackendError("hash_mismatch", f"model {version}'s file {rel} changed on the backend since it was "
                                                "described; ask for the model again")
        return data
