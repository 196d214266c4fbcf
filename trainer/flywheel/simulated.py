"""Simulated human data for trying the flywheel on a machine with no people at it: the sandbox
expert's episodes re-labelled as a person's. Always marked as simulated (meta["simulated"]).

  - recordings: kind "recording", provenance human, marked successful by the annotator after
    review (a share `unmarked_rate` is left unjudged, as people forget; those are not SFT data),
    click points jittered by a few pixels (hands are not exact) and, now and then, a step whose
    thought was left empty (the rule checks catch it);
  - supervised runs: kind "supervised", one step shown as a supervisor's correction of a wrong
    proposal (a click elsewhere), so corrections and preference pairs have something to read.
"""
from __future__ import annotations

import random

from agent import coords
from agent.grammar import format_normalized
from agent.schema import Action, Outcome, Provenance
from trainer.rollout.runner import demonstrate, trajectory_to_episode
from trainer.sandbox.families import FAMILIES


def _jitter(action: Action, rng: random.Random, px: float, w: int, h: int) -> Action:
    def move(p):
        return (min(1.0, max(0.0, p[0] + rng.gauss(0, px) / w)), min(1.0, max(0.0, p[1] + rng.gauss(0, px) / h)))

    return action.map_points(move)


SIMULATED_SEEDS = 700_000  # the simulated humans' task seeds start here: train split, apart from the expert's


def simulate(store, *, recordings: int = 0, supervised: int = 0, families=None, width: int = 320, height: int = 240,
             jitter_px: float = 1.5, empty_thought_rate: float = 0.1, unmarked_rate: float = 0.0, seed: int = 0,
             seed_start: int = SIMULATED_SEEDS) -> dict:
    """Store `recordings` + `supervised` simulated human episodes; returns their ids by kind."""
    fams = list(families or FAMILIES)
    rng = random.Random(seed)
    n = recordings + supervised
    tickets = [(seed_start + k, fams[k % len(fams)]) for k in range(n)]
    out = {"recording": [], "supervised": []}
    for k, traj in enumerate(demonstrate(tickets, env_kw={"width": width, "height": height})):
        if not traj.success:
            continue  # a person would not submit a recording of a task they did not finish
        ep = trajectory_to_episode(traj, store, producer="simulated-annotator")
        kind = "recording" if k < recordings else "supervised"
        ep.kind, ep.producer, ep.policy_version = kind, "simulated-annotator", None
        if kind == "recording":
            ep.outcome = Outcome() if rng.random() < unmarked_rate else Outcome(True, 1.0, "annotator")
        else:
            ep.outcome = Outcome(True, 1.0, "supervisor")
        ep.meta = {**ep.meta, "simulated": True}
        for s in ep.steps:
            w, h = s.observation.width, s.observation.height
            if kind == "recording":
                s.provenance = Provenance(source="human")
                s.action = _jitter(s.action, rng, jitter_px, w, h)
                if rng.random() < empty_thought_rate:
                    s.thought = ""
            else:
                s.provenance = Provenance(source="agent", policy_version="simulated-policy", decision="approve",
                                          decided_by="simulated-supervisor")
        if kind == "supervised":
            fix = ep.steps[rng.randrange(len(ep.steps))]
            wrong = fix.action.map_points(lambda p: (1.0 - p[0], 1.0 - p[1])) if fix.action.points() else Action("wait")
            fix.provenance = Provenance(source="corrected", proposal_thought="I will act here.", proposal_action=wrong,
                                        policy_version="simulated-policy", decision="edit",
                                        decided_by="simulated-supervisor")
            # what the live loop keeps of a corrected step: the model's own reply, the proposal (the
            # preference pair's rejected side), not the expert's that the correction carries out
            fix.raw_response = format_normalized("I will act here.", [wrong], coords.SMART_RESIZE,
                                                 fix.observation.width, fix.observation.height)
        store.save_episode(ep, bump_revision=True)
        out[kind].append(ep.id)
    return out
