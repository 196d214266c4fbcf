"""`python main.py train sft|ct`: real store, real steps, metrics JSONL and a PNG curve."""
from __future__ import annotations

import json

from tests.factories import make_episode
from tests.vlm_fixtures import one_thread, tiny_vlm_dir  # noqa: F401 - fixtures


def test_train_sft_from_the_store_route_and_ct_with_an_empty_pool(store, tiny_vlm_dir, tmp_path, capsys, one_thread):  # noqa: F811
    from main import main
    from trainer.metrics import read_metrics

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


def test_the_reproduce_command_of_a_run_asks_for_the_same_recipe():
    """eval.json's `reproduce` line, fed back to `train default`, must rebuild the same config."""
    import shlex
    from dataclasses import asdict

    import main
    from trainer.cli_train import recipe_config
    from trainer.recipe import RecipeConfig, reproduce_command

    cfg = RecipeConfig(families=["radio", "tabs"], demo_slip=0.5, grounding_screens_per_family=40, eval_seeds_per_family=20, ppo_max_minutes=30.0,
                       sft_lr=1e-3, sft_schedule="constant", sft_grad_clip=0.0, ppo_lr=2e-4,
                       ppo_batch=24, ppo_temperature=0.7, ppo_policy_alpha=1.0, ppo_train_vision=True,
                       ppo_format_penalty=0.25, ppo_target_kl=0.2, ppo_dual_clip=3.0, ppo_progress_reward=1.0, ppo_click_reward=0.5, ppo_kl_coef=0.05,
                       ppo_no_effect_penalty=0.2, hidden=256, layers=4,
                       vision_depth=3, rope_theta=1e6, mrope="blocks", seed=3)
    line = reproduce_command(asdict(cfg))
    assert "--ppo-lr 0.0002" in line and "--temperature 0.7" in line and "--demos " not in line
    assert "--demo-slip 0.5 --grounding 40" in line
    assert "--sft-lr 0.001 --sft-schedule constant --sft-clip 0 " in line
    # a switch carries no value
    assert line.endswith("--train-vision --format-penalty 0.25 --target-kl 0.2 --dual-clip 3 --progress-reward 1 --click-reward 0.5 --kl-coef 0.05 "
                         "--no-effect-penalty 0.2 --hidden 256 --layers 4 "
                         "--vision-depth 3 --rope-theta 1e+06 --mrope blocks --seed 3")
    args = main.build_parser().parse_args(shlex.split(line)[2:])
    assert asdict(recipe_config(args)) == asdict(cfg)
    assert reproduce_command(asdict(RecipeConfig())) == "python main.py train default --out assets/default_model"


def test_train_ppo_from_the_cli_with_the_recipe_knobs(tiny_vlm_dir, tmp_path, capsys, one_thread):  # noqa: F811
    from main import main
    from trainer.metrics import read_metrics

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
