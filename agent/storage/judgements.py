"""What the flywheel decided about one content of an episode: the Judgement record, the SQL that joins
each episode to the judgement of its current content, and the migration that moved judgements out of
the episodes (agent.storage.store owns the table and its reads and writes)."""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent.schema import ROUTES, Episode, Outcome, SchemaError
from agent.storage.files import sha256

if TYPE_CHECKING:
    from agent.storage.store import Store


def episode_content_hash(ep: Episode) -> str:
    """The hash of an episode's content, what its judgements are keyed by: SHA-256 of its dict as
    canonical JSON (the same function as agent.protocol.content_hash)."""
    text = json.dumps(ep.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def move_judgements_out(store: Store) -> None:
    """Migration: stores before `judgements` kept the flywheel's route, reasons (meta['routing'])
    and judged outcome inside the episode. Each such judgement moves to `judgements` under the
    episode's content once it is taken out, the episode gets back its own outcome (the one the
    flywheel's last live routing record saw before it, else the one it holds: a person's or a
    verifier's mark, which the flywheel keeps), and every row gets its content hash. Touches only
    rows without a hash, so running it again changes nothing."""
    routes = "flywheel_routes" in store.db.table_names()
    for r in list(store.db.query("SELECT * FROM episodes WHERE content_hash IS NULL")):
        meta = json.loads(r["meta"] or "{}")
        routing = meta.pop("routing", None)
        route = r["route"] if r["route"] in ROUTES else "unscored"
        judged = route != "unscored" or routing is not None
        outcome = {"success": None if r["success"] is None else bool(r["success"]), "reward": r["reward"],
                   "source": r["outcome_source"]}
        own = outcome
        if judged and routes:
            before = list(store.db.query("SELECT previous_outcome FROM flywheel_routes WHERE episode_id = ? AND "
                                         "undone_at IS NULL ORDER BY id DESC LIMIT 1", [r["id"]]))
            if before and before[0]["previous_outcome"]:
                own = json.loads(before[0]["previous_outcome"]) or outcome
        store.db.execute("UPDATE episodes SET route = 'unscored', meta = ?, success = ?, reward = ?, outcome_source = ? "
                         "WHERE id = ?", [json.dumps(meta), None if own.get("success") is None else int(own["success"]),
                                          own.get("reward"), own.get("source"), r["id"]])
        try:
            digest = episode_content_hash(store.load_episode(r["id"]))
        except (SchemaError, ValueError, KeyError):  # a row that does not load: named by its row instead
            digest = sha256(json.dumps({**r, "meta": json.dumps(meta)}, sort_keys=True, default=str).encode())
        store.db.execute("UPDATE episodes SET content_hash = ? WHERE id = ?", [digest, r["id"]])
        if judged:
            store.db.execute("INSERT OR IGNORE INTO judgements (episode_id, content_hash, route, outcome, routing, "
                             "revision, updated_at) VALUES (?, ?, ?, ?, ?, 1, ?)",
                             [r["id"], digest, route, json.dumps(outcome), json.dumps(routing or {}), time.time()])


@dataclass(frozen=True)
class Judgement:
    """What the flywheel decided about one content of an episode (Store.judge)."""

    route: str = "unscored"
    outcome: Outcome | None = None  # the outcome it judged (a verifier's, a person's, the ORM's); None: none
    routing: dict = field(default_factory=dict)  # {"iteration", "route", "why"}: shown in the Library
    revision: int = 0  # changes to this content's judgement so far
    content_hash: str | None = None


# the judgement of each episode's current content, joined to `episodes e`; its route, unscored when none
JUDGED_JOIN = "LEFT JOIN judgements j ON j.episode_id = e.id AND j.content_hash = e.content_hash"
ROUTE_SQL = "COALESCE(j.route, 'unscored')"


def judgement_from_row(r: dict) -> Judgement:
    outcome, routing = r["outcome"], r["routing"]
    return Judgement(r["route"], Outcome.from_dict(json.loads(outcome)) if outcome else None,
                     json.loads(routing) if isinstance(routing, str) else dict(routing or {}),
                     r["revision"] or 0, r["content_hash"])
