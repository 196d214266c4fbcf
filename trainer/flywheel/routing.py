"""Routing: high-quality episodes to the SFT pool, the rest to the CT pool, the unusable ones to
"rejected" (kept, never trained on). A decision is the store's judgement of the content it
scored (agent.storage.store.Store.judge: route, judged outcome, reasons), never written into the episode,
so an annotator's next upload of new content starts unscored and leaves the judgement of the old
content as it was. Every decision is also a row of `flywheel_routes` in the store's database
(episode, the content's hash, iteration, route, the route and outcome before, reasons, time), so
an iteration's routing can be undone exactly, content by content.

Corrections (steps a supervisor edited: provenance "corrected" with the agent's proposal kept)
become SFT samples of the corrected step, whatever the episode's route; corrections and rejected
proposals become preference pairs (trainer.learn.dpo.preference_pairs); both are exported as JSONL.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.schema import Episode, Outcome, SchemaError
from agent.storage.store import AddColumn
from trainer.flywheel import FlywheelError
from trainer.flywheel.scoring import Score, score_episode, step_problems
from trainer.learn.dpo import episode_pairs, pair_record, sample_record
from trainer.learn.sft import runtime_samples

ROUTES_TABLE = "flywheel_routes"
ROUTES_MIGRATIONS = [  # agent.storage.store.Store.migrate; step 1 is the table every release before migrations made
    f"""CREATE TABLE IF NOT EXISTS "{ROUTES_TABLE}" ("id" INTEGER PRIMARY KEY, "episode_id" TEXT, "iteration" INTEGER,
        "route" TEXT, "previous_route" TEXT, "outcome" TEXT, "previous_outcome" TEXT, "quality" REAL, "reasons" TEXT,
        "time" REAL, "undone_at" REAL);
    CREATE INDEX IF NOT EXISTS "idx_{ROUTES_TABLE}_iteration" ON "{ROUTES_TABLE}" ("iteration");
    CREATE INDEX IF NOT EXISTS "idx_{ROUTES_TABLE}_episode_id" ON "{ROUTES_TABLE}" ("episode_id")""",
    # the content each decision judged; older decisions judged what the episode holds now (the
    # store's migration moved their judgement under that content)
    AddColumn(ROUTES_TABLE, "content_hash", "TEXT"),
    f"""UPDATE "{ROUTES_TABLE}" SET content_hash = (SELECT content_hash FROM episodes WHERE episodes.id =
        "{ROUTES_TABLE}".episode_id) WHERE content_hash IS NULL""",
]
HUMAN_KINDS = ("recording", "supervised")


@dataclass
class RoutingConfig:
    sft_min_quality: float = 1.0  # SFT takes only episodes whose every step passed the rule checks
    sft_requires_success: bool = True  # ...and that were judged successful
    # True: a person's unjudged recording counts as successful. Off by default: an unknown outcome
    # is not SFT data (a kill-switched run of random clicks is unjudged too); mark it in the Library
    trust_human: bool = False
    reject_below_quality: float = 0.5  # fewer clean steps than this: rejected
    failed_to: str = "ct"  # where judged failures go: "ct" (the report's default) or "rejected"

    def __post_init__(self):
        for name in ("sft_min_quality", "reject_below_quality"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise FlywheelError(f"routing: {name} must be between 0 and 1, got {v!r}")
        if self.failed_to not in ("ct", "rejected"):
            raise FlywheelError(f"routing: failed_to must be 'ct' or 'rejected', got {self.failed_to!r}")

    @classmethod
    def from_dict(cls, d: dict | None) -> RoutingConfig:
        d = dict(d or {})
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise FlywheelError(f"routing: unknown setting(s) {', '.join(sorted(unknown))}")
        return cls(**d)


def decide(ep: Episode, score: Score, cfg: RoutingConfig) -> tuple[str, list[str]]:
    """(route, why) for a scored episode: pure, so tests can walk every branch. The first reason
    names the rule that decided; the step-by-step problems follow."""
    why = list(score.fatal)
    if score.fatal:
        return "rejected", why
    # missing thoughts alone never reject: a person can write them in the step viewer
    if score.usable < cfg.reject_below_quality:
        return "rejected", [f"only {score.usable:.0%} of the steps are usable (the floor is "
                            f"{cfg.reject_below_quality:.0%})"] + score.reasons
    success = score.outcome.success
    if success is None and cfg.trust_human and ep.kind in HUMAN_KINDS:
        success, why = True, [f"unjudged {ep.kind}: a person did the task (trust_human)"]
    if success is False:
        return cfg.failed_to, [f"judged failed by {score.outcome.source}"] + score.reasons
    if success is None and cfg.sft_requires_success:
        return "ct", ["outcome unknown: unjudged episodes are not SFT data; mark success or failure in the "
                      "Library"] + score.reasons
    if score.quality < cfg.sft_min_quality:
        head = (f"{score.thoughtless} of {score.steps} steps have no thought: write them in the step viewer to "
                "make this SFT data" if score.thoughtless and score.usable >= cfg.sft_min_quality
                else f"{score.quality:.0%} of the steps pass the checks (SFT needs {cfg.sft_min_quality:.0%})")
        return "ct", [head] + score.reasons
    return "sft", why + [f"judged successful by {score.outcome.source or 'trust'}, every check passed"
                         if score.quality >= 1.0 else f"judged successful by {score.outcome.source or 'trust'}, "
                         f"{score.quality:.0%} of the steps pass the checks"]


class Router:
    """Scores and routes episodes of a Store, recording each decision."""

    def __init__(self, store, cfg: RoutingConfig | None = None, *, orm=None):
        self.store, self.cfg, self.orm = store, cfg or RoutingConfig(), orm
        store.migrate(ROUTES_TABLE, ROUTES_MIGRATIONS)

    def unscored(self) -> list[str]:
        return [e.id for e in reversed(self.store.list_episodes(route="unscored"))]  # oldest first

    def route(self, iteration: int, episode_ids=None, *, progress=None, skipped: dict | None = None) -> dict:
        """Score and route `episode_ids` (default: every unscored episode); counts per route. One
        that does not load stays unscored and is named in `skipped` (see load_or_skip)."""
        ids = list(episode_ids) if episode_ids is not None else self.unscored()
        counts = {"sft": 0, "ct": 0, "rejected": 0}
        for k, eid in enumerate(ids):
            got = load_or_skip(self.store, eid, skipped, with_hash=True)
            if got is None:
                continue
            ep, digest = got
            score = score_episode(ep, image_of=self.store.get_blob, orm=self.orm)
            route, why = decide(ep, score, self.cfg)
            self._apply(ep, digest, iteration, route, score, why)
            counts[route] += 1
            if progress:
                progress(k + 1, len(ids))
        return counts

    def _apply(self, ep: Episode, digest: str, iteration: int, route: str, score: Score, why: list[str]) -> None:
        """Judge the content `digest` of `ep` (the one scored, even if a new one arrived since)."""
        with self.store.transaction():  # the judgement and its record change together
            before = self.store.judgement(ep.id, digest)
            row = {"episode_id": ep.id, "content_hash": digest, "iteration": int(iteration), "route": route,
                   "previous_route": before.route, "outcome": json.dumps(score.outcome.to_dict()),
                   "previous_outcome": json.dumps(before.outcome.to_dict() if before.outcome else None),
                   "quality": score.quality, "reasons": json.dumps(why), "time": time.time(), "undone_at": None}
            self.store.judge(ep.id, route, content_hash=digest, outcome=score.outcome,  # the Library shows `routing`
                             routing={"iteration": int(iteration), "route": route, "why": why})
            self.store.insert(ROUTES_TABLE, row)

    def decisions(self, iteration: int | None = None, *, include_undone: bool = False) -> list[dict]:
        sql, params = f"SELECT * FROM {ROUTES_TABLE}", []
        where = [] if include_undone else ["undone_at IS NULL"]
        if iteration is not None:
            where.append("iteration = ?")
            params.append(int(iteration))
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self.store.query(sql + " ORDER BY id", params)
        for r in rows:
            r["reasons"] = json.loads(r["reasons"] or "[]")
            r["outcome"], r["previous_outcome"] = json.loads(r["outcome"]), json.loads(r["previous_outcome"])
        return rows

    def undo(self, iteration: int) -> int:
        """Put the judgement of every content `iteration` routed back as it was (route and
        outcome; the reasons go with the decision), whatever content the episode holds now;
        returns how many decisions were undone. Undoing twice is a no-op."""
        rows = self.decisions(iteration)
        now = time.time()
        with self.store.transaction():
            for r in reversed(rows):
                # a deleted episode has nothing to restore
                if r["content_hash"] is not None and self.store.has_episode(r["episode_id"]):
                    before = r["previous_outcome"]
                    self.store.judge(r["episode_id"], r["previous_route"], content_hash=r["content_hash"],
                                     outcome=Outcome.from_dict(before) if before else None)
                self.store.execute(f"UPDATE {ROUTES_TABLE} SET undone_at = ? WHERE id = ?", [now, r["id"]])
        return len(rows)

    def pools(self) -> dict:
        """Episode counts per route of their current content now."""
        c = self.store.counts()["by_route"]
        return {r: c.get(r, 0) for r in ("sft", "ct", "rejected", "unscored")}

    def growth(self) -> list[dict]:
        """Per iteration, how many episodes it routed where (not undone): the pools' growth."""
        rows = self.store.query(f"SELECT iteration, route, COUNT(*) AS n FROM {ROUTES_TABLE} WHERE undone_at IS NULL "
                                "GROUP BY iteration, route ORDER BY iteration")
        out: dict[int, dict] = {}
        for r in rows:
            out.setdefault(r["iteration"], {"iteration": r["iteration"], "sft": 0, "ct": 0, "rejected": 0})[r["route"]] = r["n"]
        return list(out.values())

    def config_dict(self) -> dict:
        return asdict(self.cfg)


# ---------------------------------------------------------------- episodes the flywheel cannot read

UNREADABLE = (SchemaError, ValueError, KeyError, OSError)  # KeyError: agent.storage.store.NotFound (an episode, a blob)


def load_or_skip(store, episode_id: str, skipped: dict | None, *, with_hash: bool = False):
    """The episode (with_hash: and its content hash, Store.load_episode_version), or None when it
    does not load (stored before a check that now refuses it, a row damaged by hand): it is named
    in `skipped` (episode id -> why) and the flywheel goes on without it, instead of one bad upload
    stopping every later iteration. skipped=None raises."""
    try:
        return store.load_episode_version(episode_id) if with_hash else store.load_episode(episode_id)
    except UNREADABLE as e:
        if skipped is None:
            raise
        skipped[episode_id] = f"does not load: {type(e).__name__}: {e}"[:300]
        return None


def samples_or_skip(store, ep: Episode, skipped: dict | None) -> list:
    """trainer.learn.sft.runtime_samples of the episode, or [] (named in `skipped`) when they cannot be
    built, e.g. a screenshot missing from the store."""
    try:
        return runtime_samples(ep, store.get_blob)
    except UNREADABLE as e:
        if skipped is None:
            raise
        skipped[ep.id] = f"no training samples: {type(e).__name__}: {e}"[:300]
        return []


# ---------------------------------------------------------------- corrections


def corrected_steps(ep: Episode) -> list:
    """Steps a person edited, with the agent's proposal kept beside the correction."""
    return [s for s in ep.steps if s.provenance.source == "corrected" and s.provenance.proposal_action is not None]


def pool_samples(store, route: str, skipped: dict | None = None) -> list:
    """SFT samples (trainer.learn.sft.Sample) of a pool's episodes, prompted as the agent was, leaving
    out the steps that failed the rule checks (an unparseable output must not become a target).
    An episode that cannot be read is left out and named in `skipped` (load_or_skip)."""
    out = []
    for e in store.list_episodes(route=route):
        ep = load_or_skip(store, e.id, skipped)
        if ep is None or not ep.steps or not all(s.observation.screenshot for s in ep.steps):
            continue
        bad = step_problems(ep)
        # samples_or_skip: one sample per step, or [] for an episode it skipped
        out += [smp for s, smp in zip(ep.steps, samples_or_skip(store, ep, skipped), strict=False) if s.index not in bad]
    return out


def correction_samples(store, episode_ids, skipped: dict | None = None) -> list:
    """SFT samples (trainer.learn.sft.Sample) of the corrected steps only, prompted as the agent was."""
    out = []
    for eid in episode_ids:
        ep = load_or_skip(store, eid, skipped)
        fixed = {s.index for s in corrected_steps(ep)} if ep else set()
        if fixed and all(s.observation.screenshot for s in ep.steps):
            # samples_or_skip: one sample per step, or [] for an episode it skipped
            out += [smp for s, smp in zip(ep.steps, samples_or_skip(store, ep, skipped), strict=False) if s.index in fixed]
    return out


def export_corrections(store, out_dir, episode_ids=None, skipped: dict | None = None) -> dict:
    """Write corrections.jsonl (each corrected step's SFT sample) and preferences.jsonl (the pairs
    of trainer.learn.dpo.preference_pairs: {prompt messages, images, chosen, rejected, decision, ...},
    the usual DPO layout) into out_dir. Both in one layout, the one the flywheel trains on: the
    prompt the agent saw (trainer.learn.dpo.sample_record), so a pair's prompt is its step's sample's."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ids = list(episode_ids) if episode_ids is not None else store.episode_ids()
    n_sft = n_pairs = 0
    paths = {"corrections": out / "corrections.jsonl", "preferences": out / "preferences.jsonl"}
    tmp = {k: p.with_suffix(".jsonl.tmp") for k, p in paths.items()}
    with open(tmp["corrections"], "w", encoding="utf-8") as fs, open(tmp["preferences"], "w", encoding="utf-8") as fp:
        for eid in ids:
            ep = load_or_skip(store, eid, skipped)
            if ep is None or not all(s.observation.screenshot for s in ep.steps):
                continue
            fixed = {s.index for s in corrected_steps(ep)}
            if not fixed and not any(s.info.get("rejections") for s in ep.steps):
                continue
            samples = samples_or_skip(store, ep, skipped)
            for step, sample in zip(ep.steps, samples, strict=False):  # [] when they cannot be built
                if step.index in fixed:
                    rec = {"id": f"{ep.id}-{step.index}", "episode_id": ep.id, "step": step.index,
                           "provenance": step.provenance.source, **sample_record(sample)}
                    fs.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    n_sft += 1
            for pair in episode_pairs(ep, samples):
                fp.write(json.dumps(pair_record(pair), ensure_ascii=False) + "\n")
                n_pairs += 1
    for k in paths:
        os.replace(tmp[k], paths[k])
    return {"sft_samples": n_sft, "preference_pairs": n_pairs, **{k: str(v) for k, v in paths.items()}}
