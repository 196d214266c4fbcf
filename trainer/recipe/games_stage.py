"""The default model's games stage (trainer.recipe.default_model): after PPO on the sandbox, the
model learns the browser games (trainer.sandbox.games) from their reference players, by continued
SFT with sandbox demonstrations replayed beside the games' turns so that the sandbox's skills stay;
and the games' held-out normalized scores before and after the stage, on the same seeds.

    samples, info = game_samples(["merge", "mines"], episodes=8, turns=25)
    before = evaluate_games(actor, ["merge", "mines"], episodes=5)
    after = evaluate_games(actor2, ["merge", "mines"], episodes=5)
    paired_games(before, after)    # after - before, per game and over games, with 95% intervals

A game is one canvas: the model sees its screenshot alone (the element list is None), so its
clicks are written as digits, not chosen by the pointer.
"""
from __future__ import annotations

import random
from collections.abc import Callable

from trainer.learn.sft import Sample
from trainer.rollout import games_eval
from trainer.sandbox.games import registry
from trainer.stats import mean_interval, mean_of_means_interval


def kept_turns(n: int, keep: int, rng: random.Random) -> list[int]:
    """`keep` of an episode's n turns, evenly spaced from a random offset (all of them when the
    episode is that short): a game's 100 turns are much alike, and every kept one costs an SFT step's share."""
    if n <= keep:
        return list(range(n))
    stride = n / keep
    offset = rng.random() * stride
    return sorted({min(n - 1, int(offset + i * stride)) for i in range(keep)})


def game_samples(games: list[str], episodes: int, turns: int, *, observation: str = "elements", seed: int = 0,
                 progress: Callable | None = None) -> tuple[list[Sample], dict]:
    """SFT samples from each game's reference player: `episodes` train-split episodes a game played
    through the one runner (prompted as the model is), `turns` turns kept from each (kept_turns).
    Returns the samples and {"episodes", "samples", "per_game": {game: {"episodes", "samples",
    "score"}}}."""
    rng = random.Random(seed)
    samples: list[Sample] = []
    per_game: dict = {g: {"episodes": 0, "samples": 0, "score": 0.0} for g in games}

    def keep(traj) -> None:  # as each episode ends: its unkept turns' screenshots are dropped at once
        game = traj.family[len(registry.PREFIX):]
        chosen = set(kept_turns(len(traj.turns), turns, rng))
        for i, turn in enumerate(traj.turns):
            if i in chosen and turn.messages is not None:
                samples.append(Sample(turn.messages, turn.text, f"{traj.family}:{traj.seed}#{i}"))
                per_game[game]["samples"] += 1
            turn.messages = None
        traj.final_messages = None
        per_game[game]["episodes"] += 1
        per_game[game]["score"] += games_eval.score_of(traj) / episodes
        if progress:
            progress(traj)

    games_eval.play("reference", games, episodes, split="train", keep_chats=True, progress=keep,
                    env_kw={"observation": observation})
    return samples, {"episodes": sum(v["episodes"] for v in per_game.values()), "samples": len(samples),
                     "per_game": per_game}


def evaluate_games(actor, games: list[str], episodes: int, *, observation: str = "elements", envs: int = 4,
                   progress: Callable | None = None) -> dict:
    """Greedy held-out episodes of each game (the same seeds for every model): games_eval.summarize's
    per-game and overall normalized scores, the share of replies that parsed, and every episode's
    normalized score ("scores": [game, seed, normalized]) so two models pair up (paired_games)."""
    trajs = games_eval.play(actor, games, episodes, split="heldout", envs=envs, progress=progress,
                            env_kw={"observation": observation})
    out = games_eval.summarize(trajs, games)
    norms = registry.norms()
    out["scores"] = []
    for t in trajs:
        game = t.family[len(registry.PREFIX):]
        ref = float((norms.get(game) or {}).get("reference") or 0.0)
        out["scores"].append([game, t.seed, round(100.0 * games_eval.score_of(t) / ref, 3) if ref > 0 else None])
    turns = [turn for t in trajs for turn in t.turns]
    out["parse_rate"] = (sum(turn.parse_error is None for turn in turns) / len(turns)) if turns else None
    return out


def paired_games(before: dict, after: dict) -> dict:
    """after - before in normalized score, episode by episode on the same seeds: per game the mean
    difference with its t 95% interval, and over games the mean of the games' differences with
    its interval (trainer.stats.mean_of_means_interval). Games without a norm are left out."""
    a = {(g, s): v for g, s, v in before["scores"] if v is not None}
    b = {(g, s): v for g, s, v in after["scores"] if v is not None}
    per: dict = {}
    for g, s in sorted(a.keys() & b.keys()):
        per.setdefault(g, []).append(b[(g, s)] - a[(g, s)])
    if not per:
        return {"games": {}, "delta": None, "ci95": None}
    rows = {g: {"episodes": len(d), "delta": mean_interval(d)["mean"], "ci95": mean_interval(d)["ci95"]}
            for g, d in per.items()}
    overall = mean_of_means_interval(list(per.values()))
    return {"games": rows, "delta": overall["mean"], "ci95": overall["ci95"]}
