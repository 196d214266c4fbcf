"""Training on the games: the reference players' demonstrations (with thoughts) into the store and
on to SFT samples, GameEnvSpec's envs rewarding the normalized score gained, and one PPO update on
a game with the tiny VLM. Real Chromium, real store, real model; the browser tests are skipped
where Chromium is not installed."""
from __future__ import annotations

import math
import os
import time

import pytest
from games_helpers import needs_chromium

from agent.schema import Action
from tests.vlm_fixtures import one_thread, tiny_vlm_dir  # noqa: F401 - fixtures
from trainer.sandbox.games import registry
from trainer.sandbox.games.browser import PROFILE_ROOT, TAG_ENV
from trainer.sandbox.games.spec import click, key
from trainer.sandbox.games.thoughts import thought


def our_browsers() -> list[int]:
    """Live processes of the Chromiums this process started (their environment names a profile of ours)."""
    mark = f"{TAG_ENV}={PROFILE_ROOT}/p-{os.getpid()}-".encode()
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if not any(v.startswith(mark) for v in f.read().split(b"\0")):
                    continue
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(int(name))
        except OSError:
            continue
    return pids


def browsers_left(seconds: float = 15.0) -> list[int]:
    end = time.monotonic() + seconds
    while our_browsers() and time.monotonic() < end:
        time.sleep(0.1)
    return our_browsers()


def rewards_match_normalized_score(traj, ref: float) -> None:
    """Each turn's reward is the score it gained over the game's reference mean: progress is
    score / reference (capped at 1, which these short episodes never reach)."""
    before = traj.start_progress
    for turn in traj.turns:
        assert turn.progress < 1.0
        assert turn.reward == pytest.approx(turn.progress - before, abs=1e-9)
        before = turn.progress
    assert sum(t.reward for t in traj.turns) * ref == pytest.approx(traj.progress * ref)


# ------------------------------------------------------------ thoughts (no browser)
def test_thoughts_say_what_the_state_shows():
    g = registry.game
    board = [[4, 4, 0, 0], [0, 0, 0, 0], [2, 0, 0, 0], [8, 0, 0, 2]]
    said = thought(g("merge"), {"score": 12, "board": board}, key("left"), 336, 252)
    assert said == "Score 12. Sliding left merges tiles for 8 points."
    assert "merges nothing now" in thought(g("merge"), {"score": 0, "board": board}, key("down"), 336, 252)

    snake = {"score": 3, "snake": [[5, 5], [4, 5]], "food": [8, 2], "dir": "right"}
    assert thought(g("snake"), snake, key("up"), 336, 252) == \
        "Score 3. The food is 3 right and 3 up of the head; I steer up toward it."
    assert "not safe yet" in thought(g("snake"), snake, key("down"), 336, 252)

    grid = ["#####", "#@$.#", "#####"]
    assert "I push the crate right" in thought(g("levels"), {"score": 0, "level": 1, "grid": grid}, key("right"), 336, 252)
    assert "I walk left" in thought(g("levels"), {"score": 0, "level": 1, "grid": grid}, key("left"), 336, 252)

    # a click is read back to the cell it lands on
    lights = {"score": 0, "n": 3, "lights": [[1, 1, 0], [1, 0, 0], [0, 0, 0]], "ox": 100, "oy": 50, "cell": 40}
    said = thought(g("lights"), lights, click(100 + 20, 50 + 20), 336, 252)
    assert said == "Score 0. 3 lights are on; pressing row 1, column 1 clears the board."
    lights["lights"] = [[0, 0, 0], [0, 0, 0], [0, 0, 1]]
    said = thought(g("lights"), lights, click(100 + 100, 50 + 100), 336, 252)
    assert said.startswith("Score 0. 1 light is on; ") and said.endswith("and I press row 3, column 3 first.")
    assert thought(g("blocks"), {"score": 0}, key("space"), 336, 252) == "Score 0. The piece is lined up; I drop it."
    assert thought(g("dodge"), {"score": 0}, Action("wait", {}), 336, 252) == "Score 0. I wait."


# ------------------------------------------------------------ demonstrations -> store -> SFT samples
@needs_chromium
def test_generated_game_demonstrations_are_stored_and_become_sft_samples(tmp_path, tiny_vlm_dir, capsys):  # noqa: F811
    from agent.storage.store import Store
    from agent.vlm.model import load_vlm
    from main import main
    from trainer.flywheel.routing import Router
    from trainer.learn.sft import encode, store_samples

    data = str(tmp_path / "data")
    assert main(["--data", data, "sandbox", "generate", "--suite", "games", "--games", "lights", "--families", "form",
                 "--episodes", "1"]) == 2
    assert "--families is not for --suite games" in capsys.readouterr().err
    assert main(["--data", data, "sandbox", "generate", "--games", "lights", "--episodes", "1"]) == 2
    assert "--games is for --suite games" in capsys.readouterr().err

    assert main(["--data", data, "sandbox", "generate", "--suite", "games", "--games", "lights", "--episodes", "1"]) == 0
    assert "wrote 1 reference game episodes" in capsys.readouterr().out
    with Store(data) as store:
        (listed,) = store.list_episodes()
        ep = store.load_episode(listed.id)
        assert ep.meta["family"] == "games/lights" and ep.meta["game"] == "lights" and ep.meta["split"] == "train"
        assert len(ep.steps) == registry.game("lights").max_steps and ep.steps[-1].truncated
        assert ep.outcome.reward == ep.meta["score"] > registry.norms()["lights"]["random"]
        assert ep.outcome.success is True and ep.outcome.source == "verifier"
        assert ep.meta["normalized_score"] == pytest.approx(100 * ep.meta["score"] / registry.norms()["lights"]["reference"])
        for s in ep.steps:  # each step: the reference player's thought and its click, as the model writes them
            assert s.thought.startswith("Score ") and ("lights are on" in s.thought or "light is on" in s.thought)
            assert s.action.name == "click" and s.raw_response.startswith(f"Thought: {s.thought}")
        samples = store_samples(store, route="unscored")
        assert len(samples) == len(ep.steps)
        # the flywheel routes a demonstration that beat the random player to the SFT pool
        assert Router(store).route(1)["sft"] == 1
        assert len(store_samples(store, route="sft")) == len(ep.steps)

    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    inputs = encode(proc, samples[0])
    taught = proc.tokenizer.decode(inputs["input_ids"][0][inputs["assistant_mask"][0]])
    assert ep.steps[0].thought in taught and "click(" in taught
    assert int(inputs["image_grid_thw"].shape[0]) >= 1  # the game's screenshot is in the prompt


# ------------------------------------------------------------ the env spec and its rewards
def test_game_env_spec_checks_itself():
    from trainer.rollout.specs import EnvSpec, GameEnvSpec, SpecError

    spec = GameEnvSpec(games=["games/lights", "merge"], max_steps=5)
    assert isinstance(spec, EnvSpec) and spec.games == ("lights", "merge") and (spec.width, spec.height) == (336, 252)
    assert spec.kwargs() == {"games": ["lights", "merge"], "max_steps": 5, "observation": "pixels",
                             "coords_space": spec.coords_space, "reward_scale": "reference"}
    with pytest.raises(SpecError, match="unknown game 'chess'"):
        GameEnvSpec(games=("chess",))
    with pytest.raises(SpecError, match="at least one game"):
        GameEnvSpec()
    with pytest.raises(SpecError, match="canvas of lights"):
        GameEnvSpec(games=("lights",), width=320, height=240)
    with pytest.raises(SpecError, match="reward_scale must be one of"):
        GameEnvSpec(games=("lights",), reward_scale="raw")


@needs_chromium
def test_game_envs_from_the_spec_reward_the_normalized_score_gained():
    from trainer.rollout.games_eval import ReferenceActor
    from trainer.rollout.runner import EpisodeRunner
    from trainer.rollout.specs import GameEnvSpec
    from trainer.sandbox.env_process import make_envs
    from trainer.sandbox.games.env import GameEnv

    envs = make_envs(2, **GameEnvSpec(games=("lights",), max_steps=6).kwargs())
    try:
        assert all(isinstance(e, GameEnv) for e in envs)
        trajs = EpisodeRunner(ReferenceActor(envs), envs, greedy=True).run_all([(0, "games/lights"), (1, "games/lights")])
        assert len(our_browsers()) >= 2
    finally:
        for e in envs:
            e.close()
    ref = registry.norms()["lights"]["reference"]
    for traj in trajs:
        assert traj.family == "games/lights" and len(traj.turns) == 6 and traj.truncated
        rewards_match_normalized_score(traj, ref)
        assert sum(t.reward for t in traj.turns) > 0  # the reference player scores in six presses
    assert browsers_left() == []


# ------------------------------------------------------------ PPO on a game
@needs_chromium
def test_one_ppo_update_on_a_game(tiny_vlm_dir, tmp_path, monkeypatch, one_thread):  # noqa: F811
    from agent.vlm.model import load_vlm
    from trainer.learn import ppo
    from trainer.learn.metrics import MetricsLog, read_metrics
    from trainer.rollout.specs import GameEnvSpec

    seen: dict = {}
    update = ppo.Learner.update

    def recording(self, trajs):  # what the learner is given, and the browsers alive while it trains
        seen["trajs"], seen["browsers"] = trajs, len(our_browsers())
        return update(self, trajs)

    monkeypatch.setattr(ppo.Learner, "update", recording)
    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    cfg = ppo.PPOConfig(updates=1, batch_episodes=2, epochs=1, minibatch_turns=4, n_workers=0, value_pretrain_iters=0,
                        max_new_tokens=12, n_envs=2)
    log = MetricsLog(tmp_path / "log", tensorboard=False)
    res = ppo.train_ppo(model, proc, cfg, model_dir=tiny_vlm_dir, work_dir=tmp_path / "w",
                        env=GameEnvSpec(games=("lights",), max_steps=3), families=["games/lights"], log=log,
                        progress=False)
    assert res["updates"] == 1
    (row,) = read_metrics(log.path)
    for k in ("reward", "entropy", "think_length", "think_tokens", "episode_length", "value_loss", "policy_loss"):
        assert isinstance(row[k], float) and math.isfinite(row[k]), k
    assert row["entropy"] > 0 and row["episode_length"] <= 3

    trajs = seen["trajs"]
    assert len(trajs) == 2 and seen["browsers"] >= 2
    ref = registry.norms()["lights"]["reference"]
    for traj in trajs:
        assert traj.family == "games/lights" and traj.instruction == registry.game("lights").instruction
        assert 1 <= len(traj.turns) <= 3
        rewards_match_normalized_score(traj, ref)
        # the format penalty for a reply that does not parse, as on the sandbox
        shaped = ppo.shaped_turn_rewards(traj, cfg)
        for turn, r in zip([t for t in traj.turns if t.response_ids], shaped, strict=True):
            assert r == pytest.approx(turn.reward - (cfg.format_penalty if turn.parse_error else 0.0))
    assert browsers_left() == []  # no Chromium outlives the run


def test_train_ppo_games_flags_are_checked(capsys):
    from main import main

    base = ["train", "ppo", "--model", "m", "--out", "o", "--suite", "games"]
    assert main(base + ["--games", "lights", "--progress-reward", "0.5"]) == 2
    assert "--progress-reward is the sandbox's shaping" in capsys.readouterr().err
    assert main(base + ["--families", "form"]) == 2
    assert "--families is not for --suite games" in capsys.readouterr().err
    assert main(base + ["--games", "chess"]) == 2
    assert "unknown game 'chess'" in capsys.readouterr().err
    assert main(["train", "ppo", "--model", "m", "--out", "o", "--games", "lights"]) == 2
    assert "--games is for --suite games" in capsys.readouterr().err


# ------------------------------------------------------------ the flywheel's games pool
def test_flywheel_games_pool_is_checked(tmp_path, capsys):
    from main import main
    from trainer.config_flags import ConfigError
    from trainer.flywheel.config import FlywheelConfig

    assert FlywheelConfig(games=["lights", "games/merge"]).games == ["lights", "games/merge"]
    assert FlywheelConfig().games == []
    with pytest.raises(ConfigError, match="unknown game 'chess'"):
        FlywheelConfig(games=["chess"])
    with pytest.raises(ConfigError, match="game_episodes"):
        FlywheelConfig(games=["lights"], game_episodes=0)
    assert main(["--data", str(tmp_path / "data"), "flywheel", "run", "--games", "lights,chess"]) == 2
    assert "unknown game 'chess'" in capsys.readouterr().err


@needs_chromium
def test_flywheel_plays_and_reports_the_games_pool_apart(tiny_vlm_dir, tmp_path, one_thread):  # noqa: F811
    from agent.vlm.model import load_vlm
    from trainer.flywheel.config import FlywheelConfig
    from trainer.flywheel.evaluation import evaluate_games, games_summary
    from trainer.flywheel.iteration import _StageLog, ppo_on_games
    from trainer.learn.metrics import MetricsLog, read_metrics
    from trainer.learn.ppo_config import PPOConfig

    cfg = FlywheelConfig(games=["lights"], max_steps=2, game_episodes=1, max_new_tokens=12,
                         ppo=PPOConfig(updates=1, batch_episodes=2, epochs=1, minibatch_turns=4, n_workers=0,
                                       value_pretrain_iters=0, n_envs=2, progress_reward=0.5))
    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    log = MetricsLog(tmp_path / "fw", tensorboard=False)
    stage = ppo_on_games(model, proc, cfg, tiny_vlm_dir, tmp_path / "fw" / "models" / "v0001", _StageLog(log, 3))
    assert stage["phase"] == "ppo_games" and stage["games"] == ["lights"] and stage["updates"] == 1
    assert isinstance(stage["think_tokens"], float) and isinstance(stage["entropy"], float)
    (row,) = read_metrics(log.path)
    assert row["phase"] == "games_ppo" and row["iteration"] == 3 and row["episode_length"] <= 2
    assert browsers_left() == []

    got = evaluate_games(tiny_vlm_dir, ["lights"], 1, max_new_tokens=12, max_steps=2)
    lights = got["games"]["lights"]
    assert lights["episodes"] == 1 and lights["steps"] <= 2 and lights["reference"] == registry.norms()["lights"]["reference"]
    assert got["overall"] == lights["normalized"] >= 0 and "not part of promotion" in got["note"]
    assert games_summary({"games": got}) == {"overall": got["overall"], "ci95": got["ci95"],
                                             "games": {"lights": lights["normalized"]}}
    assert games_summary({}) is None and games_summary({"games": {"error": "boom"}}) == "boom"
    assert browsers_left() == []


@needs_chromium
def test_train_ppo_suite_games_from_the_cli_plots_reward_entropy_and_think_length(tiny_vlm_dir, tmp_path, capsys, one_thread):  # noqa: F811
    import json

    from main import main
    from trainer.learn.metrics import read_metrics

    out = tmp_path / "run" / "ppo-games"
    rc = main(["--data", str(tmp_path / "data"), "train", "ppo", "--suite", "games", "--games", "lights", "--model",
               str(tiny_vlm_dir), "--out", str(out), "--updates", "1", "--batch", "2", "--workers", "0",
               "--value-pretrain", "0", "--epochs", "1", "--max-new-tokens", "10", "--max-steps", "2", "--envs", "2",
               "--device", "cpu"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["updates"] == 1 and summary["plot"].endswith("ppo_curves.png")
    (row,) = read_metrics(tmp_path / "run" / "ppo-games-logs" / "metrics.jsonl")
    assert all(isinstance(row[k], float) for k in ("reward", "entropy", "think_tokens", "think_length"))
    assert (out / "config.json").is_file()
    assert browsers_left() == []
