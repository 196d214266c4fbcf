"""Grounding on sandbox screens: finding a named element, the skill every task family needs.

`grounding_samples` makes UI-TARS-style grounding data for SFT: on fresh task screens, for some
of the labelled clickable elements (Task.labelled_targets), the agent's own first-turn prompt
with the instruction "Click on 'X'." and a click on X's centre as the reply. `grounding_eval`
scores a policy the same way on held-out screens: the share of its greedy clicks that land in
the named element's box (what ScreenSpot measures on real screenshots), per family.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from agent import coords
from agent.grammar import format_normalized, parse_normalized
from agent.policies.base import build_prompt
from agent.policies.memory import Memory
from trainer.learn.sft import Sample
from trainer.rollout.pool import frame_of
from trainer.sandbox.env import SandboxEnv
from trainer.sandbox.task import HELDOUT_START

INSTRUCTIONS = ("Click on '{}'.", "Click '{}'.", "Press '{}'.", "Select '{}'.")
SPACE = coords.SMART_RESIZE  # the coordinate space of the prompts and replies, as in the recipe's rollouts


@dataclass
class _Ask:
    """One "Click on 'X'." on one screen: the element, its click and box, the agent's prompt."""
    family: str
    seed: int
    text: str
    click: object  # agent.schema.Action
    box: tuple[float, float, float, float]
    instruction: str
    frame: object  # agent.executors.base.Frame
    messages: list


def _asks(families, screens_per_family: int, seed_start: int, per_screen: int, width: int, height: int, rng,
          memory_kw=None, progress=None, observation: str = "elements"):
    """An _Ask for each of up to `per_screen` labelled elements of each screen."""
    env = SandboxEnv(width=width, height=height, coords_space=SPACE, observation=observation)
    try:
        for k in range(screens_per_family * len(families)):
            fam, seed = families[k % len(families)], seed_start + k
            obs, _ = env.reset(seed=seed, options={"family": fam})
            frame, targets = frame_of(obs), env.labelled_targets()
            for text, action, box in rng.sample(targets, min(per_screen, len(targets))):
                instruction = rng.choice(INSTRUCTIONS).format(text)
                messages = Memory(**(memory_kw or {})).build_messages(build_prompt(instruction, ("desktop",)), frame,
                                                                      space=SPACE)
                yield _Ask(fam, seed, text, action, box, instruction, frame, messages)
            if progress:
                progress()
    finally:
        env.close()


def grounding_samples(families, screens_per_family: int, *, width: int, height: int, per_screen: int = 4,
                      seed_start: int = 500_000, memory_kw=None, progress: bool = True, observation: str = "elements"):
    """SFT samples: "Click on 'X'." -> "Thought: I need to click 'X'.\\nAction: click(...)" on
    training screens (seeds from `seed_start`, which must stay below the held-out split)."""
    from tqdm import tqdm

    if seed_start + screens_per_family * len(families) > HELDOUT_START:
        raise ValueError("grounding screens must come from training seeds (below the held-out split)")
    bar = tqdm(total=screens_per_family * len(families), desc="grounding", disable=not progress or None)
    samples = []
    for a in _asks(families, screens_per_family, seed_start, per_screen, width, height,
                   random.Random(f"grounding:{seed_start}"), memory_kw, progress=lambda: bar.update(1),
                   observation=observation):
        reply = format_normalized(f"I need to click '{a.text}'.", [a.click], SPACE, width, height)
        samples.append(Sample(a.messages, reply, f"grounding:{a.family}:{a.seed}:{a.text}"))
    bar.close()
    return samples


def grounding_eval(actor, families, screens_per_family: int, *, width: int, height: int, per_screen: int = 2,
                   seed_start: int | None = None, memory_kw=None, progress=None, observation: str = "elements") -> dict:
    """Greedy clicks for "Click on 'X'." on held-out screens: {"families": {name: {"accuracy",
    "asked", "unparsed", "named", "accuracy_named"}}, "mean_accuracy", "mean_named"}; a reply
    that does not parse counts as a miss. "named" is the share of replies whose thought names X
    (the instruction was read), "accuracy_named" the hits among those (X found on the screen once
    it was read): the two halves of a miss, told apart.

    `actor` is a rollout actor (`generate(messages, greedy=True)`, as trainer.rollout.actors.VLMActor) or
    an agent policy (`propose(instruction, memory, frame)`, any of agent.policies)."""
    start = HELDOUT_START if seed_start is None else seed_start
    out: dict = {"families": {f: {"hits": 0, "asked": 0, "unparsed": 0, "named": 0, "hits_named": 0} for f in families}}
    for a in _asks(families, screens_per_family, start, per_screen, width, height,
                   random.Random(f"grounding-eval:{start}"), memory_kw, progress, observation):
        row = out["families"][a.family]
        row["asked"] += 1
        if hasattr(actor, "propose"):  # an agent policy builds its prompt itself, from the same parts
            p = actor.propose(a.instruction, Memory(**(memory_kw or {})), a.frame)
            ok, actions, thought = p.parse_error is None, list(p.actions), p.thought or p.raw_text.split("Action:")[0]
        else:
            text = actor.generate(a.messages, greedy=True).text
            parsed = parse_normalized(text, SPACE, width, height, platform="sandbox")
            ok, actions, thought = bool(parsed), list(parsed.actions) if parsed else [], text.split("Action:")[0]
        named = re.search(rf"(?<!\w){re.escape(a.text)}(?!\w)", thought) is not None
        row["named"] += named
        point = actions[0].args.get("start_box") if ok and actions else None
        if point is None:
            row["unparsed"] += not ok
            continue
        x0, y0, x1, y1 = a.box
        hit = x0 <= point[0] < x1 and y0 <= point[1] < y1
        row["hits"] += hit
        row["hits_named"] += hit and named
    for row in out["families"].values():
        hits, hits_named = row.pop("hits"), row.pop("hits_named")
        row["accuracy"] = hits / row["asked"] if row["asked"] else 0.0
        row["accuracy_named"] = hits_named / row["named"] if row["named"] else 0.0
        row["named"] = row["named"] / row["asked"] if row["asked"] else 0.0
    rows = list(out["families"].values())
    out["mean_accuracy"] = sum(r["accuracy"] for r in rows) / len(rows) if rows else 0.0
    out["mean_named"] = sum(r["named"] for r in rows) / len(rows) if rows else 0.0
    return out
