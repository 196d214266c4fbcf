"""What supervisors decided, as data: a per-run decision log and the statistics of a session.

`DecisionLog` listens to AgentLoop's events and appends every human gate decision to the
episode's meta["decisions"] as {"step", "kind", "proposed", "final", "seconds", "by", "reason"}
(the loop stores approvals and edits on the steps, but a rejection's time is not kept there).
`decision_stats(episodes)` summarises a session: approval rate, edits and rejections by the
proposed action's type, time per decision. Episodes without a log fall back to the steps'
provenance and the rejections the loop keeps in step info.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field


class DecisionLog:
    """`loop.on_event = DecisionLog(loop, then=other_callback)`; safe to chain."""

    def __init__(self, loop, then=None):
        self.loop = loop
        self.then = then
        self._proposal = None

    def __call__(self, kind: str, payload: dict) -> None:
        if kind == "proposal":
            self._proposal = payload.get("proposal")
        elif kind == "decision" and self.loop.episode is not None:
            d, p = payload["decision"], self._proposal
            proposed = p.actions[0].name if p is not None and p.actions else None
            final = d.actions[0].name if d.kind == "edit" and d.actions else proposed
            self.loop.episode.meta.setdefault("decisions", []).append({
                "step": len(self.loop.episode.steps), "kind": d.kind, "proposed": proposed, "final": final,
                "seconds": d.seconds, "by": d.decided_by, "reason": d.reason,
                "thought_changed": bool(d.kind == "edit" and d.thought is not None and p is not None and d.thought != p.thought),
            })
        if self.then is not None:
            self.then(kind, payload)


@dataclass
class DecisionStats:
    decisions: int = 0
    counts: dict = field(default_factory=dict)  # kind -> n (approve, edit, reject, takeover, stop)
    edits_by_action: dict = field(default_factory=dict)  # proposed action name -> n edits
    rejections_by_action: dict = field(default_factory=dict)
    seconds: list = field(default_factory=list)  # time per decision, where known
    episodes: int = 0

    @property
    def judged(self) -> int:
        """Proposals a person answered with approve, edit or reject: what the approval rate is over
        (a takeover or a stop judges no proposal)."""
        return sum(self.counts.get(k, 0) for k in ("approve", "edit", "reject"))

    @property
    def approval_rate(self) -> float | None:
        """Approved as proposed, over `judged`."""
        return self.counts.get("approve", 0) / self.judged if self.judged else None

    def seconds_quantile(self, q: float) -> float | None:
        """The q-quantile of the decision times (interpolated between ranks), None without any."""
        if len(self.seconds) < 2:
            return self.seconds[0] if self.seconds else None
        if q <= 0 or q >= 1:
            return min(self.seconds) if q <= 0 else max(self.seconds)
        return statistics.quantiles(self.seconds, n=1000, method="inclusive")[round(q * 1000) - 1]

    @property
    def mean_seconds(self) -> float | None:
        return statistics.fmean(self.seconds) if self.seconds else None

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) rows for a table."""
        def pct(v):
            return "–" if v is None else f"{100 * v:.0f}%"

        def sec(v):
            return "–" if v is None else f"{v:.1f} s"

        out = [("episodes", str(self.episodes)), ("decisions", str(self.decisions)),
               ("approval rate", pct(self.approval_rate))]
        out += [(k, str(self.counts.get(k, 0))) for k in ("approve", "edit", "reject", "takeover", "stop")]
        out += [("time per decision (median)", sec(self.seconds_quantile(0.5))),
                ("time per decision (mean)", sec(self.mean_seconds)),
                ("time per decision (p90)", sec(self.seconds_quantile(0.9)))]
        out += [(f"edits of {k}", str(v)) for k, v in sorted(self.edits_by_action.items())]
        out += [(f"rejections of {k}", str(v)) for k, v in sorted(self.rejections_by_action.items())]
        return out


def _bump(d: dict, key, n: int = 1) -> None:
    d[key or "(none)"] = d.get(key or "(none)", 0) + n


def decision_stats(episodes) -> DecisionStats:
    out = DecisionStats()
    for ep in episodes:
        out.episodes += 1
        log = ep.meta.get("decisions")
        if log is not None:
            for d in log:
                kind = d.get("kind")
                out.decisions += 1
                _bump(out.counts, kind)
                if kind == "edit":
                    _bump(out.edits_by_action, d.get("proposed"))
                elif kind == "reject":
                    _bump(out.rejections_by_action, d.get("proposed"))
                if isinstance(d.get("seconds"), (int, float)):
                    out.seconds.append(float(d["seconds"]))
            continue
        # no log: what the loop itself kept
        rejected = [r for s in ep.steps for r in s.info.get("rejections", [])]
        rejected += ep.meta.get("unexecuted", {}).get("rejections", [])
        for r in rejected:
            out.decisions += 1
            _bump(out.counts, "reject")
            acts = r.get("actions") or []
            _bump(out.rejections_by_action, acts[0].get("name") if acts else None)
        for s in ep.steps:
            prov = s.provenance
            # one decision may cover several actions; the first carries the model's raw text
            if prov.decision not in ("approve", "edit") or s.raw_response is None:
                continue
            out.decisions += 1
            _bump(out.counts, prov.decision)
            if prov.decision == "edit":
                _bump(out.edits_by_action, prov.proposal_action.name if prov.proposal_action else None)
            if prov.decision_seconds is not None:
                out.seconds.append(float(prov.decision_seconds))
    return out
