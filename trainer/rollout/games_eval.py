"""The games (trainer.sandbox.games) as an evaluation suite: episodes played by the one episode runner
(trainer.rollout.runner), scored as the UI-TARS-2 report scores its games: per game the mean score at
the step budget (100 steps), normalized so that the game's reference player's mean is 100, with a t
95% interval over episodes, and the mean normalized score over games (trainer.stats).

    trajs = play("reference", ["snake", "merge"], episodes=20, split="heldout")
    report = summarize(trajs, ["snake", "merge"])

Policies: "reference" (each game's scripted reference player, ReferenceActor), "random" (the
game's keys pressed and canvas clicked at random: trainer.rollout.actors.RandomActor drawing from
GameEnv's GameActionSpace), or any actor (a model). `calibrate` measures the reference and random
means on train-split seeds and writes them into trainer/sandbox/games/norms.json, the game's 100.
"""
from __future__ import annotations

import json
from collections.abc import Callable

from agent.grammar import format_normalized
from trainer.rollout.actors import Actor, ActorOutput, RandomActor, Slot
from trainer.rollout.runner import EpisodeRunner, Trajectory, trajectory_to_episode
from trainer.sandbox.games import registry
from trainer.sandbox.games.env import GameEnv
from trainer.sandbox.games.spec import STEP_BUDGET
from trainer.sandbox.task import HELDOUT_START
from trainer.stats import mean_interval, mean_of_means_interval

BUILTIN = ("reference", "random")


class ReferenceActor(Actor):
    """Each game's reference player (GameSpec.reference, reading the page's getState()) behind the
    actor interface: its action written as UI-TARS text in the env's coordinate space, so the runner
    prompts, parses and steps it exactly like a model's reply. `envs`: the runner's GameEnvs."""

    def __init__(self, envs):
        self.envs = list(envs) if isinstance(envs, (list, tuple)) else [envs]

    def generate(self, messages, *, greedy: bool = False) -> ActorOutput:
        return self.generate_batch([messages], greedy=greedy, slots=[(-1, 0)])[0]

    def generate_batch(self, chats, *, greedy: bool = False, slots: list[Slot] | None = None) -> list[ActorOutput]:
        out = []
        for k in slots or [(-1, i) for i in range(len(chats))]:
            env = self.envs[k[1]]
            thought, action = env.expert_action()
            out.append(ActorOutput(format_normalized(thought, [action], env.coords_space, env.width, env.height)))
        return out


def tickets(games: list[str], episodes: int, split: str = "heldout", start: int = 0) -> list[tuple[int, str]]:
    """`episodes` (seed, "games/<name>") tickets per game, seeds start, start+1, ... of the split."""
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be train or heldout, got {split!r}")
    if not games:
        raise ValueError("no games to play")
    base = (HELDOUT_START if split == "heldout" else 0) + start
    return [(base + k, registry.PREFIX + g) for g in games for k in range(episodes)]


def play(policy, games: list[str], episodes: int, *, split: str = "heldout", envs: int = 1,
         env_kw: dict | None = None, progress: Callable | None = None, seed: int = 0,
         keep_chats: bool = False, start: int = 0) -> list[Trajectory]:
    """Trajectories of `policy` ("reference", "random" or an actor) over `episodes` episodes of each
    game, in ticket order, greedy replies. The built-in two play in one browser; an actor in `envs`
    browsers, its replies generated in one batch per round. env_kw go to GameEnv. Unless
    `keep_chats`, each finished episode's chats (every turn's screenshots: 100 steps of 250 KB
    frames an episode) are dropped, as a score needs only the rewards."""
    if isinstance(policy, str) and policy not in BUILTIN:
        raise ValueError(f"policy must be one of {BUILTIN} or an actor, got {policy!r}")
    todo = tickets(games, episodes, split, start)
    n = 1 if isinstance(policy, str) else max(1, min(int(envs), len(todo)))
    made = []
    try:
        for _ in range(n):
            made.append(GameEnv(games, **(env_kw or {})))
        if policy == "reference":
            actor = ReferenceActor(made)
        elif policy == "random":
            actor = RandomActor(made, seed=seed)
        else:
            actor = policy
        runner = EpisodeRunner(actor, made, greedy=True, platform="desktop")
        order = {t: i for i, t in enumerate(todo)}
        it = iter(todo)
        out = []
        for traj in runner.run(lambda block: next(it, None)):
            if not keep_chats:
                for turn in traj.turns:
                    turn.messages = None
                traj.final_messages = None
            out.append(traj)
            if progress:
                progress(traj)
        return sorted(out, key=lambda t: order[(t.seed, t.family)])
    finally:
        for env in made:
            env.close()


def demonstrate(games: list[str], episodes: int, store, *, split: str = "train", start: int = 0,
                progress: Callable | None = None) -> list[dict]:
    """Expert demonstrations: each game's reference player plays `episodes` episodes (seeds start,
    start+1, ... of the split) through the one runner, prompted, parsed and stepped as a model's
    rollouts are, each turn's thought a sentence from the state (trainer.sandbox.games.thoughts);
    each episode is stored as it ends (trajectory_to_episode: producer "reference") with the
    verifier's outcome `beats_random` and the score in its meta, then its chats dropped. Returns
    per episode {"id", "game", "seed", "score", "normalized", "success"}."""
    norms = registry.norms()
    out = []

    def keep(traj: Trajectory) -> None:
        game = traj.family[len(registry.PREFIX):]
        score = score_of(traj)
        ref = float((norms.get(game) or {}).get("reference") or 0.0)
        traj.success = beats_random(score, game, norms)
        normalized = 100.0 * score / ref if ref > 0 else None
        ep = trajectory_to_episode(traj, store, producer="reference", policy_version="games-reference",
                                   meta={"game": game, "score": score, "normalized_score": normalized})
        out.append({"id": ep.id, "game": game, "seed": traj.seed, "score": score, "normalized": normalized,
                    "success": traj.success})
        for turn in traj.turns:  # stored: the screenshots need not stay in memory
            turn.messages = None
        traj.final_messages = None
        if progress:
            progress(traj)

    play("reference", games, episodes, split=split, start=start, keep_chats=True, progress=keep)
    return out


def beats_random(score: float, game: str, norms: dict | None = None) -> bool:
    """A game episode's verdict where one is needed (a stored demonstration's outcome, which the
    flywheel routes by): it scored above the game's random player's mean (norms.json; above 0
    where the game has no norm). A game is scored, not passed; this is the bar a demonstration
    worth learning from clears."""
    norms = registry.norms() if norms is None else norms
    return score > float((norms.get(game) or {}).get("random") or 0.0)


def score_of(traj: Trajectory) -> float:
    """An episode's score: the rewards are the score gained, step by step."""
    return float(sum(t.reward for t in traj.turns))


def summarize(trajs: list[Trajectory], games: list[str], norms: dict | None = None) -> dict:
    """Per game: episodes, raw mean score with its interval, and (where the game has a norm) the
    normalized score 100 * score / reference mean with its t 95% interval; overall the mean
    normalized score over the normed games with its interval. Games without a norm are listed."""
    norms = registry.norms() if norms is None else norms
    out: dict = {"games": {}, "unnormed": []}
    normalized = []
    for g in games:
        mine = [score_of(t) for t in trajs if t.family == registry.PREFIX + g]
        if not mine:
            raise ValueError(f"no episodes of {g!r} to summarize")
        raw = mean_interval(mine)
        row = {"episodes": raw["n"], "score": raw["mean"], "score_ci95": raw["ci95"],
               "steps": sum(len(t.turns) for t in trajs if t.family == registry.PREFIX + g) / raw["n"]}
        ref = float((norms.get(g) or {}).get("reference") or 0.0)
        if ref > 0:
            values = [100.0 * s / ref for s in mine]
            norm = mean_interval(values)
            row.update(reference=ref, normalized=norm["mean"], ci95=norm["ci95"])
            normalized.append(values)
        else:
            row.update(reference=None, normalized=None, ci95=None)
            out["unnormed"].append(g)
        out["games"][g] = row
    if normalized:
        overall = mean_of_means_interval(normalized)
        out.update(overall=overall["mean"], ci95=overall["ci95"])
    else:
        out.update(overall=None, ci95=None)
    return out


def calibrate(games: list[str], episodes: int, *, progress: Callable | None = None, write: bool = True) -> dict:
    """The reference and random players' mean scores on `episodes` train-split seeds of each game;
    with `write`, those games' entries in norms.json are replaced (the others kept)."""
    found: dict = {}
    for policy in ("reference", "random"):
        trajs = play(policy, games, episodes, split="train", progress=progress)
        for g in games:
            scores = [score_of(t) for t in trajs if t.family == registry.PREFIX + g]
            found.setdefault(g, {})[policy] = mean_interval(scores)
    entries = {g: {"reference": round(v["reference"]["mean"], 3), "random": round(v["random"]["mean"], 3),
                   "episodes": episodes, "split": "train"} for g, v in found.items()}
    if write:
        data = {"games": {}}
        if registry.NORMS.is_file():
            data = json.loads(registry.NORMS.read_text(encoding="utf-8"))
        kept = {**data.get("games", {}), **entries}
        data = {"about": "each game's reference player's mean score at the step budget on train-split seeds (the "
                         "game's 100) and the random player's; `python main.py sandbox games calibrate` measures them",
                "step_budget": STEP_BUDGET, "games": {k: kept[k] for k in sorted(kept, key=_order)}}
        registry.NORMS.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return {g: {**entries[g], "reference_ci95": found[g]["reference"]["ci95"],
                "random_ci95": found[g]["random"]["ci95"]} for g in games}


def _order(name: str) -> tuple:
    return (registry.GAME_MODULES.index(name) if name in registry.GAME_MODULES else len(registry.GAME_MODULES), name)
