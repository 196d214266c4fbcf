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

from trainer.flywheel import FlywheelError

MODELS_TABLE = "flywheel_models"
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

    @property
    def mean_success(self) -> float | None:
        return self.metrics.get("mean_success")

    def family_success(self) -> dict:
        return {k: v.get("success") for k, v in (self.metrics.get("families") or {}).items()}


def compare_key(metrics: dict) -> tuple:
    """What "better" means: held-out success first; ties broken by the verifier's partial
    progress, then by the share of outputs that parse (a broken model loses all three)."""
    return (round(metrics.get("mean_success", 0.0), 6), round(metrics.get("mean_progress", 0.0), 6),
            round(metrics.get("format_rate", 0.0), 6))


def is_better(candidate: dict, current: dict, min_gain: float = 0.0) -> bool:
    """True when `candidate` beats `current` (metrics dicts of the same evaluation)."""
    if candidate.get("eval_signature") != current.get("eval_signature"):
        raise FlywheelError("the two models were evaluated differently "
                            f"({candidate.get('eval_signature')!r} vs {current.get('eval_signature')!r}); re-evaluate")
    if min_gain > 0:
        return candidate.get("mean_success", 0.0) >= current.get("mean_success", 0.0) + min_gain
    return compare_key(candidate) > compare_key(current)


def explain_decision(cand: "ModelVersion", cur: "ModelVersion", better: bool, min_gain: float = 0.0) -> str:
    """Why a candidate was or was not promoted, in words a person reads on the Train page."""
    c, p = cand.metrics, cur.metrics
    n = c.get("episodes") or sum(int(f.get("episodes", 0)) for f in (c.get("families") or {}).values())
    rates = f"held-out success {_pct(c.get('mean_success'))} vs {_pct(p.get('mean_success'))}" + (f" on {n} episodes" if n else "")
    if min_gain > 0:
        need = f"needs a gain of at least {_pct(min_gain)}"
        return f"{'promoted' if better else 'kept ' + cur.version}: {rates} ({need})"
    if better:
        if round(c.get("mean_success", 0.0), 6) > round(p.get("mean_success", 0.0), 6):
            return f"promoted over {cur.version}: {rates}"
        tie = ("more partial progress" if round(c.get("mean_progress", 0.0), 6) > round(p.get("mean_progress", 0.0), 6)
               else "more replies that parse")
        return f"promoted over {cur.version}: {rates}, a tie broken by {tie}"
    if round(c.get("mean_success", 0.0), 6) < round(p.get("mean_success", 0.0), 6):
        return f"not promoted, {cur.version} stays: {rates}"
    return f"not promoted, {cur.version} stays: {rates}, and no more partial progress or parsed replies"


def _pct(v) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


class Registry:
    def __init__(self, store):
        self.store = store
        with store._lock:
            if MODELS_TABLE not in store.db.table_names():
                store.db[MODELS_TABLE].create(
                    {"version": str, "path": str, "status": str, "parent": str, "iteration": int, "metrics": str,
                     "lineage": str, "created_at": float, "note": str},
                    pk="version")

    # ------------------------------------------------------------ reading
    @staticmethod
    def _from_row(r: dict) -> ModelVersion:
        return ModelVersion(r["version"], r["path"], r["status"], r["parent"], r["iteration"] or 0,
                            json.loads(r["metrics"] or "{}"), json.loads(r["lineage"] or "{}"), r["created_at"], r["note"] or "")

    def versions(self) -> list[ModelVersion]:
        with self.store._lock:
            rows = list(self.store.db.query(f"SELECT * FROM {MODELS_TABLE} ORDER BY created_at, version"))
        return [self._from_row(r) for r in rows]

    def get(self, version: str) -> ModelVersion:
        with self.store._lock:
            rows = list(self.store.db.query(f"SELECT * FROM {MODELS_TABLE} WHERE version = ?", [version]))
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
        with self.store._lock:
            if list(self.store.db.query(f"SELECT 1 FROM {MODELS_TABLE} WHERE version = ?", [mv.version])):
                raise FlywheelError(f"model version {mv.version!r} is already registered")
            with self.store.transaction():
                self.store.db[MODELS_TABLE].insert(self._row(mv), pk="version")
        return mv

    @staticmethod
    def _row(mv: ModelVersion) -> dict:
        return {"version": mv.version, "path": mv.path, "status": mv.status, "parent": mv.parent,
                "iteration": mv.iteration, "metrics": json.dumps(mv.metrics), "lineage": json.dumps(mv.lineage),
                "created_at": mv.created_at, "note": mv.note}

    def update(self, version: str, **fields) -> ModelVersion:
        mv = self.get(version)
        for k, v in fields.items():
            if k not in ("status", "metrics", "lineage", "note", "path"):
                raise FlywheelError(f"a model version's {k!r} cannot be changed")
            if k == "status" and v not in STATUSES:
                raise FlywheelError(f"status must be one of {STATUSES}, got {v!r}")
            setattr(mv, k, v)
        with self.store._lock, self.store.transaction():
            self.store.db[MODELS_TABLE].upsert(self._row(mv), pk="version")
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
        return self.update(version, status="rejected", note=reason)

    def decide(self, candidate: str, *, min_gain: float = 0.0) -> tuple[bool, str]:
        """Promote the candidate if it beats the current model on the same evaluation, else
        reject it. Returns (promoted, why). A candidate with no metrics (its evaluation failed)
        is rejected; with no current model, any evaluated candidate becomes current."""
        cand = self.get(candidate)
        if not cand.metrics or "mean_success" not in cand.metrics:
            why = cand.note or "no evaluation: the iteration failed"
            self.reject(candidate, why)
            return False, why
        cur = self.current()
        if cur is None:
            self.promote(candidate)
            return True, "first model: nothing to compare with"
        better = is_better(cand.metrics, cur.metrics, min_gain)
        why = explain_decision(cand, cur, better, min_gain)
        if better:
            if not cand.note:
                self.update(candidate, note=why)
            self.promote(candidate)
            return True, why
        self.reject(candidate, why)
        return False, why
