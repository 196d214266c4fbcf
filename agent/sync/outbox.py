"""The outbox: episodes submitted for upload, in the local store's database, so a queue survives
restarts and outages. A row is queued -> sending (with progress) -> synced, or failed with the
reason. Only an acknowledgement from the server makes a row synced.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

from agent.store import NotFound, Store

TABLE = "sync_outbox"
MIGRATIONS = [  # agent.store.Store.migrate; step 1 is the table as every release before migrations made it
    f"""CREATE TABLE IF NOT EXISTS "{TABLE}" ("episode_id" TEXT PRIMARY KEY, "state" TEXT, "sent_bytes" INTEGER,
        "total_bytes" INTEGER, "error" TEXT, "revision" INTEGER, "content_hash" TEXT, "ack_status" TEXT,
        "attempts" INTEGER, "queued_at" REAL, "updated_at" REAL)""",
]
STATES = ("queued", "sending", "synced", "failed")


@dataclass(frozen=True)
class OutboxEntry:
    episode_id: str
    state: str
    sent_bytes: int = 0
    total_bytes: int = 0
    error: str | None = None
    revision: int | None = None  # of the version the server acknowledged
    content_hash: str | None = None
    ack_status: str | None = None  # stored | replaced | duplicate | superseded
    attempts: int = 0
    queued_at: float = 0.0
    updated_at: float = 0.0

    @property
    def progress(self) -> float:
        return self.sent_bytes / self.total_bytes if self.total_bytes else 0.0


class Outbox:
    def __init__(self, store: Store):
        self.store = store
        self._listeners: list = []
        store.migrate(TABLE, MIGRATIONS)

    # -- listeners (the Qt bridge, the CLI's progress bar)
    def subscribe(self, fn) -> None:
        """fn(OutboxEntry) after every change; called on the thread that made the change."""
        self._listeners.append(fn)

    def _changed(self, episode_id: str) -> None:
        entry = self.get(episode_id)
        for fn in list(self._listeners):
            fn(entry)

    def _update(self, episode_id: str, **fields) -> None:
        fields["updated_at"] = time.time()
        sets = ", ".join(f"{k} = ?" for k in fields)
        self.store.execute(f"UPDATE {TABLE} SET {sets} WHERE episode_id = ?", [*fields.values(), episode_id])
        self._changed(episode_id)

    # -- queueing
    def submit(self, episode_id: str) -> OutboxEntry:
        """Queue the episode's current version (again, if it was synced or failed before)."""
        if not self.store.has_episode(episode_id):
            raise NotFound(f"no episode with id {episode_id!r} in {self.store.root}")
        now = time.time()
        self.store.upsert(TABLE, {"episode_id": episode_id, "state": "queued", "sent_bytes": 0, "total_bytes": 0,
                                  "error": None, "queued_at": now, "updated_at": now}, pk="episode_id")
        self._changed(episode_id)
        return self.get(episode_id)

    def submit_all(self) -> list[str]:
        """Queue every local episode that is not synced in its current revision."""
        out = []
        for eid in self.store.episode_ids():
            e = self.get(eid)
            if e is None or e.state in ("failed",) or (e.state == "synced" and self._changed_since(e)):
                self.submit(eid)
                out.append(eid)
            elif e.state in ("queued", "sending"):
                out.append(eid)
        return out

    def _changed_since(self, e: OutboxEntry) -> bool:
        try:
            return self.store.load_episode(e.episode_id).revision != e.revision
        except NotFound:
            return False

    def recover(self) -> int:
        """After a restart, uploads that were in flight go back to queued (the server is asked
        again which blobs it lacks, so nothing already sent is sent twice)."""
        return self.store.execute(f"UPDATE {TABLE} SET state = 'queued', sent_bytes = 0 WHERE state = 'sending'")

    # -- progress
    def mark_sending(self, episode_id: str, sent: int = 0, total: int = 0, *, new_attempt: bool = False) -> None:
        if new_attempt:
            self.store.execute(f"UPDATE {TABLE} SET attempts = attempts + 1 WHERE episode_id = ?", [episode_id])
        self._update(episode_id, state="sending", sent_bytes=sent, total_bytes=total, error=None)

    def progress(self, episode_id: str, sent: int, total: int) -> None:
        """Bytes sent so far: told to listeners only (progress is not worth a disk write)."""
        entry = self.get(episode_id)
        if entry is not None:
            entry = replace(entry, state="sending", sent_bytes=sent, total_bytes=total)
            for fn in list(self._listeners):
                fn(entry)

    def mark_synced(self, episode_id: str, revision: int, content_hash: str, status: str) -> None:
        e = self.get(episode_id)
        self._update(episode_id, state="synced", revision=revision, content_hash=content_hash, ack_status=status,
                     error=None, sent_bytes=e.total_bytes if e else 0)

    def mark_failed(self, episode_id: str, reason: str) -> None:
        self._update(episode_id, state="failed", error=reason)

    def mark_queued(self, episode_id: str, reason: str | None = None) -> None:
        """Back to the queue (a transient problem, e.g. the connection dropped); keeps the reason."""
        self._update(episode_id, state="queued", error=reason)

    # -- reading
    def get(self, episode_id: str) -> OutboxEntry | None:
        rows = self.store.query(f"SELECT * FROM {TABLE} WHERE episode_id = ?", [episode_id])
        return _entry(rows[0]) if rows else None

    def entries(self, state: str | None = None) -> list[OutboxEntry]:
        sql, params = f"SELECT * FROM {TABLE}", []
        if state:
            sql += " WHERE state = ?"
            params.append(state)
        return [_entry(r) for r in self.store.query(sql + " ORDER BY queued_at, episode_id", params)]

    def pending(self) -> list[str]:
        """Episode ids waiting to be sent, oldest first."""
        rows = self.store.query(
            f"SELECT episode_id FROM {TABLE} WHERE state IN ('queued', 'sending') ORDER BY queued_at, episode_id")
        return [r["episode_id"] for r in rows]


def _entry(r: dict) -> OutboxEntry:
    return OutboxEntry(
        episode_id=r["episode_id"], state=r["state"], sent_bytes=r["sent_bytes"] or 0,
        total_bytes=r["total_bytes"] or 0, error=r["error"], revision=r["revision"],
        content_hash=r["content_hash"], ack_status=r["ack_status"], attempts=r["attempts"] or 0,
        queued_at=r["queued_at"] or 0.0, updated_at=r["updated_at"] or 0.0)
