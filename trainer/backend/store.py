"""The backend's store: episodes and blobs in an agent.storage.store.Store of its own data directory,
plus users (hashed tokens, roles, revocation), who owns each episode, every revision received,
an ingest log, and announced model versions.

Ownership and idempotence are decided here, inside one transaction with the write, so two
connections racing with the same episode still store it once.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from agent.protocol import ROLES, _is_id
from agent.schema import Action, Episode, SchemaError
from agent.storage.model_files import ModelFilesError, check_model_version, is_model_version
from agent.storage.store import AddColumn, NotFound, Store
from trainer.errors import TrainerError

TOKEN_PREFIX = "tdm"


class BackendError(TrainerError):
    """A request the backend refuses; `code` is a protocol error code."""

    def __init__(self, code: str, reason: str):
        super().__init__(reason)
        self.code = code


SUPERVISING_ROLES = ("supervisor", "admin")  # may store corrections and a supervisor's outcome (claims_problem)
RELAYED_STEPS_MAX = 64  # steps one relayed decision may vouch for (an edit's actions, a takeover's steps)
DEFAULT_TOKEN_DAYS = 90  # a user token's lifetime unless `backend user add --days` says otherwise


def _expired(row: dict) -> bool:
    return row.get("expires_at") is not None and time.time() > row["expires_at"]


@dataclass(frozen=True)
class User:
    name: str
    role: str
    created_at: float
    revoked_at: float | None
    token_id: str | None = None  # the token a session authenticated with (a new token is a new identity)

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def _hash_secret(salt: bytes, secret: str) -> str:
    # The secret is 32 random bytes, so a salted SHA-256 cannot be brute-forced; a slow KDF
    # (scrypt) would only slow every connection down.
    return hashlib.sha256(salt + secret.encode()).hexdigest()


def claims_problem(ep: Episode, user: User, relayed: frozenset = frozenset()) -> str | None:
    """What an upload claims that its sender may not vouch for, or None. The flywheel trains on
    corrections (SFT samples, DPO pairs) and trusts a supervisor's outcome, so only a supervisor's
    or admin's session stores them, and only in its own name: an annotator cannot forge them, and
    nobody signs them with another user's name. An annotator's own outcome mark ("annotator") and
    a sandbox verifier's stay open to every role.

    The exception is remote supervision: the agent's machine (any role) stores a correction that
    a supervisor made of its proposal through this backend. `relayed` holds the steps the backend
    relayed such a correction for to this uploader (BackendStore.relayed_corrections) as
    _relayed_key tuples (step index, decided_by, action, thought): a corrected step matching one
    exactly is the supervisor's own decision, whoever uploads it."""
    may = user.role in SUPERVISING_ROLES
    for s in ep.steps:
        p = s.provenance
        if p.source != "corrected" or _relayed_key(s.index, p.decided_by, s.action, s.thought) in relayed:
            continue
        by = repr(str(p.decided_by)[:80]) if p.decided_by is not None else "anyone"
        if not may:
            return (f"step {s.index + 1} is marked as a supervisor's correction (provenance 'corrected'); "
                    f"role {user.role!r} may not upload corrections, and this backend relayed no such correction "
                    f"by {by} of step {s.index + 1} to {user.name!r}")
        if p.decided_by not in (None, user.name):
            return (f"step {s.index + 1} is a correction decided by {by}; {user.name!r} may upload "
                    "corrections only in its own name or ones this backend relayed to it live (a supervisor's app "
                    f"and `tandem agent` sign as the backend user they sync as, {user.name!r}, once they have synced)")
    if ep.outcome.source == "supervisor" and not may:
        return f"the outcome is marked as judged by a supervisor; role {user.role!r} may not upload that"
    return None


def _relayed_key(index: int | None, decided_by, action, thought: str) -> tuple:
    """What identifies a relayed correction's step: where, by whom, and what it holds (its action
    as canonical JSON, its thought's hash), so that an uploader cannot change a relayed
    correction's content either."""
    d = action.to_dict() if hasattr(action, "to_dict") else action
    return index, decided_by, json.dumps(d, sort_keys=True), _NO_THOUGHT if not thought else \
        hashlib.sha256(thought.encode("utf-8", "surrogatepass")).hexdigest()


_NO_THOUGHT = hashlib.sha256(b"").hexdigest()


# agent.storage.store.Store.migrate. Step 1 is the schema every release before migrations made (a store
# from before token expiry lacks users.expires_at: step 2 adds it where missing).
MIGRATIONS = [
    """CREATE TABLE IF NOT EXISTS "users" ("name" TEXT PRIMARY KEY, "role" TEXT, "token_id" TEXT, "salt" TEXT,
        "token_hash" TEXT, "created_at" REAL, "revoked_at" REAL);
    CREATE UNIQUE INDEX IF NOT EXISTS "idx_users_token_id" ON "users" ("token_id");
    CREATE TABLE IF NOT EXISTS "episode_owners" ("episode_id" TEXT PRIMARY KEY, "owner" TEXT, "revision" INTEGER,
        "content_hash" TEXT, "updated_at" REAL);
    CREATE INDEX IF NOT EXISTS "idx_episode_owners_owner" ON "episode_owners" ("owner");
    CREATE TABLE IF NOT EXISTS "revisions" ("episode_id" TEXT, "revision" INTEGER, "content_hash" TEXT, "user" TEXT,
        "received_at" REAL, PRIMARY KEY ("episode_id", "revision", "content_hash"));
    CREATE TABLE IF NOT EXISTS "ingest_log" ("id" INTEGER PRIMARY KEY, "t" REAL, "user" TEXT, "episode_id" TEXT,
        "revision" INTEGER, "content_hash" TEXT, "status" TEXT);
    CREATE TABLE IF NOT EXISTS "models" ("version" TEXT PRIMARY KEY, "info" TEXT, "announced_at" REAL)""",
    AddColumn("users", "expires_at", "REAL"),
    # who sent which blob's bytes: proof of having them (missing_blobs)
    """CREATE TABLE IF NOT EXISTS "blob_uploads" ("hash" TEXT, "user" TEXT, PRIMARY KEY ("hash", "user"))""",
    # every decision the backend relayed from a supervisor to an agent's machine, one row per step
    # it makes that machine record (record_decision): what lets that machine upload the correction
    """CREATE TABLE IF NOT EXISTS "relayed_decisions" ("id" INTEGER PRIMARY KEY, "t" REAL, "run_id" TEXT,
        "proposal_id" TEXT, "episode_id" TEXT, "step_index" INTEGER, "decision" TEXT, "decided_by" TEXT,
        "publisher" TEXT, "action" TEXT, "thought_sha256" TEXT);
    CREATE INDEX IF NOT EXISTS "idx_relayed_decisions_episode" ON "relayed_decisions" ("episode_id", "publisher")""",
]


SERVER_ID_KEY = "backend.server_id"


class BackendStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.store = Store(self.root)
        self.store.migrate("backend", MIGRATIONS)
        self.server_id = self._server_id()

    def _server_id(self) -> str:
        """This backend's lasting identity, made once and kept in its store: apps keep what each
        server has under it (agent.sync.outbox), whatever URL the server is reached at."""
        sid = self.store.get_setting(SERVER_ID_KEY)
        if not sid:
            sid = secrets.token_hex(16)
            self.store.set_setting(SERVER_ID_KEY, sid)
        return sid

    def close(self) -> None:
        self.store.close()

    # ------------------------------------------------------------ users
    def add_user(self, name: str, role: str, days: float | None = DEFAULT_TOKEN_DAYS) -> str:
        """Create (or re-activate a revoked) user; returns the token, which is not stored. The token
        expires after `days` (None or 0: never)."""
        if days is not None and days < 0:
            raise BackendError("bad_field", f"token lifetime must be >= 0 days, got {days}")
        if role not in ROLES:
            raise BackendError("bad_field", f"role must be one of {', '.join(ROLES)}, got {role!r}")
        if not name or len(name) > 200 or any(c.isspace() for c in name):
            raise BackendError("bad_field", f"user name must be 1-200 characters without spaces, got {name!r}")
        token_id, secret, salt = secrets.token_hex(6), secrets.token_urlsafe(32), secrets.token_bytes(16)
        with self.store.transaction():
            rows = self.store.query("SELECT revoked_at FROM users WHERE name = ?", [name])
            if rows and rows[0]["revoked_at"] is None:
                raise BackendError("conflict", f"user {name!r} already exists (revoke it first to issue a new token)")
            self.store.upsert("users", 
                {"name": name, "role": role, "token_id": token_id, "salt": salt.hex(),
                 "token_hash": _hash_secret(salt, secret), "created_at": time.time(), "revoked_at": None,
                 "expires_at": time.time() + days * 86400 if days else None}, pk="name")
        return f"{TOKEN_PREFIX}_{token_id}_{secret}"

    def authenticate(self, token: str) -> User:
        """The active user a token belongs to; BackendError('auth_failed') says why not."""
        parts = token.split("_", 2) if isinstance(token, str) else []
        if len(parts) != 3 or parts[0] != TOKEN_PREFIX or len(parts[1]) != 12:
            raise BackendError("auth_failed", "malformed token")
        rows = self.store.query("SELECT * FROM users WHERE token_id = ?", [parts[1]])
        if not rows or not hmac.compare_digest(_hash_secret(bytes.fromhex(rows[0]["salt"]), parts[2]), rows[0]["token_hash"]):
            raise BackendError("auth_failed", "unknown token")
        r = rows[0]
        if r["revoked_at"] is not None:
            raise BackendError("auth_failed", f"the token of user {r['name']!r} was revoked")
        if _expired(r):
            raise BackendError("auth_failed", f"the token of user {r['name']!r} expired on "
                                              f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(r['expires_at']))}; "
                                              "an admin issues a new one (backend user revoke, then add)")
        return User(r["name"], r["role"], r["created_at"], None, r["token_id"])

    def is_active(self, name: str) -> bool:
        rows = self.store.query("SELECT revoked_at FROM users WHERE name = ?", [name])
        return bool(rows) and rows[0]["revoked_at"] is None

    def sessions_still_valid(self, users: list[User]) -> list[bool]:
        """Per authenticated user: is the token it came in with still the name's live token, with
        the same role? Revoking a name and adding it again (even by the command line, on another
        process) issues a new token, and the old sessions lose everything they had."""
        rows = {r["name"]: r for r in self.store.query("SELECT name, role, token_id, revoked_at, expires_at FROM users")}
        return [(r := rows.get(u.name)) is not None and r["revoked_at"] is None and r["token_id"] == u.token_id
                and r["role"] == u.role and not _expired(r) for u in users]

    def revoke_user(self, name: str) -> None:
        with self.store.transaction():
            rows = self.store.query("SELECT revoked_at FROM users WHERE name = ?", [name])
            if not rows:
                raise BackendError("not_found", f"no user named {name!r}")
            if rows[0]["revoked_at"] is None:
                self.store.execute("UPDATE users SET revoked_at = ? WHERE name = ?", [time.time(), name])

    def users(self) -> list[User]:
        return [User(r["name"], r["role"], r["created_at"], r["revoked_at"])
                for r in self.store.query("SELECT * FROM users ORDER BY name")]

    # ------------------------------------------------------------ ingest
    def _current(self, episode_id: str) -> dict | None:
        rows = self.store.query("SELECT * FROM episode_owners WHERE episode_id = ?", [episode_id])
        return rows[0] if rows else None

    def _verdict(self, cur: dict | None, user: User, revision: int, digest: str) -> str | None:
        """'duplicate' / 'superseded' when nothing should be written; raises when forbidden."""
        if cur is None:
            return None
        if cur["owner"] != user.name and user.role != "admin":
            raise BackendError("forbidden", f"episode {cur['episode_id']} belongs to another user")
        if cur["revision"] == revision and cur["content_hash"] == digest:
            return "duplicate"
        if revision < cur["revision"]:
            return "superseded"  # the server already has a later revision; keep it
        return None

    def precheck(self, episode_id: str, revision: int, digest: str, user: User, episode: dict | None = None) -> str | None:
        """Before asking for blobs: a status to ack at once, or None to go on. Raises when the
        episode claims what `user` may not (claims_problem), before any blob is sent."""
        if episode is not None:
            self._check_claims(Episode.from_dict(episode), user, digest)
        with self.store.transaction():
            return self._verdict(self._current(episode_id), user, revision, digest)

    def missing_blobs(self, hashes, user: User | None = None) -> list[str]:
        """The blobs an upload must send. An annotator reads only blobs of its own episodes, so a
        blob it names that it has neither in its episodes nor sent before must be sent: sending it
        is the proof that it has the content (the hash is checked on receipt). Naming the hash of
        another user's screenshot would otherwise make it readable."""
        if user is None or user.role != "annotator":
            return [h for h in hashes if not self.store.has_blob(h)]
        hashes = list(hashes)
        mine = set()
        for at in range(0, len(hashes), 500):
            part = hashes[at: at + 500]
            marks = ",".join("?" * len(part))
            mine |= {r["hash"] for r in self.store.query(
                "SELECT DISTINCT r.hash FROM blob_refs r JOIN episode_owners o ON o.episode_id = r.episode_id "
                f"WHERE o.owner = ? AND r.hash IN ({marks}) "
                f"UNION SELECT hash FROM blob_uploads WHERE user = ? AND hash IN ({marks})",
                [user.name, *part, user.name, *part])}
        return [h for h in hashes if h not in mine or not self.store.has_blob(h)]

    def put_blob(self, data: bytes, user: User | None = None) -> str:
        """Write a received blob through the store's one writer (agent.storage.store.Store.put_blob:
        pinned until the episode that refers to it commits, fsynced, renamed into place), so a
        `check --fix` on this folder while uploads arrive keeps it. With a user, remember that it
        sent these bytes."""
        digest = self.store.put_blob(data)
        if user is not None:
            self.store.execute("INSERT OR IGNORE INTO blob_uploads (hash, user) VALUES (?, ?)", [digest, user.name])
        return digest

    def ingest(self, episode: dict, digest: str, user: User) -> tuple[int, str]:
        """Store one received episode; returns (revision, status)."""
        ep = Episode.from_dict(episode)
        self._check_claims(ep, user, digest)
        now = time.time()
        with self.store.transaction():
            cur = self._current(ep.id)
            status = self._verdict(cur, user, ep.revision, digest)
            if status is None:
                owner = cur["owner"] if cur else user.name
                self.store.save_episode(ep)
                self.store.upsert("episode_owners", {"episode_id": ep.id, "owner": owner, "revision": ep.revision,
                                                     "content_hash": digest, "updated_at": now}, pk="episode_id")
                self.store.upsert("revisions", {"episode_id": ep.id, "revision": ep.revision, "content_hash": digest,
                                                "user": user.name, "received_at": now},
                                  pk=("episode_id", "revision", "content_hash"))
                status = "replaced" if cur else "stored"
            self.log_ingest(user, ep.id, ep.revision, digest, status, now)
        return ep.revision, status

    def _check_claims(self, ep: Episode, user: User, digest: str) -> None:
        corrects = any(s.provenance.source == "corrected" for s in ep.steps)
        problem = claims_problem(ep, user, self.relayed_corrections(ep.id, user.name) if corrects else frozenset())
        if problem:
            self.log_ingest(user, ep.id, ep.revision, digest, "forbidden")
            raise BackendError("forbidden", f"episode {ep.id}: {problem}")

    def log_ingest(self, user: User, episode_id: str, revision: int, digest: str, status: str,
                   t: float | None = None) -> None:
        """One line of the ingest log: who sent which revision, and what became of it."""
        self.store.insert("ingest_log", {"t": time.time() if t is None else t, "user": user.name, "episode_id": episode_id,
                                         "revision": revision, "content_hash": digest, "status": status})

    # ------------------------------------------------------------ live supervision
    def record_decision(self, run_id: str, proposal_id: str, proposed, publisher: str, decided_by: str, kind: str,
                        answer) -> int:
        """Remember a decision the server relays from `decided_by` to the agent of `publisher`, on
        the proposal `proposed` (agent.run.supervision's proposal step: episode_id, step_index,
        thought, actions). One row per step it makes the agent record, as agent.run.loop records them:
        an edit carries out its actions (or the proposal's) from the proposal's step index on, the
        first with the edited (or proposed) thought, the others with none; a takeover records the
        human's steps from there; an approval or a rejection gets one row without an action. What
        neither side can read records no action, and so vouches for nothing. Returns the rows."""
        proposed, answer = proposed if isinstance(proposed, dict) else {}, answer if isinstance(answer, dict) else {}
        index, episode_id = proposed.get("step_index"), proposed.get("episode_id")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0 or not _is_id(episode_id):
            index, episode_id = None, None
        steps: list = [(None, "")]  # a proposal naming no step of an episode: logged, vouching for nothing
        if index is not None and kind == "edit":
            actions = answer.get("actions") if answer.get("actions") is not None else proposed.get("actions")
            thought = answer.get("thought") if answer.get("thought") is not None else proposed.get("thought")
            steps = [(a, thought if k == 0 else "") for k, a in enumerate(actions if isinstance(actions, list) else [])]
        elif index is not None and kind == "takeover":
            human = answer.get("steps")
            steps = [(h.get("action"), h.get("thought")) for h in human if isinstance(h, dict)] if isinstance(human, list) else []
        now, rows = time.time(), []
        for k, (action, thought) in enumerate(steps[:RELAYED_STEPS_MAX] or [(None, "")]):
            try:
                action = Action.from_dict(action) if action is not None else None
            except (SchemaError, TypeError, AttributeError):
                action = None
            at = None if index is None else index + k
            _, _, action_key, thought_key = _relayed_key(at, decided_by, action, thought if isinstance(thought, str) else "")
            rows.append({"t": now, "run_id": run_id, "proposal_id": proposal_id, "episode_id": episode_id,
                         "step_index": at, "decision": kind, "decided_by": decided_by, "publisher": publisher,
                         "action": action_key if action is not None else None, "thought_sha256": thought_key})
        with self.store.transaction():
            for row in rows:
                self.store.insert("relayed_decisions", row)
        return len(rows)

    def relayed_corrections(self, episode_id: str, publisher: str) -> frozenset:
        """claims_problem's `relayed`: the corrected steps of `episode_id` this backend relayed to
        `publisher`. A relayed step recorded without its thought (the agent keeps the thought on
        the first step a reply carries out) is the same correction."""
        rows = self.store.query(
            "SELECT step_index, decided_by, action, thought_sha256 FROM relayed_decisions WHERE episode_id = ? "
            "AND publisher = ? AND decision = 'edit' AND action IS NOT NULL", [episode_id, publisher])
        return frozenset(k for r in rows for k in ((r["step_index"], r["decided_by"], r["action"], r["thought_sha256"]),
                                                  (r["step_index"], r["decided_by"], r["action"], _NO_THOUGHT)))

    def relayed_decisions(self, run_id: str | None = None) -> list[dict]:
        if run_id:
            return self.store.query("SELECT * FROM relayed_decisions WHERE run_id = ? ORDER BY id", [run_id])
        return self.store.query("SELECT * FROM relayed_decisions ORDER BY id")

    # ------------------------------------------------------------ reads
    def list_episodes(self, user: User, owner: str | None = None, limit: int | None = None) -> list[dict]:
        if user.role == "annotator":
            if owner not in (None, user.name):
                raise BackendError("forbidden", "annotators can only list their own episodes")
            owner = user.name
        sql = ("SELECT o.episode_id, o.owner, o.revision, o.content_hash, o.updated_at, e.kind, e.instruction, "
               "e.n_steps FROM episode_owners o JOIN episodes e ON e.id = o.episode_id")
        params: list = []
        if owner:
            sql += " WHERE o.owner = ?"
            params.append(owner)
        sql += " ORDER BY o.updated_at DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [{"id": r["episode_id"], **{k: r[k] for k in r if k != "episode_id"}} for r in self.store.query(sql, params)]

    def owner_of(self, episode_id: str) -> str | None:
        rows = self.store.query("SELECT owner FROM episode_owners WHERE episode_id = ?", [episode_id])
        return rows[0]["owner"] if rows else None

    def get_episode(self, episode_id: str, user: User) -> tuple[dict, str]:
        owner = self.owner_of(episode_id)
        if owner is None:
            raise BackendError("not_found", f"no episode {episode_id!r}")
        if user.role == "annotator" and owner != user.name:
            raise BackendError("forbidden", f"episode {episode_id} belongs to another annotator")
        try:
            return self.store.load_episode(episode_id).to_dict(), owner
        except NotFound:
            raise BackendError("not_found", f"no episode {episode_id!r}") from None

    def get_blob(self, digest: str, user: User) -> bytes:
        if user.role == "annotator":
            rows = self.store.query(
                "SELECT 1 FROM blob_refs r JOIN episode_owners o ON o.episode_id = r.episode_id "
                "WHERE r.hash = ? AND o.owner = ? LIMIT 1", [digest, user.name])
            if not rows:
                raise BackendError("forbidden", f"blob {digest} is not in any of your episodes")
        try:
            return self.store.get_blob(digest)
        except NotFound:
            raise BackendError("not_found", f"no blob {digest}") from None

    def ingest_log(self, episode_id: str | None = None) -> list[dict]:
        if episode_id:
            return self.store.query("SELECT * FROM ingest_log WHERE episode_id = ? ORDER BY id", [episode_id])
        return self.store.query("SELECT * FROM ingest_log ORDER BY id")

    # ------------------------------------------------------------ models
    def announce_model(self, version: str, info: dict) -> None:
        try:
            check_model_version(version)  # clients pull it into a folder of that name
        except ModelFilesError as e:
            raise BackendError("bad_field", str(e)) from None
        self.store.upsert("models", {"version": version, "info": json.dumps(info), "announced_at": time.time()}, pk="version")

    def model(self, version: str) -> tuple[str, dict] | None:
        rows = self.store.query("SELECT * FROM models WHERE version = ?", [version])
        return (rows[0]["version"], json.loads(rows[0]["info"] or "{}")) if rows else None

    def latest_model(self) -> tuple[str, dict] | None:
        """The newest announced version whose name clients may pull (an older release stored any)."""
        rows = self.store.query("SELECT * FROM models ORDER BY announced_at DESC")
        row = next((r for r in rows if is_model_version(r["version"])), None)
        return (row["version"], json.loads(row["info"] or "{}")) if row else None
