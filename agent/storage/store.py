"""The local store: metadata in SQLite (WAL) through sqlite-utils, blobs as content-addressed files.
(Over 500 lines on purpose: it is the one owner of the database and of blob lifetime.)

Layout of a data directory:
    tandem.db            episodes, steps, raw input events, blob references, settings
    blobs/ab/abcdef...   screenshots and audio, named by the SHA-256 of their bytes

Blobs are written in one place, `put_blob`/`put_blob_chunks` (pinned in the database first,
then temp file, fsync, rename), before the transaction that refers to them commits, so a process
killed at any point leaves either the old state or the new one and at worst an unreferenced blob
or a temp file, which `check()` reports and `gc()` removes once no writer can still want them.
Blobs are deleted in one place only, `remove_unreferenced` (gc() runs it over the whole folder).

What the flywheel decides about an episode (its route, the outcome it judged, why) is not part
of the episode: it lives in `judgements`, keyed by the episode's id and the hash of the content
it judged (`content_hash`, stamped by every save). A new content (an edit, an annotator's
re-upload) starts unscored, and the judgement of the content before stays as it was.

The store owns the database: other modules keep tables in it (the sync outbox, the flywheel's
routes and models, the backend's users) by declaring their migrations (`migrate(owner, steps)`,
each step run once, its version recorded in `schema_versions`) and read and write them through
`query`, `execute`, `insert` and `upsert`, inside `transaction()` where several writes belong
together. Nothing outside this module touches the connection or its lock.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import sqlite_utils

from agent.schema import ROUTES, Episode, Outcome, SchemaError, Step
from agent.storage.files import TEMP_PREFIX, StoreError, atomic_write_chunks, sha256
from agent.storage.judgements import (
    JUDGED_JOIN,
    ROUTE_SQL,
    Judgement,
    episode_content_hash,
    judgement_from_row,
    move_judgements_out,
)

DB_NAME = "tandem.db"
ENV_DATA = "TANDEM_DATA"
PIN_SECONDS = 24 * 3600  # how long a written, unreferenced blob is protected from removal
# How old (since its last write) a blob writer's temp file must be before gc() removes it: a
# writer writes, fsyncs and renames within seconds, and each chunk it writes refreshes the
# mtime, so an hour without a write means its writer is gone (killed, crashed).
TEMP_GRACE_SECONDS = 3600


@dataclass(frozen=True)
class AddColumn:
    """A migration step: add a column where it is missing (a store made before it existed)."""

    table: str
    column: str
    type: str  # TEXT, INTEGER or REAL


# The store's own tables. Step 1 is the schema of every release before migrations were recorded
# (IF NOT EXISTS: such a store passes through it unchanged); later steps change it.
STORE_MIGRATIONS = [
    """CREATE TABLE IF NOT EXISTS "episodes" ("id" TEXT PRIMARY KEY, "kind" TEXT, "instruction" TEXT, "platform" TEXT,
        "producer" TEXT, "policy_version" TEXT, "success" INTEGER, "reward" REAL, "outcome_source" TEXT, "route" TEXT,
        "created_at" REAL, "updated_at" REAL, "revision" INTEGER, "schema_version" INTEGER, "n_steps" INTEGER, "meta" TEXT);
    CREATE INDEX IF NOT EXISTS "idx_episodes_kind" ON "episodes" ("kind");
    CREATE INDEX IF NOT EXISTS "idx_episodes_created_at" ON "episodes" ("created_at");
    CREATE TABLE IF NOT EXISTS "steps" ("episode_id" TEXT REFERENCES "episodes"("id"), "idx" INTEGER, "thought" TEXT,
        "action_name" TEXT, "action" TEXT, "observation" TEXT, "provenance" TEXT, "screenshot" TEXT,
        "post_screenshot" TEXT, "reward" REAL, "terminated" INTEGER, "truncated" INTEGER, "t_start" REAL, "t_end" REAL,
        "raw_response" TEXT, "info" TEXT, PRIMARY KEY ("episode_id", "idx"));
    CREATE TABLE IF NOT EXISTS "raw_events" ("episode_id" TEXT, "seq" INTEGER, "t" REAL, "kind" TEXT, "data" TEXT,
        PRIMARY KEY ("episode_id", "seq"));
    CREATE TABLE IF NOT EXISTS "blob_refs" ("episode_id" TEXT, "hash" TEXT, PRIMARY KEY ("episode_id", "hash"));
    CREATE INDEX IF NOT EXISTS "idx_blob_refs_hash" ON "blob_refs" ("hash");
    CREATE TABLE IF NOT EXISTS "settings" ("key" TEXT PRIMARY KEY, "value" TEXT)""",
    # blobs written but not yet referenced (see put_blob)
    """CREATE TABLE IF NOT EXISTS "blob_pins" ("hash" TEXT PRIMARY KEY, "at" REAL)""",
    # what the flywheel decided about each content of an episode (see the module's docstring);
    # revision counts the changes to one content's judgement (routed, undone, routed again)
    AddColumn("episodes", "content_hash", "TEXT"),
    """CREATE TABLE IF NOT EXISTS "judgements" ("episode_id" TEXT, "content_hash" TEXT, "route" TEXT,
        "outcome" TEXT, "routing" TEXT, "revision" INTEGER, "updated_at" REAL, PRIMARY KEY ("episode_id", "content_hash"))""",
    move_judgements_out,
]


class NotFound(StoreError, KeyError):
    def __str__(self):  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


def default_data_dir() -> Path:
    """$TANDEM_DATA, else the platform's per-user data directory."""
    env = os.environ.get(ENV_DATA)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("Tandem", "Tandem"))


class Store:
    """One data directory. Thread-safe: one connection guarded by a lock."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_data_dir()
        self.root.mkdir(parents=True, exist_ok=True)
        self.blob_dir = self.root / "blobs"
        self.blob_dir.mkdir(exist_ok=True)
        self._lock = threading.RLock()
        try:
            conn = sqlite3.connect(self.root / DB_NAME, timeout=30, check_same_thread=False, isolation_level=None)
            self.db = sqlite_utils.Database(conn)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"cannot open the store at {self.root / DB_NAME}: {e}") from None

    # ------------------------------------------------------------ schema
    def _migrate(self) -> None:
        with self._lock:
            self.db.execute('CREATE TABLE IF NOT EXISTS "schema_versions" ("owner" TEXT PRIMARY KEY, "version" INTEGER, '
                            '"at" REAL)')
        self.migrate("store", STORE_MIGRATIONS)

    def migrate(self, owner: str, steps) -> int:
        """Bring `owner`'s tables up to date: `steps` are its migrations in order (SQL statements
        separated by ';', AddColumn, or a function of the store that moves rows), each applied
        once, in one transaction with the version reached recorded in `schema_versions`. Returns
        how many steps ran. A store whose tables are newer than `steps` is refused: this Tandem is
        older than the one that wrote it."""
        with self.transaction():
            rows = list(self.db.query("SELECT version FROM schema_versions WHERE owner = ?", [owner]))
            have = rows[0]["version"] if rows else 0
            if have > len(steps):
                raise StoreError(f"{self.root / DB_NAME}: its {owner!r} tables are at schema version {have}, newer than "
                                 f"this Tandem knows ({len(steps)}); open it with the newer Tandem that wrote it")
            for version, step in enumerate(steps[have:], have + 1):
                if isinstance(step, AddColumn):
                    if step.column not in {c["name"] for c in self.db.query(f'PRAGMA table_info("{step.table}")')}:
                        self.db.execute(f'ALTER TABLE "{step.table}" ADD COLUMN "{step.column}" {step.type}')
                elif callable(step):
                    step(self)
                else:
                    for stmt in step.split(";"):  # not executescript: that would commit the transaction
                        if stmt.strip():
                            self.db.execute(stmt)
                self.db.execute("INSERT OR REPLACE INTO schema_versions (owner, version, at) VALUES (?, ?, ?)",
                                [owner, version, time.time()])
        return max(0, len(steps) - have)

    def schema_version(self, owner: str) -> int:
        rows = self.query("SELECT version FROM schema_versions WHERE owner = ?", [owner])
        return rows[0]["version"] if rows else 0

    # ------------------------------------------------------------ other modules' tables
    def query(self, sql: str, params=()) -> list[dict]:
        """The rows of one statement, as dicts."""
        with self._lock:
            return list(self.db.query(sql, params))

    def execute(self, sql: str, params=()) -> int:
        """One write statement in a transaction (joining the caller's); returns the rows it changed."""
        with self.transaction():
            return self.db.execute(sql, params).rowcount

    def insert(self, table: str, row: dict) -> None:
        with self.transaction():
            self.db[table].insert(row)

    def upsert(self, table: str, row: dict, pk) -> None:
        """Insert `row`, or update the columns it names where its primary key `pk` exists."""
        with self.transaction():
            self.db[table].upsert(row, pk=pk)

    def has_table(self, name: str) -> bool:
        with self._lock:
            return name in self.db.table_names()

    def close(self) -> None:
        with self._lock:
            self.db.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def transaction(self):
        """`with store.transaction():` — one atomic unit (nests as savepoints are not needed here)."""
        return _Tx(self)

    # ------------------------------------------------------------ blobs
    def blob_path(self, digest: str) -> Path:
        if not _is_digest(digest):
            raise StoreError(f"not a blob hash: {digest!r}")
        return self.blob_dir / digest[:2] / digest

    def put_blob(self, data: bytes) -> str:
        """Store bytes under their SHA-256: the one writer of the blob folder (the backend's
        uploads come through here too). The blob is pinned until an episode that refers to it is
        saved (or PIN_SECONDS pass). The pin is a row of `blob_pins`, so it holds against a
        removal in any process (`check --fix` beside a recording app or a running backend): a
        concurrent removal of an identical, unreferenced blob cannot delete the file this caller
        is about to refer to."""
        digest = sha256(data)
        self.put_blob_chunks(digest, (data,))
        return digest

    def put_blob_chunks(self, digest: str, chunks) -> bool:
        """put_blob of a blob whose hash is known and whose bytes arrive in chunks (a bundle's
        member, an image file): written without holding it whole, refused (StoreError) when the
        bytes do not have that hash. False when the store had it already (chunks not read)."""
        path = self.blob_path(digest)
        with self.transaction():  # pinned first: a removal after this sees the pin, one before it runs first
            self.db.execute("INSERT OR REPLACE INTO blob_pins (hash, at) VALUES (?, ?)", [digest, time.time()])
        if path.exists():
            return False
        atomic_write_chunks(path, chunks, digest)
        return True

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).exists()

    def get_blob(self, digest: str) -> bytes:
        path = self.blob_path(digest)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise NotFound(f"blob {digest} is missing from {self.blob_dir}") from None

    # ------------------------------------------------------------ episodes
    def save_episode(self, ep: Episode, *, bump_revision: bool = False) -> Episode:
        """Insert or replace an episode with all its steps, atomically."""
        missing = [h for h in ep.blob_hashes() if not self.has_blob(h)]
        if missing:
            raise StoreError(f"episode {ep.id}: blobs not in the store: {', '.join(missing[:3])}")
        import time as _time

        if bump_revision:
            ep.revision += 1
            ep.updated_at = _time.time()
        with self.transaction():
            self.db["episodes"].upsert(self._episode_row(ep), pk="id")
            self.db.execute("DELETE FROM steps WHERE episode_id = ?", [ep.id])
            if ep.steps:
                self.db["steps"].insert_all((self._step_row(ep.id, s) for s in ep.steps), pk=("episode_id", "idx"))
            self.db.execute("DELETE FROM blob_refs WHERE episode_id = ?", [ep.id])
            refs = [{"episode_id": ep.id, "hash": h} for h in sorted(ep.blob_hashes())]
            if refs:
                self.db["blob_refs"].insert_all(refs, pk=("episode_id", "hash"))
                for k in range(0, len(refs), 500):  # referenced now: the pins have done their job
                    part = [r["hash"] for r in refs[k:k + 500]]
                    self.db.execute(f"DELETE FROM blob_pins WHERE hash IN ({','.join('?' * len(part))})", part)
        return ep

    def _episode_row(self, ep: Episode) -> dict:
        return {
            "id": ep.id, "kind": ep.kind, "instruction": ep.instruction, "platform": ep.platform,
            "producer": ep.producer, "policy_version": ep.policy_version,
            "success": None if ep.outcome.success is None else int(ep.outcome.success),
            "reward": ep.outcome.reward, "outcome_source": ep.outcome.source, "route": ep.route,
            "created_at": ep.created_at, "updated_at": ep.updated_at, "revision": ep.revision,
            "schema_version": ep.schema_version, "n_steps": len(ep.steps), "meta": json.dumps(ep.meta),
            "content_hash": episode_content_hash(ep),
        }

    @staticmethod
    def _step_row(episode_id: str, s: Step) -> dict:
        d = s.to_dict()
        return {
            "episode_id": episode_id, "idx": s.index, "thought": s.thought, "action_name": s.action.name,
            "action": json.dumps(d["action"]), "observation": json.dumps(d["observation"]),
            "provenance": json.dumps(d["provenance"]), "screenshot": s.observation.screenshot,
            "post_screenshot": s.observation.post_screenshot, "reward": s.reward,
            "terminated": int(s.terminated), "truncated": int(s.truncated), "t_start": s.t_start,
            "t_end": s.t_end, "raw_response": s.raw_response, "info": json.dumps(s.info),
        }

    @staticmethod
    def _step_from_row(r: dict) -> Step:
        return Step.from_dict(
            {
                "index": r["idx"], "observation": json.loads(r["observation"]), "thought": r["thought"] or "",
                "action": json.loads(r["action"]), "provenance": json.loads(r["provenance"] or "{}"),
                "t_start": r["t_start"] or 0.0, "t_end": r["t_end"] or 0.0, "reward": r["reward"] or 0.0,
                "terminated": bool(r["terminated"]), "truncated": bool(r["truncated"]),
                "raw_response": r["raw_response"], "info": json.loads(r["info"] or "{}"),
            }
        )

    @staticmethod
    def _episode_from_row(r: dict, steps: list[Step] | None) -> Episode:
        return Episode(**_episode_fields(r), steps=steps or [])

    def has_episode(self, episode_id: str) -> bool:
        with self._lock:
            return bool(list(self.db.query("SELECT 1 FROM episodes WHERE id = ?", [episode_id])))

    def instruction_of(self, episode_id: str) -> str | None:
        """The episode's instruction (what lists show it by), without loading its steps."""
        with self._lock:
            rows = list(self.db.query("SELECT instruction FROM episodes WHERE id = ?", [episode_id]))
        return rows[0]["instruction"] if rows else None

    def load_episode(self, episode_id: str) -> Episode:
        with self._lock:
            rows = list(self.db.query("SELECT * FROM episodes WHERE id = ?", [episode_id]))
            if not rows:
                raise NotFound(f"no episode with id {episode_id!r} in {self.root}")
            steps = [
                self._step_from_row(r)
                for r in self.db.query("SELECT * FROM steps WHERE episode_id = ? ORDER BY idx", [episode_id])
            ]
        return self._episode_from_row(rows[0], steps)

    def list_episodes(self, *, kind: str | None = None, route: str | None = None, limit: int | None = None,
                      ids=None) -> list[Episode]:
        """Episodes without their steps (n_steps in meta['n_steps']), newest first; `ids`: only these;
        `route`: only those whose current content the flywheel judged so (see judgement())."""
        sql, params = f"SELECT e.* FROM episodes e {JUDGED_JOIN}", []
        where = []
        if ids is not None:
            ids = list(ids)
            if not ids:
                return []
            if len(ids) <= 500:  # SQLite's bound-parameter limit leaves room; more: filter after reading
                where.append(f"e.id IN ({', '.join('?' * len(ids))})")
                params.extend(ids)
        if kind:
            where.append("e.kind = ?")
            params.append(kind)
        if route:
            where.append(f"{ROUTE_SQL} = ?")
            params.append(route)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY e.created_at DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        with self._lock:
            rows = list(self.db.query(sql, params))
        out = []
        for r in rows:
            ep = self._episode_from_row(r, None)
            ep.meta = {**ep.meta, "n_steps": r["n_steps"]}
            out.append(ep)
        return out

    def episode_ids(self) -> list[str]:
        with self._lock:
            return [r["id"] for r in self.db.query("SELECT id FROM episodes ORDER BY created_at")]

    def update_episode_fields(self, episode_id: str, **fields) -> None:
        """Change episode-level fields (outcome, instruction) and bump the revision."""
        ep = self.load_episode(episode_id)
        for k, v in fields.items():
            if k == "route":
                raise StoreError("an episode's route is the flywheel's judgement of its content, not a field of the "
                                 "episode: set it with Store.judge()")
            if not hasattr(ep, k):
                raise StoreError(f"episode has no field {k!r}")
            setattr(ep, k, v)
        ep.__post_init__()
        self.save_episode(ep, bump_revision=True)

    def update_step(self, episode_id: str, step: Step) -> None:
        ep = self.load_episode(episode_id)
        for i, s in enumerate(ep.steps):
            if s.index == step.index:
                ep.steps[i] = step
                break
        else:
            raise NotFound(f"episode {episode_id} has no step {step.index}")
        self.save_episode(ep, bump_revision=True)

    def delete_step(self, episode_id: str, index: int) -> None:
        """Remove a step and renumber the ones after it; blobs it alone used are removed."""
        ep = self.load_episode(episode_id)
        before = ep.blob_hashes()
        kept = [s for s in ep.steps if s.index != index]
        if len(kept) == len(ep.steps):
            raise NotFound(f"episode {episode_id} has no step {index}")
        for i, s in enumerate(kept):
            s.index = i
        ep.steps = kept
        self.save_episode(ep, bump_revision=True)
        self.remove_unreferenced(before - ep.blob_hashes())

    def delete_episode(self, episode_id: str) -> int:
        """Delete an episode; returns how many blobs were removed (those no other episode uses)."""
        with self._lock:
            if not self.has_episode(episode_id):
                raise NotFound(f"no episode with id {episode_id!r}")
            hashes = [r["hash"] for r in self.db.query("SELECT hash FROM blob_refs WHERE episode_id = ?", [episode_id])]
            with self.transaction():
                for table in ("steps", "raw_events", "blob_refs", "judgements"):
                    self.db.execute(f"DELETE FROM {table} WHERE episode_id = ?", [episode_id])
                self.db.execute("DELETE FROM episodes WHERE id = ?", [episode_id])
            return self.remove_unreferenced(set(hashes))

    def remove_unreferenced(self, hashes, *, own=()) -> int:
        """Delete the blobs among `hashes` that no episode refers to; returns how many went. The
        one place blobs are deleted: each is checked and unlinked inside one write transaction,
        so no save (in this process or another) can add a reference in between, and a blob
        pinned by a put_blob whose episode is not saved yet is kept, unless the caller put it
        itself (`own`: e.g. the recorder's frames it decided not to keep)."""
        removed, own = 0, set(own)
        fresh_after = time.time() - PIN_SECONDS
        for h in sorted(set(hashes)):
            with self.transaction():
                if list(self.db.query("SELECT 1 FROM blob_refs WHERE hash = ? LIMIT 1", [h])):
                    continue
                if h not in own and list(self.db.query("SELECT 1 FROM blob_pins WHERE hash = ? AND at > ?", [h, fresh_after])):
                    continue
                self.db.execute("DELETE FROM blob_pins WHERE hash = ?", [h])
                try:
                    self.blob_path(h).unlink()
                    removed += 1
                except FileNotFoundError:
                    pass
        return removed

    # ------------------------------------------------------------ judgements
    def load_episode_version(self, episode_id: str) -> tuple[Episode, str]:
        """The episode and its content hash, read from one snapshot: what a judge of it keys its
        judgement by, so that a content saved meanwhile (by any process) is not judged unseen."""
        with self._lock:
            conn, outer = self.db.conn, not self.db.conn.in_transaction
            if outer:
                conn.execute("BEGIN")  # a read transaction: one snapshot for the row and its steps
            try:
                ep = self.load_episode(episode_id)
                digest = list(self.db.query("SELECT content_hash FROM episodes WHERE id = ?", [episode_id]))[0]
            finally:
                if outer:
                    conn.execute("COMMIT")
        return ep, digest["content_hash"]

    def judgement(self, episode_id: str, content_hash: str | None = None) -> Judgement:
        """What the flywheel decided about one content of an episode (default: its current one);
        route "unscored" when nothing was."""
        if content_hash is None:
            return self.judgements([episode_id]).get(episode_id, Judgement())
        rows = self.query("SELECT * FROM judgements WHERE episode_id = ? AND content_hash = ?", [episode_id, content_hash])
        return judgement_from_row(rows[0]) if rows else Judgement(content_hash=content_hash)

    def judgements(self, ids) -> dict[str, Judgement]:
        """{episode id: the judgement of its current content} for the stored episodes among `ids`."""
        ids, out = list(ids), {}
        for at in range(0, len(ids), 500):
            part = ids[at:at + 500]
            for r in self.query(f"SELECT e.id, e.content_hash AS current, j.* FROM episodes e {JUDGED_JOIN} "
                                f"WHERE e.id IN ({', '.join('?' * len(part))})", part):
                out[r["id"]] = judgement_from_row(r) if r["route"] is not None else Judgement(content_hash=r["current"])
        return out

    def judge(self, episode_id: str, route: str, *, content_hash: str | None = None, outcome: Outcome | None = None,
              routing: dict | None = None) -> Judgement:
        """Record the flywheel's decision about one content of an episode (default: its current
        one; a judge passes the hash of the content it read, load_episode_version): its route,
        the outcome it judged, its reasons. The judgement's revision goes up by one; the
        episode itself does not change."""
        if route not in ROUTES:
            raise StoreError(f"route must be one of {', '.join(ROUTES)}, got {route!r}")
        with self.transaction():
            if content_hash is None:
                rows = self.query("SELECT content_hash FROM episodes WHERE id = ?", [episode_id])
                if not rows:
                    raise NotFound(f"no episode with id {episode_id!r} in {self.root}")
                content_hash = rows[0]["content_hash"]
            before = self.judgement(episode_id, content_hash)
            row = {"episode_id": episode_id, "content_hash": content_hash, "route": route,
                   "outcome": json.dumps(outcome.to_dict()) if outcome is not None else None,
                   "routing": json.dumps(routing or {}), "revision": before.revision + 1, "updated_at": time.time()}
            self.db["judgements"].upsert(row, pk=("episode_id", "content_hash"))
        return judgement_from_row(row)

    # ------------------------------------------------------------ raw input events
    def append_raw_events(self, episode_id: str, events: list[dict]) -> None:
        """Append raw events ({'t', 'kind', ...}) in one transaction; seq continues per episode."""
        if not events:
            return
        with self._lock:
            row = list(self.db.query("SELECT MAX(seq) AS m FROM raw_events WHERE episode_id = ?", [episode_id]))
            seq = (row[0]["m"] if row and row[0]["m"] is not None else -1) + 1
            rows = []
            for e in events:
                data = {k: v for k, v in e.items() if k not in ("t", "kind")}
                rows.append({"episode_id": episode_id, "seq": seq, "t": float(e["t"]), "kind": str(e["kind"]), "data": json.dumps(data)})
                seq += 1
            with self.transaction():
                self.db["raw_events"].insert_all(rows, pk=("episode_id", "seq"))

    def raw_events(self, episode_id: str) -> list[dict]:
        with self._lock:
            rows = list(self.db.query("SELECT * FROM raw_events WHERE episode_id = ? ORDER BY seq", [episode_id]))
        return [{"t": r["t"], "kind": r["kind"], **json.loads(r["data"])} for r in rows]

    # ------------------------------------------------------------ settings
    def get_setting(self, key: str, default=None):
        with self._lock:
            rows = list(self.db.query("SELECT value FROM settings WHERE key = ?", [key]))
        return json.loads(rows[0]["value"]) if rows else default

    def set_setting(self, key: str, value) -> None:
        with self._lock, self.transaction():
            self.db["settings"].upsert({"key": key, "value": json.dumps(value)}, pk="key")

    # ------------------------------------------------------------ health
    def change_token(self) -> tuple[int, int]:
        """Changes when the store's content does, by this process (rows this connection changed)
        or another (SQLite's data_version moves when another connection commits): views poll it
        cheaply and reload only then."""
        with self._lock:
            version = self.db.execute("PRAGMA data_version").fetchone()[0]
            return self.db.conn.total_changes, version

    def counts(self) -> dict:
        with self._lock:
            c = {"episodes": self.db["episodes"].count, "steps": self.db["steps"].count}
            c["by_kind"] = {r["kind"]: r["n"] for r in self.db.query("SELECT kind, COUNT(*) AS n FROM episodes GROUP BY kind")}
            c["by_route"] = {r["route"]: r["n"] for r in self.db.query(
                f"SELECT {ROUTE_SQL} AS route, COUNT(*) AS n FROM episodes e {JUDGED_JOIN} GROUP BY 1")}
        files = [p for p in self.blob_dir.glob("*/*") if not p.name.startswith(TEMP_PREFIX)]
        c["blobs"] = len(files)
        c["blob_bytes"] = sum(p.stat().st_size for p in files)
        return c

    def check(self, *, verify_hashes: bool = True) -> list[str]:
        """Problems found, each a sentence; an empty list means the store is sound."""
        problems = []
        with self._lock:
            res = [r[0] for r in self.db.execute("PRAGMA integrity_check").fetchall()]
            if res != ["ok"]:
                problems.append(f"sqlite integrity_check: {'; '.join(res[:5])}")
            referenced = {r["hash"] for r in self.db.query("SELECT DISTINCT hash FROM blob_refs")}
            for eid in self.episode_ids():
                try:
                    self.load_episode(eid)
                except (SchemaError, ValueError) as e:
                    problems.append(f"episode {eid} does not load: {e}")
        for h in sorted(referenced):
            path = self.blob_path(h)
            if not path.exists():
                problems.append(f"blob {h} is referenced but missing")
            elif verify_hashes and sha256(path.read_bytes()) != h:
                problems.append(f"blob {h} is corrupt: its content hash differs")
        # what gc() would remove: a pinned blob or a fresh temp file is a write in progress, not a problem
        temps, unused = self._garbage(referenced)
        problems += [f"leftover temporary file {p.relative_to(self.root)}" for p in temps]
        problems += [f"blob {h} is not used by any episode" for h in unused]
        return problems

    def _garbage(self, referenced: set | None = None) -> tuple[list[Path], list[str]]:
        """(temp files older than TEMP_GRACE_SECONDS, unreferenced blobs without a live pin)."""
        with self._lock:
            if referenced is None:
                referenced = {r["hash"] for r in self.db.query("SELECT DISTINCT hash FROM blob_refs")}
            pinned = {r["hash"] for r in self.db.query("SELECT hash FROM blob_pins WHERE at > ?",
                                                       [time.time() - PIN_SECONDS])}
        stale, temps, unused = time.time() - TEMP_GRACE_SECONDS, [], []
        for p in sorted(self.blob_dir.glob("*/*")):
            if p.name.startswith(TEMP_PREFIX):
                try:
                    if p.stat().st_mtime < stale:
                        temps.append(p)
                except FileNotFoundError:  # its writer renamed it meanwhile
                    pass
            elif _is_digest(p.name) and p.name not in referenced and p.name not in pinned:
                unused.append(p.name)
        return temps, unused

    def gc(self) -> int:
        """Remove every blob in the folder that no episode refers to and no live pin protects
        (through remove_unreferenced, which decides each inside a write transaction, so a save
        or a put_blob in another process in between wins), and temp files no writer has touched
        for TEMP_GRACE_SECONDS; returns how many files went. Safe while the app records or a
        backend receives uploads. Files not named like a blob are not the store's: left alone."""
        temps, unused = self._garbage()
        n = 0
        for p in temps:
            try:
                p.unlink()
                n += 1
            except FileNotFoundError:
                pass
        return n + self.remove_unreferenced(unused)


def _is_digest(name: str) -> bool:
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


def _episode_fields(r: dict) -> dict:
    return {
        "id": r["id"], "kind": r["kind"], "instruction": r["instruction"], "platform": r["platform"],
        "producer": r["producer"], "policy_version": r["policy_version"],
        "outcome": Outcome(None if r["success"] is None else bool(r["success"]), r["reward"], r["outcome_source"]),
        "route": r["route"], "created_at": r["created_at"], "updated_at": r["updated_at"],
        "revision": r["revision"], "schema_version": r["schema_version"], "meta": json.loads(r["meta"] or "{}"),
    }


class _Tx:
    """BEGIN IMMEDIATE ... COMMIT under the store's lock; nested use joins the outer one."""

    def __init__(self, store: Store):
        self.store = store
        self.outer = False

    def __enter__(self):
        self.store._lock.acquire()
        conn = self.store.db.conn
        self.outer = not conn.in_transaction
        if self.outer:
            conn.execute("BEGIN IMMEDIATE")
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if self.outer:
                self.store.db.conn.execute("ROLLBACK" if exc_type else "COMMIT")
        finally:
            self.store._lock.release()
        return False
