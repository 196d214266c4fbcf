"""`python main.py train sft|ct`: real store, real steps, metrics JSONL and a PNG curve."""
from __future__ import annotations

import json

import pytest

from tests.factories import make_episode
from tests.vlm_fixtures import one_thread, tiny_vlm_dir  # noqa: F401 - fixtures


def test_train_sft_from_the_store_route_and_ct_with_an_empty_pool(store, tiny_vlm_dir, tmp_path, capsys, one_thread):  # noqa: F811
    from main import main
    from trainer.learn.metrics import read_metrics

    ep = make_episode(store, 2, width=224, height=168)
    store.judge(ep.id, "sft")
    data = str(store.root)
    out = tmp_path / "run" / "sft1"
    rc = main(["--data", data, "train", "sft", "--model", str(tiny_vlm_dir), "--out", str(out), "--max-steps", "2",
               "--batch", "2"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert res["samples"] == 2 and res["steps"] == 2 and (out / "model.safetensors").is_file()
    rows = read_metrics(tmp_path / "run" / "sft1-logs" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1] and all(r["phase"] == "sft" for r in rows)
    png = tmp_path / "run" / "sft1-logs" / "sft_curves.png"
    assert res["plot"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any((tmp_path / "run" / "sft1-logs" / "tb").iterdir())  # TensorBoard events

    rc = main(["--data", data, "train", "ct", "--model", str(tiny_vlm_dir), "--out", str(tmp_path / "ct1")])
    assert rc == 2
    assert "no episodes routed 'ct'" in capsys.readouterr().err


def _changed(value, f):
    """Another valid value of a config field than `value` (the field's choices, a switch flipped)."""
    if f.metadata.get("choices"):
        return next(c for c in f.metadata["choices"] if c != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, list):
        return value[:2] if len(value) > 2 else ["radio", "tabs"]
    if value is None:  # optional settings: a value that passes every check
        return {"dual_clip": 3.0, "max_minutes": 7.5, "target_kl": 0.3, "micro_batch_tokens": 512, "sft_threads": 2,
                "max_steps": 40, "save_every": 50, "ray_address": "auto", "games": ["merge", "mines"]}.get(f.name)
    if isinstance(value, float):
        return value * 1.5 if value else 0.25
    return value + 32 if f.name == "hidden" else value + 1


def _every_field_changed():
    """A RecipeConfig whose every setting differs from the default one."""

    from trainer.config_flags import flags_of, flatten, with_values
    from trainer.recipe.default_model import SCALE, RecipeConfig

    base = flatten(RecipeConfig())
    values = {fl.path: _changed(base[fl.path], fl.f) for fl in flags_of(RecipeConfig)}
    values["ppo.engine"], values["ppo.inference"] = "ray", "shared"  # ray_address and inference need them
    values["ppo.clip_high"] = values["ppo.clip_low"] + 0.1
    values["ppo.gamma"], values["ppo.critic_lambda"], values["demo_slip"] = 0.99, 0.95, 0.5
    values["ppo.staleness_decay"], values["ppo.imp_weight_cap"] = 0.5, 3.0
    cfg = with_values(RecipeConfig(), values)
    # what stays: the stages' seeds (the recipe's) and the memory settings, not the recipe's (one process, float32)
    same = [k for k, v in flatten(cfg).items() if v == base[k]]
    assert all(k.split(".")[-1] in (*SCALE, "seed") for k in same), same
    return cfg


def test_the_reproduce_command_of_a_run_asks_for_the_same_recipe():
    """eval.json's `reproduce` line, fed back to `train default`, rebuilds the same config, for a
    config with every setting changed: the flags are the fields, so none can be left out."""
    import shlex
    from dataclasses import asdict

    import main
    from trainer.config_flags import with_values
    from trainer.learn.cli import recipe_config
    from trainer.recipe.default_model import RecipeConfig, reproduce_command

    cfg = _every_field_changed()
    line = reproduce_command(asdict(cfg))
    args = main.build_parser().parse_args(shlex.split(line)[2:])
    assert recipe_config(args) == cfg
    # the flags as `train default` always had them, the stages' own under --sft- and --ppo-
    assert "--ppo-lr " in line and "--temperature 0.75 " in line and "--sft-clip 1.5 " in line and "--demos 61 " in line
    assert "--no-ppo-share-prefix" in line and "--train-vision" in line and "--target-kl " in line
    assert reproduce_command(asdict(RecipeConfig())) == "python main.py train default --out assets/default_model"
    # a setting back to none says so
    line = reproduce_command(asdict(with_values(RecipeConfig(), {"ppo.target_kl": None})))
    assert line.endswith("--target-kl none")
    assert recipe_config(main.build_parser().parse_args(shlex.split(line)[2:])).ppo.target_kl is None


def test_a_recipe_config_saved_flat_still_loads():
    """eval.json and stage_sft.json of runs before the stages nested hold flat sft_*/ppo_* keys."""
    from trainer.config_flags import ConfigError
    from trainer.recipe.default_model import RecipeConfig, reproduce_command, sft_stage_config

    old = {"width": 336, "height": 252, "observation": "elements", "families": ["radio", "tabs"],
           "demo_episodes_per_family": 60, "demo_slip": 0.3, "grounding_screens_per_family": 15,
           "eval_seeds_per_family": 13, "arch": "qwen2_5_vl", "hidden": 128, "layers": 2, "vision_depth": 2,
           "rope_theta": 10000.0, "mrope": "interleaved", "sft_epochs": 4.0, "sft_lr": 0.002, "sft_batch": 8,
           "sft_schedule": "linear", "sft_grad_clip": 1.0, "ppo_updates": 20, "ppo_batch": 12, "ppo_lr": 0.0001,
           "ppo_epochs": 4, "ppo_policy_alpha": 1.0, "ppo_temperature": 0.5, "ppo_max_new_tokens": 48,
           "ppo_max_steps": 5, "ppo_max_minutes": 14.0, "ppo_format_penalty": 0.5, "ppo_target_kl": 0.1,
           "ppo_dual_clip": None, "ppo_progress_reward": 0.0, "ppo_click_reward": 0.0, "ppo_kl_coef": 0.0,
           "ppo_no_effect_penalty": 0.0, "ppo_end_on_parse_error": False, "ppo_train_vision": False, "n_workers": 1,
           "ppo_engine": "local", "ray_address": None, "n_envs": 8, "threads": 1, "sft_threads": None, "seed": 0}
    cfg = RecipeConfig.from_dict(old)
    assert (cfg.sft.epochs, cfg.sft.batch_size, cfg.ppo.batch_episodes, cfg.ppo.max_minutes) == (4.0, 8, 12, 14.0)
    assert (cfg.ppo.n_workers, cfg.ppo.n_envs, cfg.families, cfg.ppo_max_steps) == (1, 8, ["radio", "tabs"], 5)
    assert reproduce_command(old) == ("python main.py train default --out assets/default_model --families radio,tabs "
                                      "--sft-epochs 4 --ppo-batch 12 --kl-coef 0 --workers 1 --envs 8 --ppo-minutes 14")
    assert sft_stage_config(old)["sft.epochs"] == 4.0 and "ppo.lr" not in sft_stage_config(old)
    with pytest.raises(ConfigError, match="unknown setting.*ppo_bogus"):
        RecipeConfig.from_dict({**old, "ppo_bogus": 1})


def test_the_shipped_recipe_defaults_did_not_move():
    """The shipped model's recipe, as it was before its settings nested."""
    from trainer.recipe.default_model import RecipeConfig, reproduce_command

    c = RecipeConfig()
    assert (c.sft.lr, c.sft.epochs, c.sft.batch_size, c.sft.warmup_steps, c.sft.schedule, c.sft.grad_clip) == (
        2e-3, 5.0, 8, 5, "linear", 1.0)
    p = c.ppo
    assert (p.updates, p.batch_episodes, p.lr, p.epochs, p.policy_alpha, p.temperature, p.max_new_tokens,
            p.max_minutes, p.format_penalty, p.target_kl, p.dual_clip, p.kl_coef, p.value_pretrain_iters,
            p.value_pretrain_epochs, p.n_workers, p.n_envs, p.engine) == (
        20, 16, 1e-4, 4, 1.0, 0.5, 48, 45.0, 0.5, 0.1, None, 0.05, 1, 3, 2, 16, "local")
    assert (c.width, c.height, c.demo_episodes_per_family, c.demo_slip, c.ppo_max_steps, c.seed) == (
        336, 252, 60, 0.3, 5, 0)
    # the shipped model's eval.json holds exactly the defaults
    from pathlib import Path

    shipped = json.loads((Path(__file__).resolve().parents[1] / "assets" / "default_model" / "eval.json").read_text())
    assert RecipeConfig.from_dict(shipped["config"]) == c
    assert reproduce_command(shipped["config"]) == shipped["reproduce"] == "python main.py train default --out assets/default_model"


def test_train_ppo_from_the_cli_with_the_recipe_knobs(tiny_vlm_dir, tmp_path, capsys, one_thread):  # noqa: F811
    from main import main
    from trainer.learn.metrics import read_metrics

    data, out = str(tmp_path / "data"), tmp_path / "run" / "ppo1"
    rc = main(["--data", data, "train", "ppo", "--model", str(tiny_vlm_dir), "--out", str(out), "--families", "bogus,radio"])
    assert rc == 2 and "unknown sandbox families: bogus" in capsys.readouterr().err
    rc = main(["--data", data, "train", "ppo", "--model", str(tiny_vlm_dir), "--out", str(out), "--format-penalty", "-1"])
    assert rc == 2 and "--format-penalty must be >= 0, got -1.0" in capsys.readouterr().err
    rc = main(["--data", data, "train", "ppo", "--model", str(tiny_vlm_dir), "--out", str(out), "--click-reward", "-2"])
    assert rc == 2 and "--click-reward must be >= 0, got -2.0" in capsys.readouterr().err
    rc = main(["--data", data, "train", "ppo", "--model", str(tiny_vlm_dir), "--out", str(out), "--kl-coef", "-0.1"])
    assert rc == 2 and "--kl-coef must be >= 0, got -0.1" in capsys.readouterr().err
    rc = main(["--data", data, "train", "ppo", "--model", str(tiny_vlm_dir), "--out", str(out), "--no-effect-penalty", "-1"])
    assert rc == 2 and "--no-effect-penalty must be >= 0, got -1.0" in capsys.readouterr().err
    rc = main(["--data", data, "train", "ppo", "--model", str(tiny_vlm_dir), "--out", str(out), "--dual-clip", "1"])
    assert rc == 2 and "--dual-clip must be > 1, got 1.0" in capsys.readouterr().err
    rc = main(["--data", data, "train", "ppo", "--model", str(tiny_vlm_dir), "--out", str(out), "--updates", "1",
               "--batch", "2", "--workers", "0", "--value-pretrain", "1", "--epochs", "1", "--temperature", "0.7",
               "--max-new-tokens", "10", "--max-steps", "2", "--families", "click_button", "--width", "224",
               "--height", "168", "--end-on-parse-error", "--progress-reward", "0.5", "--click-reward", "0.25", "--kl-coef", "0.1",
               "--no-effect-penalty", "0.3", "--dual-clip", "3", "--device", "cpu"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert res["updates"] == 1 and (out / "model.safetensors").is_file()
    rows = read_metrics(tmp_path / "run" / "ppo1-logs" / "metrics.jsonl")
    ppo = [r for r in rows if r["phase"] == "ppo"]
    assert len(ppo) == 1 and ppo[0]["episode_length"] <= 2  # --max-steps reached the environment
    assert ppo[0]["kl_ref"] >= 0.0  # --kl-coef reached the learner, which logs the penalty's KL
    assert "no_effect_rate" in ppo[0]
    assert 0.0 <= ppo[0]["clipfrac_dual"] <= 1.0  # --dual-clip reached the learner, which logs what it bounded
    assert ppo[0]["tokens_per_turn"] <= 10  # --max-new-tokens reached the actor
    assert json.loads((out / "tandem_training.json").read_text())["ppo"]["temperature"] == 0.7
    # without --train-vision the vision tower leaves PPO as it came, and the language model does not
    from safetensors.torch import load_file

    before, after = load_file(str(tiny_vlm_dir / "model.safetensors")), load_file(str(out / "model.safetensors"))
    vision = [k for k in before if ".visual." in k or k.startswith("visual.")]
    assert vision and all(before[k].equal(after[k]) for k in vision)
    assert any(not before[k].equal(after[k]) for k in before if k not in vision)
    ppo_cfg = json.loads((out / "tandem_training.json").read_text())["ppo"]
    assert ppo_cfg["train_vision"] is False and ppo_cfg["format_penalty"] == 0.5
    assert ppo_cfg["end_on_parse_error"] is True and ppo_cfg["progress_reward"] == 0.5 and ppo_cfg["click_reward"] == 0.25
    assert ppo_cfg["no_effect_penalty"] == 0.3 and ppo_cfg["dual_clip"] == 3.0
    assert ppo_cfg["kl_coef"] == 0.1
