"""The default model's games stage (trainer.recipe.games_stage, run by trainer.recipe.default_model):
samples from the reference players, scores paired before/after, a whole tiny recipe with the stage,
and --resume reusing a finished PPO stage so that only the games stage runs again."""
from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from agent.grammar import parse_response
from tests.games_helpers import needs_chromium
from trainer.recipe.games_stage import game_samples, kept_turns, paired_games


def test_kept_turns_are_evenly_spaced_and_all_of_a_short_episode():
    rng = random.Random(0)
    assert kept_turns(7, 25, rng) == list(range(7))
    for _ in range(20):
        kept = kept_turns(100, 25, rng)
        assert len(kept) == 25 and kept == sorted(set(kept)) and 0 <= kept[0] < 4 and kept[-1] <= 99
        gaps = {b - a for a, b in zip(kept, kept[1:], strict=False)}
        assert gaps <= {3, 4, 5}, gaps  # 100/25 apart, whatever the offset


def test_paired_games_is_after_minus_before_on_the_same_seeds():
    before = {"scores": [["merge", 1, 50.0], ["merge", 2, 70.0], ["mines", 1, 0.0], ["mines", 2, None],
                         ["snake", 1, 10.0]]}
    after = {"scores": [["merge", 1, 60.0], ["merge", 2, 100.0], ["mines", 1, 30.0], ["mines", 2, 40.0],
                        ["lights", 1, 5.0]]}
    got = paired_games(before, after)
    assert set(got["games"]) == {"merge", "mines"}  # snake and lights have no pair, mines seed 2 no norm
    assert got["games"]["merge"]["delta"] == pytest.approx(20.0) and got["games"]["merge"]["episodes"] == 2
    assert got["games"]["mines"]["delta"] == pytest.approx(30.0)
    assert got["delta"] == pytest.approx(25.0)  # the mean of the games' mean differences
    lo, hi = got["games"]["merge"]["ci95"]
    assert lo < 20.0 < hi
    assert paired_games({"scores": []}, after) == {"games": {}, "delta": None, "ci95": None}


@needs_chromium
def test_game_samples_are_the_reference_players_turns_as_the_model_is_prompted():
    samples, info = game_samples(["merge", "mines"], episodes=1, turns=4, seed=3)
    assert info["per_game"]["merge"]["samples"] == 4 and info["per_game"]["merge"]["episodes"] == 1
    assert info["per_game"]["merge"]["score"] > 0 and info["samples"] == len(samples)
    for s in samples:
        parsed = parse_response(s.target)
        game = s.source.split(":")[0]
        assert parsed.actions, s.target
        if game == "games/merge":  # arrow keys
            assert parsed.actions[0].name == "hotkey" and parsed.actions[0].args["key"] in ("up", "down", "left", "right")
        else:  # mines: clicks on the canvas
            assert parsed.actions[0].name in ("click", "right_single")
        user = [m for m in s.messages if m["role"] == "user"]
        assert user and "Thought:" in s.target  # the prompt is the agent's own, the reply has its thought
    assert {s.source.split(":")[0] for s in samples} == {"games/merge", "games/mines"}


def tiny_recipe(**kw):
    from trainer.learn.ppo_config import PPOConfig
    from trainer.learn.sft import SFTConfig
    from trainer.recipe.default_model import RecipeConfig

    base = dict(families=["radio"], demo_episodes_per_family=2, demo_slip=0.0, grounding_screens_per_family=0,
                eval_seeds_per_family=1, hidden=32, layers=1, vision_depth=1,
                sft=SFTConfig(lr=1e-3, max_steps=2, batch_size=2, warmup_steps=0),
                ppo=PPOConfig(updates=1, batch_episodes=2, n_workers=0, n_envs=2, max_new_tokens=16,
                              value_pretrain_iters=0),
                ppo_max_steps=2, games=["merge"], game_demo_episodes=1, game_demo_turns=2, game_eval_episodes=1,
                games_sft=SFTConfig(lr=1e-3, max_steps=2, batch_size=2, warmup_steps=0), sft_threads=1)
    base.update(kw)
    return RecipeConfig(**base)


@needs_chromium
def test_a_tiny_recipe_with_the_games_stage_then_resume_runs_the_games_stage_alone(tmp_path):
    from trainer.learn.metrics import read_metrics
    from trainer.recipe.default_model import DECODING, run_recipe

    work, out = tmp_path / "work", tmp_path / "out"
    cfg = tiny_recipe()
    report = run_recipe(out, cfg, work_dir=work, progress=False, device="cpu")
    ev = json.loads((out / "eval.json").read_text())
    # what ships is the games stage's model: its sandbox success beside PPO's, the games before and after
    assert ev["final"]["stage"] == "games" and ev["final"]["episodes"] == 1
    assert set(ev["games"]["per_game"]) == {"merge"} and ev["games"]["episodes_per_game"] == 1
    assert ev["games"]["demos"]["per_game"]["merge"]["samples"] == 2
    assert ev["games"]["demos"]["replayed"] == 2  # game_replay 1.0: as many sandbox turns as game turns
    assert report["games"]["sft"]["steps"] == 2
    phases = [r["phase"] for r in read_metrics(work / "metrics.jsonl")]
    assert phases.count("ppo") >= 1 and "games_sft" in phases and "games_final" in phases
    assert (work / "stage_ppo.json").is_file() and (work / "ppo_model" / "model.safetensors").is_file()
    assert (out / "training_curves.png").stat().st_size > 0

    # --resume with other games settings: SFT and PPO are reused, only the games stage runs
    n_ppo = phases.count("ppo")
    again = run_recipe(out, replace(cfg, game_demo_turns=3), work_dir=work, progress=False, resume=True, device="cpu")
    assert again["resumed_ppo_from"] == str(work / "ppo_model")
    assert again["eval_ppo"] == json.loads((work / "stage_ppo.json").read_text())["eval_ppo"]
    assert again["games"]["demos"]["per_game"]["merge"]["samples"] == 3
    assert [r["phase"] for r in read_metrics(work / "metrics.jsonl")].count("ppo") == n_ppo  # no PPO again
    # a changed PPO setting is not reused: PPO runs again
    third = run_recipe(out, replace(cfg, ppo_max_steps=3), work_dir=work, progress=False, resume=True, device="cpu")
    assert "resumed_ppo_from" not in third and "resumed_from" in third
    # stages scored with another decoding (before typed text was copied): the SFT stage is scored
    # again and kept, PPO (whose rollouts replied the old way) runs again
    for name in ("stage_sft.json", "stage_ppo.json"):
        stage = json.loads((work / name).read_text())
        (work / name).write_text(json.dumps({**stage, "decoding": "pointer"}))
    evals = [r["phase"] for r in read_metrics(work / "metrics.jsonl")].count("eval_sft")
    fourth = run_recipe(out, replace(cfg, ppo_max_steps=3), work_dir=work, progress=False, resume=True, device="cpu")
    assert "resumed_ppo_from" not in fourth and fourth["resumed_from"] == str(work / "sft")
    assert [r["phase"] for r in read_metrics(work / "metrics.jsonl")].count("eval_sft") == evals + 1
    assert json.loads((work / "stage_sft.json").read_text())["decoding"] == DECODING
    assert json.loads((work / "stage_ppo.json").read_text())["decoding"] == DECODING


def test_train_default_refuses_an_unknown_game_before_any_work(tmp_path, capsys):
    from main import build_parser, main
    from trainer.learn.cli import recipe_config
    from trainer.recipe.default_model import RecipeConfig
    from trainer.sandbox.games.registry import GAME_MODULES

    assert RecipeConfig().games is None  # the stage is off unless asked for
    args = build_parser().parse_args(["train", "default", "--games", "all"])
    assert recipe_config(args).games == list(GAME_MODULES)

    rc = main(["--data", str(tmp_path / "data"), "train", "default", "--out", str(tmp_path / "m"), "--games", "pong"])
    assert rc == 2
    assert "--games has 'pong', not a game: the games are merge, snake" in capsys.readouterr().err
    assert not (tmp_path / "m").exists() and not (tmp_path / "m-work").exists()


def test_the_games_stage_without_chromium_is_refused_before_any_work(tmp_path, monkeypatch):
    from trainer.recipe.default_model import RecipeError, run_recipe

    monkeypatch.setenv("TANDEM_CHROMIUM", str(tmp_path / "no-such-browser"))
    with pytest.raises(RecipeError, match="the games stage needs Chromium: .*no-such-browser.*--games none"):
        run_recipe(tmp_path / "out", tiny_recipe(), work_dir=tmp_path / "work", progress=False, device="cpu")
    assert not (tmp_path / "work" / "base").exists()
