"""The model registry: every model version the flywheel made, with its evaluation, its lineage
and its checkpoint, and a "current" pointer that only a better version may move.

A version is a row of `flywheel_models` in the store's database: version id ("v0001"), status
(candidate | current | rejected | retired), parent, iteration, checkpoint path (a transformers
directory), metrics ({"mean_success", "families": {name: {"success", ...}}, ...}) and lineage
({"pools": {"sft": [episode ids], "ct": [...]}, "stages": [...], "parents": [...]}).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from agent.storage.model_files import ModelFilesError, check_model_version
from agent.storage.store import AddColumn
from trainer.flywheel import FlywheelError
from trainer.stats import paired_difference

MODELS_TABLE = "flywheel_models"
MIGRATIONS = [  # agent.storage.store.Store.migrate; step 1 is the table every release before migrations made
    f"""CREATE TABLE IF NOT EXISTS "{MODELS_TABLE}" ("version" TEXT PRIMARY KEY, "path" TEXT, "status" TEXT,
        "parent" TEXT, "iteration" INTEGER, "metrics" TEXT, "lineage" TEXT, "created_at" REAL, "note" TEXT)""",
    AddColumn(MODELS_TABLE, "decision", "TEXT"),  # why it was or was not promoted
]
CURRENT_KEY = "flywheel.current_model"
STATUSES = ("candidate", "current", "rejected", "retired")


@dataclass
class ModelVersion:
    version: str
    path: str
    status: str = "candidate"
    parent: str | None = None
    iteration: int = 0
    metrics: dict = field(default_factory=dict)
    lineage: dict = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    note: str = ""
    decision: str = ""  # why it was or was not promoted

    @property
    def mean_success(self) -> float | None:
        return self.metrics.get("mean_success")

    def family_success(self) -> dict:
        return {k: v.get("success") for k, v in (self.metrics.get("families") or {}).items()}


def eval_summary(metrics: dict) -> dict | None:
    """A version's evaluation in brief: {"episodes", "success", "ci95", "seed_start",
    "seeds_per_family", "iteration"} (None when it has none)."""
    overall = (metrics or {}).get("overall")
    if not overall:
        return None
    return {"episodes": overall["episodes"], "success": overall["success"], "ci95": overall["ci95"],
            **{k: metrics[k] for k in ("seed_start", "seeds_per_family", "measured_at_iteration") if k in metrics}}


def paired_comparison(current: dict, candidate: dict) -> dict:
    """Candidate minus current on the same episodes (family, seed), with the paired 95% interval
    (trainer.stats.paired_difference). Refuses evaluations that are not on the same episodes."""
    if candidate.get("eval_signature") != current.get("eval_signature"):
        raise FlywheelError("the two models were evaluated differently "
                            f"({candidate.get('eval_signature')!r} vs {current.get('eval_signature')!r}); re-evaluate")
    mine = {(f, int(s)): bool(ok) for f, s, ok in candidate.get("outcomes") or []}
    theirs = {(f, int(s)): bool(ok) for f, s, ok in current.get("outcomes") or []}
    if not mine or mine.keys() != theirs.keys():
        raise FlywheelError(f"the two evaluations are not on the same episodes ({len(mine)} vs {len(theirs)} "
                            "outcomes, or different seeds); re-evaluate both on the same seeds")
    keys = sorted(mine)
    d = paired_difference([theirs[k] for k in keys], [mine[k] for k in keys])
    return {"episodes": d["episodes"], "current": d["first"], "candidate": d["second"], "diff": d["diff"],
            "ci95": d["ci95"], "discordant": d["discordant"]}


def promotes(comparison: dict, min_gain: float = 0.0) -> bool:
    """Promotion on evidence: the paired interval's lower end is above min_gain, so a gain the
    noise could explain (a copy of the current model, a lucky few seeds) does not promote."""
    return comparison["ci95"][0] > min_gain


def explain_decision(candidate: str, current: str, comparison: dict, promoted: bool, min_gain: float = 0.0) -> str:
    """Why a candidate was or was not promoted, in words a person reads on the Train page."""
    c = comparison
    lo, hi = c["ci95"]
    evidence = (f"held-out success {_pct(c['candidate'])} vs {_pct(c['current'])} on the same {c['episodes']} fresh "
                f"episodes; difference {_pts(c['diff'])} points, 95% CI [{_pts(lo)}, {_pts(hi)}]")
    if promoted:
        return f"promoted over {current}: {evidence}, above {_pts(min_gain)}"
    return f"not promoted, {current} stays: {evidence}, not above {_pts(min_gain)}"


def _pct(v) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def _pts(v: float) -> str:
    return f"{100 * v:+.1f}"


class Registry:
    def __init__(self, store):
        self.store = store
        store.migrate(MODELS_TABLE, MIGRATIONS)

    # ------------------------------------------------------------ reading
    @staticmethod
    def _from_row(r: dict) -> ModelVersion:
        return ModelVersion(r["version"], r["path"], r["status"], r["parent"], r["iteration"] or 0,
                            json.loads(r["metrics"] or "{}"), json.loads(r["lineage"] or "{}"), r["created_at"], r["note"] or "",
                            r.get("decision") or "")

    def versions(self) -> list[ModelVersion]:
        return [self._from_row(r) for r in self.store.query(f"SELECT * FROM {MODELS_TABLE} ORDER BY created_at, version")]

    def get(self, version: str) -> ModelVersion:
        rows = self.store.query(f"SELECT * FROM {MODELS_TABLE} WHERE version = ?", [version])
        if not rows:
            known = ", ".join(v.version for v in self.versions()) or "none"
            raise FlywheelError(f"no model version {version!r} in the registry (known: {known})")
        return self._from_row(rows[0])

    def current(self) -> ModelVersion | None:
        v = self.store.get_setting(CURRENT_KEY)
        return self.get(v) if v else None

    def next_version(self) -> str:
        nums = [int(v.version[1:]) for v in self.versions() if v.version[1:].isdigit()]
        return f"v{(max(nums) + 1 if nums else 0):04d}"

    # ------------------------------------------------------------ writing
    def register(self, path, *, parent: str | None = None, iteration: int = 0, metrics: dict | None = None,
                 lineage: dict | None = None, version: str | None = None, note: str = "") -> ModelVersion:
        """Add a candidate version (never current by itself: see promote / decide)."""
        if parent is not None:
            self.get(parent)  # names a version that exists
        mv = ModelVersion(version or self.next_version(), str(path), "candidate", parent, int(iteration),
                          dict(metrics or {}), dict(lineage or {}), note=note)
        try:
            check_model_version(mv.version)  # apps pull it into a folder of that name
        except ModelFilesError as e:
            raise FlywheelError(str(e)) from None
        with self.store.transaction():
            if self.store.query(f"SELECT 1 FROM {MODELS_TABLE} WHERE version = ?", [mv.version]):
                raise FlywheelError(f"model version {mv.version!r} is already registered")
            self.store.insert(MODELS_TABLE, self._row(mv))
        return mv

    @staticmethod
    def _row(mv: ModelVersion) -> dict:
        return {"version": mv.version, "path": mv.path, "status": mv.status, "parent": mv.parent,
                "iteration": mv.iteration, "metrics": json.dumps(mv.metrics), "lineage": json.dumps(mv.lineage),
                "created_at": mv.created_at, "note": mv.note, "decision": mv.decision}

    def update(self, version: str, **fields) -> ModelVersion:
        mv = self.get(version)
        for k, v in fields.items():
            if k not in ("status", "metrics", "lineage", "note", "path", "decision"):
                raise FlywheelError(f"a model version's {k!r} cannot be changed")
            if k == "status" and v not in STATUSES:
                raise FlywheelError(f"status must be one of {STATUSES}, got {v!r}")
            setattr(mv, k, v)
        self.store.upsert(MODELS_TABLE, self._row(mv), pk="version")
        return mv

    def promote(self, version: str) -> ModelVersion:
        """Make `version` current; the previous current one is retired (kept, still loadable)."""
        mv = self.get(version)
        if mv.status == "rejected":
            raise FlywheelError(f"model version {version!r} was rejected ({mv.note}); it cannot become current")
        with self.store.transaction():
            old = self.current()
            if old is not None and old.version != version:
                self.update(old.version, status="retired")
            self.update(version, status="current")
            self.store.set_setting(CURRENT_KEY, version)
        return self.get(version)

    def reject(self, version: str, reason: str) -> ModelVersion:
        return self.update(version, status="rejected", note=reason, decision=reason)

    def decide(self, candidate: str, *, min_gain: float = 0.0, current_metrics: dict | None = None) -> tuple[bool, str]:
        """Promote the candidate when the paired 95% interval of its held-out success minus the
        current model's, on the same episodes, lies above min_gain; else reject it. The current
        model's evaluation is `current_metrics` (measured beside the candidate's on fresh seeds)
        or its stored one. The comparison is kept in the candidate's metrics ("comparison").
        A candidate with no evaluation (its iteration failed) is rejected; with no current model,
        the candidate becomes current. Returns (promoted, why)."""
        cand = self.get(candidate)
        if not cand.metrics or "outcomes" not in cand.metrics:
            why = cand.note or "no evaluation: the iteration failed"
            self.reject(candidate, why)
            return False, why
        cur = self.current()
        if cur is None:
            why = "first model: nothing to compare with"
            self.update(candidate, decision=why)
            self.promote(candidate)
            return True, why
        comparison = paired_comparison(current_metrics or cur.metrics, cand.metrics)
        better = promotes(comparison, min_gain)
        why = explain_decision(cand.version, cur.version, comparison, better, min_gain)
        metrics = {**cand.metrics, "comparison": {"against": cur.version, "min_gain": min_gain, **comparison}}
        if better:
            self.update(candidate, metrics=metrics, decision=why)
            self.promote(candidate)
            return True, why
        self.update(candidate, metrics=metrics, status="rejected", decision=why)  # one write
        return False, why

    def make_first(self, version: str, why: str) -> ModelVersion:
        """The registry's first model becomes current without an evaluation to compare."""
        if self.current() is not None:
            raise FlywheelError(f"the registry already has a current model ({self.current().version})")
        self.update(version, decision=why)
        return self.promote(version)
