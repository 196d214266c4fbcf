"""The embedded backend: with no server configured, the app runs the backend itself, on
loopback in a background thread, with its data under <local data>/backend. Qt-free."""
from __future__ import annotations

from agent.storage.secret_store import SecretStore
from agent.storage.store import Store
from trainer.backend.server_thread import start_in_thread
from trainer.backend.store import BackendError, BackendStore

EMBEDDED_TOKEN_KEY = "sync.embedded_token"
LOCAL_USER = "local"
EMBEDDED_TOKEN_DAYS = 30


def start_embedded_backend(store: Store, host: str = "127.0.0.1", port: int = 0):
    """Start it and return (url, token, stop_fn). The local user is an admin (it uploads,
    reads and supervises on this machine); its token is kept in the local settings and
    re-issued if the backend no longer accepts it."""
    backend = start_in_thread(store.root / "backend", host, port)
    bstore = backend.store
    secrets = SecretStore(store.root)
    token = secrets.get(EMBEDDED_TOKEN_KEY, store)
    try:
        if not token:
            raise BackendError("auth_failed", "no token yet")
        bstore.authenticate(token)
    except BackendError:
        if bstore.is_active(LOCAL_USER):
            bstore.revoke_user(LOCAL_USER)
        token = bstore.add_user(LOCAL_USER, "admin", days=EMBEDDED_TOKEN_DAYS)  # re-issued here once expired
        secrets.set(EMBEDDED_TOKEN_KEY, token)
    return backend.url, token, backend.stop


def embedded_model_path(store: Store, version: str) -> str | None:
    """The folder of a model the embedded backend announced, when it is on this machine (clients
    are not told the backend's paths: the app running the backend reads them from its store)."""
    from pathlib import Path

    bstore = BackendStore(store.root / "backend")
    try:
        found = bstore.model(version)
    finally:
        bstore.close()
    path = found[1].get("path") if found else None
    return str(path) if path and Path(path).is_dir() else None
