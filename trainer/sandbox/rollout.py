"""Running episodes: the expert, the random policy or any agent Policy, in one process or many.

`run_episode` plays one (family, seed) task to its end and returns a plain dict (picklable, so
worker processes can send it back); with record=True it carries each step's screenshot as PNG
bytes, the thought and the action. `to_episode` turns such a dict into a schema Episode (kind
"rollout", producer = the policy, outcome from the verifier) and puts its screenshots in the
store. `run_many` spreads jobs over worker processes, one environment (one QApplication) each.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Iterator

from agent.elements import elements_from_dicts
from agent.schema import Action, Episode, Observation, Outcome, Provenance, ScreenGeometry, Step, monotonic
from trainer.sandbox.task import HELDOUT_START, split_of

BUILTIN_POLICIES = ("expert", "random")


def plan(episodes: int, split: str = "train", families: list[str] | None = None, start: int = 0) -> list[tuple[str, int]]:
    """`episodes` (family, seed) jobs, spread evenly over the families, seeds from the split's range."""
    from trainer.sandbox.families import FAMILIES, family_class

    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    names = list(families or FAMILIES)
    for n in names:
        family_class(n)
    base = (HELDOUT_START if split == "heldout" else 0) + start
    return [(names[i % len(names)], base + i) for i in range(episodes)]


def run_episode(env, policy, family: str, seed: int, *, record: bool = False, trace: bool = False) -> dict:
    """Play one task. `policy` is "expert", "random" or an agent.policies.Policy. With trace=True
    the result's "trace" holds, per step, what it did: the action's name ("" when the reply did not
    parse), the click's point and the labelled element it landed on (`clicked_element`), whether
    it changed the screen (the env's info["screen_changed"]) and the parse or action error."""
    obs, info = env.reset(seed=seed, options={"family": family})
    instruction = info["instruction"]
    memory = None
    if not isinstance(policy, str):
        from agent.memory import Memory

        memory = Memory()
    action_space = env.action_space
    action_space.seed(seed)
    steps, total, traced = [], 0.0, []
    done = False
    while not done:
        t0 = monotonic()
        raw = None
        if policy == "expert":
            thought, actions = env.expert_action()
            actions = [actions]
        elif policy == "random":
            thought, actions = "", [action_space.sample()]
        else:
            thought, actions, raw = _ask(policy, memory, instruction, obs)
        pre = obs
        if trace:
            point, hit = clicked_element(env, actions)
        obs, reward, terminated, truncated, info = env.step(actions if actions else (raw or ""))
        if trace:
            traced.append({"action": actions[0].name if actions else "", "point": point, "hit": hit,
                           "changed": info.get("screen_changed"),
                           "error": info.get("parse_error") or info.get("action_error")})
        total += reward
        done = terminated or truncated
        if memory is not None:
            from agent.memory import MemoryStep

            memory.add(MemoryStep(thought, actions, _frame(pre)))
        if record:
            from agent.executors.base import encode_pixels

            steps.append({
                "png": encode_pixels(pre["screenshot"], "image/png"), "thought": thought,
                "actions": [a.to_dict() for a in actions], "reward": reward, "terminated": terminated,
                "truncated": truncated, "progress": info["progress"], "raw": raw, "t": (t0, monotonic()),
                "error": info.get("parse_error") or info.get("action_error"),
                "elements": [e.to_dict() for e in pre["elements"]] if pre.get("elements") is not None else None,
            })
    return {
        "family": family, "seed": seed, "instruction": instruction, "success": bool(info["success"]),
        "reward": total, "progress": info["progress"], "steps": info["steps"], "status": info["status"],
        "truncated": bool(truncated), "level": info["level"], "split": info["split"],
        "width": env.width, "height": env.height, "trajectory": steps if record else None,
        "trace": traced if trace else None,
    }


def clicked_element(env, actions) -> tuple[tuple | None, str | None]:
    """The first action's click point and the text of the labelled element under it on the screen
    now ("" for none); (None, None) when the first action is no click."""
    a = actions[0] if actions else None
    box = a.args.get("start_box") if a is not None and a.name == "click" else None
    if not box:
        return None, None
    x, y = box[0], box[1]
    hit = next((text for text, _, (x0, y0, x1, y1) in env.labelled_targets() if x0 <= x <= x1 and y0 <= y <= y1), "")
    return (x, y), hit


def trace_summary(results: list[dict]) -> dict:
    """Per family, from traced results: clicks per episode, the share of clicks on no labelled
    element ("missed") and the share of actions that left the screen as it was ("no_effect")."""
    by: dict[str, list[dict]] = {}
    for r in results:
        if r.get("trace") is None:
            raise ValueError("trace_summary needs results from run_episode(..., trace=True)")
        by.setdefault(r["family"], []).append(r)
    out = {}
    for fam, rs in by.items():
        steps = [s for r in rs for s in r["trace"]]
        clicks = [s for s in steps if s["hit"] is not None]
        judged = [s for s in steps if s["changed"] is not None]
        out[fam] = {"episodes": len(rs), "clicks_per_episode": len(clicks) / len(rs),
                    "missed": sum(s["hit"] == "" for s in clicks) / len(clicks) if clicks else 0.0,
                    "no_effect": sum(s["changed"] is False for s in judged) / len(judged) if judged else 0.0,
                    "unparsed": sum(s["action"] == "" for s in steps) / len(steps) if steps else 0.0}
    return out


def _frame(obs):
    from trainer.episodes import frame_of

    return frame_of(obs)


def _ask(policy, memory, instruction, obs):
    p = policy.propose(instruction, memory, _frame(obs))
    if p.parse_error:
        return p.thought, [], p.raw_text
    return p.thought, list(p.actions), p.raw_text


def to_episode(result: dict, store, producer: str = "expert", policy_version: str | None = None) -> Episode:
    """A run_episode(record=True) result as a stored rollout Episode (screenshots as PNG blobs)."""
    if result.get("trajectory") is None:
        raise ValueError("to_episode needs a result from run_episode(..., record=True)")
    w, h = result["width"], result["height"]
    geometry = ScreenGeometry.simple(w, h)
    steps = []
    for i, s in enumerate(result["trajectory"]):
        digest = store.put_blob(s["png"])
        acts = [Action.from_dict(a) for a in s["actions"]] or [Action("wait", {})]
        listed = s.get("elements")
        obs = Observation(screenshot=digest, width=w, height=h, geometry=geometry, time=s["t"][0],
                          elements=elements_from_dicts(listed) if listed is not None else None,
                          elements_source="sandbox" if listed is not None else None)
        info = {"progress": s["progress"]}
        if len(acts) > 1:
            info["more_actions"] = [a.to_dict() for a in acts[1:]]
        if s.get("error"):
            info["error"] = s["error"]
        steps.append(Step(index=i, observation=obs, thought=s["thought"], action=acts[0],
                          provenance=Provenance(source="agent", policy_version=policy_version or producer),
                          t_start=s["t"][0], t_end=s["t"][1], reward=s["reward"], terminated=s["terminated"],
                          truncated=s["truncated"], raw_response=s.get("raw"), info=info))
    ep = Episode(instruction=result["instruction"], kind="rollout", platform="sandbox", producer=producer,
                 policy_version=policy_version or producer,
                 outcome=Outcome(success=result["success"], reward=result["reward"], source="verifier"),
                 steps=steps,
                 meta={"family": result["family"], "seed": result["seed"], "level": result["level"],
                       "split": result["split"], "progress": result["progress"], "status": result["status"]})
    store.save_episode(ep)
    return ep


def trajectory_to_episode(traj, store, producer: str, policy_version: str | None = None) -> Episode:
    """A model's Trajectory (trainer.episodes) as a stored rollout Episode, through to_episode: each
    turn's screenshot, its thought and actions as parsed from the reply, the reply itself."""
    from agent.executors.base import encode_pixels
    from agent.grammar import parse_normalized

    steps, total = [], 0.0
    width = height = 0
    for i, turn in enumerate(traj.turns):
        frame = turn.frame
        width, height = frame.size
        parsed = parse_normalized(turn.text, turn.space, width, height)
        last = i == len(traj.turns) - 1
        total += turn.reward
        steps.append({"png": encode_pixels(frame.pixels, "image/png"), "thought": parsed.thought if parsed else "",
                      "actions": [a.to_dict() for a in parsed.actions] if parsed else [], "reward": turn.reward,
                      "terminated": last and traj.terminated, "truncated": last and traj.truncated,
                      "progress": turn.progress, "raw": turn.text, "t": turn.t, "error": turn.parse_error or turn.action_error})
    result = {"family": traj.family, "seed": traj.seed, "instruction": traj.instruction, "success": traj.success,
              "reward": total, "progress": traj.progress, "status": traj.status, "level": traj.level,
              "split": split_of(traj.seed),
              "width": width, "height": height, "trajectory": steps}
    return to_episode(result, store, producer=producer, policy_version=policy_version)


# ------------------------------------------------------------ worker processes
_ENV = None


def _init_worker(width: int, height: int) -> None:
    global _ENV
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from trainer.sandbox.env import SandboxEnv

    _ENV = SandboxEnv(width, height)


def _work(job):
    policy, family, seed, record, trace = job
    return run_episode(_ENV, policy, family, seed, record=record, trace=trace)


def run_many(jobs: list[tuple[str, int]], policy: str = "expert", *, workers: int = 1, record: bool = False,
             width: int = 320, height: int = 240, trace: bool = False) -> Iterator[dict]:
    """Results of `jobs` as they finish. Built-in policies only (a model policy runs in-process)."""
    if policy not in BUILTIN_POLICIES:
        raise ValueError(f"run_many runs the built-in policies {BUILTIN_POLICIES}, got {policy!r}")
    tasks = [(policy, f, s, record, trace) for f, s in jobs]
    if workers <= 1:
        _init_worker(width, height)
        try:
            for t in tasks:
                yield _work(t)
        finally:
            _ENV.close()
        return
    # spawn: a fresh interpreter per worker; forking a process that already runs Qt is unsafe
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(width, height)) as pool:
        yield from pool.imap_unordered(_work, tasks, chunksize=4)


def rates(results: list[dict]) -> dict:
    """{"overall": rate, "families": {name: rate}, "counts": {name: n}} from run_episode results."""
    by: dict[str, list[bool]] = {}
    for r in results:
        by.setdefault(r["family"], []).append(r["success"])
    fams = {k: sum(v) / len(v) for k, v in by.items()}
    overall = sum(r["success"] for r in results) / len(results) if results else 0.0
    return {"overall": overall, "families": fams, "counts": {k: len(v) for k, v in by.items()}}
