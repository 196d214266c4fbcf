"""The outbox: episodes submitted for upload, in the local store's database, so a queue survives
restarts and outages, and what each server has acknowledged. A row is queued -> sending (with
progress) -> synced, failed with the reason, or held (the privacy review must pass first). Only an
acknowledgement from the server makes a row synced.

What a server has is kept per server (`sync_acks`: the revision each one acknowledged), under
the server's lasting id from its welcome (its URL for a server that names none). So an episode
edited after upload reads "changed since sync" until the new revision is acknowledged (the sync
worker re-queues it once the edits have been quiet a moment: `requeue_changed`), and switching to
another server shows what that one lacks (`missing`) instead of "synced".
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

from agent.storage.store import NotFound, Store

TABLE = "sync_outbox"
ACKS = "sync_acks"
SERVER_KEY = "sync.server"  # setting: the key of the server this store syncs to now (its id once it said it)
SERVER_IDS_KEY = "sync.server_ids"  # setting: {URL or EMBEDDED: the id that server's welcome named}
EMBEDDED = "embedded"  # the app's built-in backend before it named itself (its URL changes every start)
MIGRATIONS = [  # agent.storage.store.Store.migrate; step 1 is the table as every release before migrations made it
    f"""CREATE TABLE IF NOT EXISTS "{TABLE}" ("episode_id" TEXT PRIMARY KEY, "state" TEXT, "sent_bytes" INTEGER,
        "total_bytes" INTEGER, "error" TEXT, "revision" INTEGER, "content_hash" TEXT, "ack_status" TEXT,
        "attempts" INTEGER, "queued_at" REAL, "updated_at" REAL)""",
    # acknowledgements per server; a store from before kept one server's: it belongs to the server
    # URL it was saved for (the embedded backend when none was), renamed to its id at the next welcome
    f"""CREATE TABLE IF NOT EXISTS "{ACKS}" ("server" TEXT, "episode_id" TEXT, "revision" INTEGER,
        "content_hash" TEXT, "ack_status" TEXT, "at" REAL, PRIMARY KEY ("server", "episode_id"));
    INSERT OR IGNORE INTO "{ACKS}" (server, episode_id, revision, content_hash, ack_status, at)
        SELECT COALESCE((SELECT json_extract(value, '$') FROM settings WHERE key = 'sync.server_url'), '{EMBEDDED}'),
               episode_id, revision, content_hash, ack_status, updated_at
        FROM "{TABLE}" WHERE state = 'synced' AND revision IS NOT NULL""",
]
STATES = ("queued", "sending", "synced", "changed", "missing", "held", "failed")
LABELS = {"changed": "changed since sync", "missing": "not on this server", "held": "held for privacy review"}
QUIET_S = 3.0  # an edited episode is re-queued once it has not changed for this long


def state_label(state: str | None) -> str:
    """What a person reads for a state."""
    return LABELS.get(state, state or "")


def server_key(store: Store, alias: str) -> str:
    """The key a server's acknowledgements are kept under: the id its welcome named, once one did
    (alias: its URL, or EMBEDDED for the app's built-in backend), else the alias itself."""
    return (store.get_setting(SERVER_IDS_KEY) or {}).get(alias) or alias


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
    local_revision: int | None = None  # the episode's revision in the local store now

    @property
    def progress(self) -> float:
        return self.sent_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def changed(self) -> bool:
        """The server has an earlier revision than the local one."""
        return self.revision is not None and self.local_revision is not None and self.local_revision > self.revision

    @property
    def label(self) -> str:
        """The state as the Library and the Sync page say it."""
        if self.changed and self.state in ("queued", "sending"):
            return f"changed since sync, {self.state}"
        return state_label(self.state)

    @property
    def detail(self) -> str:
        """The reason of a failure or hold, or which revision the server has."""
        if self.state in ("failed", "held"):
            return self.error or state_label(self.state)
        if self.state == "synced":
            return f"{self.ack_status}, revision {self.revision}"
        if self.state == "missing":
            return "sent to another server; this one does not have it (Submit all unsynced episodes sends it)"
        if self.changed:
            waiting = "it is sent again once the edits stop" if self.state == "changed" else "it is being sent again"
            return f"edited here (revision {self.local_revision}); the server has revision {self.revision}: {waiting}"
        return self.error or ""


class Outbox:
    def __init__(self, store: Store, server: str | None = None):
        """`server`: the key whose acknowledgements states are about; None: the server this
        store syncs to now (the last one a client chose or was welcomed by)."""
        self.store = store
        self._server = server
        self._listeners: list = []
        store.migrate(TABLE, MIGRATIONS)

    @property
    def server(self) -> str | None:
        return self._server or self.store.get_setting(SERVER_KEY)

    def use_server(self, alias: str) -> str:
        """From now on this store syncs to the server at `alias` (a URL, or EMBEDDED); its key."""
        self._server = server_key(self.store, alias)
        self.store.set_setting(SERVER_KEY, self._server)
        return self._server

    def bind(self, alias: str, server_id: str | None) -> None:
        """The server at `alias` welcomed us naming its lasting id: what was kept under the alias
        (a migrated store's acknowledgements, a server first reached before it said its id) moves
        to the id, which the alias is known by from now on."""
        key = server_id or alias
        if key != alias:
            with self.store.transaction():
                self.store.execute(f"INSERT OR IGNORE INTO {ACKS} (server, episode_id, revision, content_hash, ack_status, at) "
                                   f"SELECT ?, episode_id, revision, content_hash, ack_status, at FROM {ACKS} WHERE server = ?",
                                   [key, alias])
                self.store.execute(f"DELETE FROM {ACKS} WHERE server = ?", [alias])
                known = self.store.get_setting(SERVER_IDS_KEY) or {}
                if known.get(alias) != key:
                    self.store.set_setting(SERVER_IDS_KEY, {**known, alias: key})
        self._server = key
        if self.store.get_setting(SERVER_KEY) != key:
            self.store.set_setting(SERVER_KEY, key)

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
        """Queue every local episode that the server lacks in its current revision (never sent,
        sent to another server only, changed since, failed or held before)."""
        entries = {e.episode_id: e for e in self.entries()}
        out = []
        for eid in self.store.episode_ids():
            e = entries.get(eid)
            if e is None or e.state in ("failed", "held", "changed", "missing"):
                self.submit(eid)
            elif e.state == "synced":
                continue
            out.append(eid)
        return out

    def missing(self) -> list[str]:
        """Episodes sent to another server that this one does not have (and that are not queued):
        what switching to it offers to send."""
        return [e.episode_id for e in self.entries() if e.state == "missing"]

    def requeue_changed(self, quiet: float = QUIET_S) -> list[str]:
        """Queue again the episodes this server has in an earlier revision than the local one,
        once nobody has changed them for `quiet` seconds (an annotator's edits go as one upload)."""
        before = time.time() - quiet
        rows = self.store.query(
            f"SELECT o.episode_id FROM {TABLE} o JOIN episodes e ON e.id = o.episode_id JOIN {ACKS} a "
            f"ON a.episode_id = o.episode_id AND a.server = ? WHERE o.state = 'synced' AND e.revision > a.revision "
            f"AND COALESCE(e.updated_at, 0) <= ?", [self.server, before])
        for r in rows:
            self.submit(r["episode_id"])
        return [r["episode_id"] for r in rows]

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
        """The server acknowledged `revision`: synced to it (and recorded as what it has)."""
        e = self.get(episode_id)
        now = time.time()
        with self.store.transaction():
            if self.server is not None:
                self.store.upsert(ACKS, {"server": self.server, "episode_id": episode_id, "revision": revision,
                                         "content_hash": content_hash, "ack_status": status, "at": now},
                                  pk=("server", "episode_id"))
            self._update(episode_id, state="synced", revision=revision, content_hash=content_hash, ack_status=status,
                         error=None, sent_bytes=e.total_bytes if e else 0)

    def mark_failed(self, episode_id: str, reason: str) -> None:
        self._update(episode_id, state="failed", error=reason)

    def mark_held(self, episode_id: str, reason: str) -> None:
        """Not sent until its privacy review passes (`reason` says what to do)."""
        self._update(episode_id, state="held", error=reason)

    def mark_queued(self, episode_id: str, reason: str | None = None) -> None:
        """Back to the queue (a transient problem, e.g. the connection dropped); keeps the reason."""
        self._update(episode_id, state="queued", error=reason)

    # -- reading
    def _select(self, where: str, params: list) -> list[OutboxEntry]:
        server = self.server
        rows = self.store.query(
            f"SELECT o.*, e.revision AS local_revision, a.revision AS acked_revision, a.content_hash AS acked_hash, "
            f"a.ack_status AS acked_status FROM {TABLE} o LEFT JOIN episodes e ON e.id = o.episode_id "
            f"LEFT JOIN {ACKS} a ON a.episode_id = o.episode_id AND a.server = ? {where} "
            f"ORDER BY o.queued_at, o.episode_id", [server, *params])
        return [_entry(r, server) for r in rows]

    def get(self, episode_id: str) -> OutboxEntry | None:
        found = self._select("WHERE o.episode_id = ?", [episode_id])
        return found[0] if found else None

    def entries(self, state: str | None = None) -> list[OutboxEntry]:
        """Every submitted episode's entry, its state as this server has it."""
        return [e for e in self._select("", []) if state is None or e.state == state]

    def pending(self) -> list[str]:
        """Episode ids waiting to be sent, oldest first."""
        rows = self.store.query(
            f"SELECT episode_id FROM {TABLE} WHERE state IN ('queued', 'sending') ORDER BY queued_at, episode_id")
        return [r["episode_id"] for r in rows]


def _entry(r: dict, server: str | None) -> OutboxEntry:
    state, revision, digest, status = r["state"], r["revision"], r["content_hash"], r["ack_status"]
    if server is not None:  # what this server acknowledged, not the last upload to any
        revision, digest, status = r["acked_revision"], r["acked_hash"], r["acked_status"]
        if state == "synced":
            if revision is None:
                state = "missing"
            elif r["local_revision"] is not None and r["local_revision"] > revision:
                state = "changed"
    return OutboxEntry(
        episode_id=r["episode_id"], state=state, sent_bytes=r["sent_bytes"] or 0,
        total_bytes=r["total_bytes"] or 0, error=r["error"], revision=revision, content_hash=digest,
        ack_status=status, attempts=r["attempts"] or 0, queued_at=r["queued_at"] or 0.0,
        updated_at=r["updated_at"] or 0.0, local_revision=r["local_revision"])
