"""Telling the apps about a new current model, through the backend.

A running backend is reached over the sync protocol as an admin: `announce_model` makes the
server store the version and push `model_version` to every connected client (apps switch to it
from there). With no running backend but its data directory at hand, the announcement is
written to the backend's store and every client hears it on its next connection.
Where the backend is comes from arguments, the store's settings ("flywheel.backend_url",
"flywheel.backend_token", "flywheel.backend_data") or $TANDEM_BACKEND_URL / $TANDEM_BACKEND_TOKEN;
a flywheel that runs on a backend's own data folder (`flywheel run --data B`) records its models
there, and the backend serving B pushes them to its clients within a second.
"""
from __future__ import annotations

import asyncio
import os

from agent.sync.session import RequestRefused, Session, SyncError
from trainer.backend.store import BackendStore
from trainer.flywheel import FlywheelError


def backend_target(store=None, url: str | None = None, token: str | None = None, data: str | None = None) -> dict:
    """{"url", "token", "data"} from the arguments, else the store's settings, else the environment."""
    get = (lambda k: store.get_setting(k)) if store is not None else (lambda k: None)
    # a URL and its token come from the same place: a token is never sent to another source's server
    for src_url, src_token in ((url, token), (get("flywheel.backend_url"), get("flywheel.backend_token")),
                               (os.environ.get("TANDEM_BACKEND_URL"), os.environ.get("TANDEM_BACKEND_TOKEN"))):
        if src_url:
            return {"url": src_url, "token": token or src_token, "data": data or get("flywheel.backend_data")}
    own = str(store.root) if store is not None and is_backend_store(store) else None
    return {"url": None, "token": token, "data": data or get("flywheel.backend_data") or own}


def is_backend_store(store) -> bool:
    """Is this data folder a backend's (it has the backend's users and announced models)?"""
    return store.has_table("users") and store.has_table("models")


async def announce_over_wire(url: str, token: str, version: str, info: dict, timeout: float = 15.0) -> None:
    """hello -> welcome -> announce_model -> ok, through the sync client's session
    (agent.sync.session: trainer never imports app)."""
    try:
        session = await Session.open(url, token, timeout=timeout, client="tandem-flywheel")
    except SyncError as e:  # refused at the handshake (a bad token), or not reached at all
        if e.code is not None:
            raise FlywheelError(f"the backend at {url} refused the announcement of {version}: {e}") from None
        raise FlywheelError(f"cannot announce {version} to {url}: {e}") from None
    try:
        await session.request("announce_model", timeout=timeout, version=version, info=info)
    except RequestRefused as e:
        reason = str(e).removeprefix("announce_model: ")
        raise FlywheelError(f"the backend at {url} refused the announcement of {version}: {reason}") from None
    except SyncError as e:  # the connection closed, or no reply in time
        raise FlywheelError(f"cannot announce {version} to {url}: {e}") from None
    finally:
        await session.close()


def announce(version: str, info: dict, *, target: dict) -> str:
    """Announce through whatever the target names; returns what was done, for the log."""
    if target.get("url"):
        if not target.get("token"):
            raise FlywheelError(f"announcing to {target['url']} needs an admin token (flywheel.backend_token)")
        asyncio.run(announce_over_wire(target["url"], target["token"], version, info))
        return f"announced {version} to the backend at {target['url']}"
    if target.get("data"):
        bs = BackendStore(target["data"])
        try:
            bs.announce_model(version, info)
        finally:
            bs.close()
        return f"recorded {version} in the backend store {target['data']} (clients hear it when they connect)"
    return "no backend configured: not announced"
