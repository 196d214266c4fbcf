"""The registry's promotion rule with real checkpoints and real held-out evaluation: a briefly
trained tiny model is current; a deliberately damaged candidate, and an iteration whose training
wrecks the weights, are evaluated for real and are not promoted; a failed iteration is rejected."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.vlm_fixtures import tiny_vlm_dir  # noqa: F401 - fixture
from trainer.flywheel import FlywheelError
from trainer.flywheel.registry import Registry, compare_key, is_better

FAMILY = "click_button"
ENV = {"width": 224, "height": 168, "max_steps": 2}


@pytest.fixture(scope="module")
def trained_dir(tiny_vlm_dir, tmp_path_factory):  # noqa: F811
    """The tiny model after a short SFT on expert demonstrations: it has learnt the grammar (80 steps:
    with a digit per token, 40 left coordinates like (98,169,16))."""
    import torch

    from agent.vlm import load_vlm
    from trainer.recipe import demonstrations
    from trainer.sft import SFTConfig, train_sft

    torch.set_num_threads(1)
    _, samples = demonstrations([FAMILY], 6, width=ENV["width"], height=ENV["height"], progress=False)
    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    out = tmp_path_factory.mktemp("trained") / "model"
    train_sft(model, proc, samples, SFTConfig(lr=3e-3, batch_size=4, max_steps=80, seed=0), out, progress=False)
    return out


def evaluate(model_dir):
    from trainer.flywheel.evaluation import evaluate_model

    return evaluate_model(model_dir, [FAMILY], 2, env_kw=ENV, max_new_tokens=48)


def damage(src, dst):
    """Copy a checkpoint with every weight replaced by large noise: a broken model that still loads."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    state = load_file(str(dst / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    bad = {k: (torch.randn(v.shape, generator=g) * 5).to(v.dtype) if v.is_floating_point() else v for k, v in state.items()}
    save_file(bad, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_a_damaged_candidate_is_not_promoted(store, trained_dir, tmp_path):
    reg = Registry(store)
    good = evaluate(trained_dir)
    v0 = reg.register(trained_dir, metrics=good)
    assert reg.decide(v0.version) == (True, "first model: nothing to compare with")
    assert good["format_rate"] > 0  # the trained model writes parseable actions

    broken = evaluate(damage(trained_dir, tmp_path / "broken"))
    assert compare_key(broken) < compare_key(good)
    v1 = reg.register(tmp_path / "broken", parent=v0.version, iteration=1, metrics=broken)
    promoted, why = reg.decide(v1.version)
    assert not promoted and why.startswith(f"not promoted, {v0.version} stays")
    assert reg.current().version == v0.version
    assert reg.get(v1.version).status == "rejected" and reg.get(v1.version).note == why
    with pytest.raises(FlywheelError, match="rejected"):
        reg.promote(v1.version)
    # the same model again is not "better" either: a tie keeps the current one
    v2 = reg.register(trained_dir, parent=v0.version, iteration=2, metrics=dict(good))
    assert reg.decide(v2.version)[0] is False


def test_failed_iteration_and_mismatched_evaluations(store, tmp_path):
    reg = Registry(store)
    v0 = reg.register(tmp_path, metrics={"mean_success": 0.5, "eval_signature": "a"})
    reg.decide(v0.version)
    v1 = reg.register(tmp_path / "missing", parent=v0.version, iteration=1, note="failed: RuntimeError: boom")
    assert reg.decide(v1.version) == (False, "failed: RuntimeError: boom")
    assert reg.current().version == v0.version
    with pytest.raises(FlywheelError, match="evaluated differently"):
        is_better({"mean_success": 1.0, "eval_signature": "b"}, reg.current().metrics)
    with pytest.raises(FlywheelError, match="no model version 'v9999'"):
        reg.get("v9999")
    with pytest.raises(FlywheelError, match="already registered"):
        reg.register(tmp_path, version=v0.version)


def test_an_iteration_that_wrecks_the_model_keeps_the_current_one(store, trained_dir):
    """run_iteration end to end (collect, route, CT/SFT, evaluate, register, decide) with a
    deliberately destructive SFT learning rate."""
    from trainer.flywheel.iteration import FlywheelConfig, run_iteration
    from trainer.sandbox.rollout import plan, run_many, to_episode

    for result in run_many(plan(2, families=[FAMILY]), "expert", record=True, width=ENV["width"], height=ENV["height"]):
        to_episode(result, store)
    cfg = FlywheelConfig(width=ENV["width"], height=ENV["height"], max_steps=2, families=[FAMILY], eval_seeds=2,
                         rollouts=1, ct_steps=0, sft_steps=3, sft_lr=5.0, batch=2, ppo_updates=0, max_new_tokens=48)
    reg = Registry(store)
    v0 = reg.register(trained_dir)
    reg.update(v0.version, metrics=evaluate(trained_dir))
    reg.decide(v0.version)
    stages = []
    rep = run_iteration(store, cfg, progress=lambda d, n, label, detail="": stages.append((d, label)))
    assert rep["parent"] == v0.version and rep["iteration"] == 1
    assert rep["promoted"] is False and rep["current"] == v0.version
    assert reg.get(rep["candidate"]).status == "rejected"
    # the two expert episodes, and the current model's rollout too where it reached the goal
    assert len(rep["rollouts"]) == 1
    won = store.load_episode(rep["rollouts"][0]).outcome.success
    assert rep["routed"]["sft"] == 2 + bool(won)
    lineage = reg.get(rep["candidate"]).lineage
    assert lineage["parents"] == [v0.version] and len(lineage["pools"]["sft"]) == 2 + bool(won)
    assert [s["phase"] for s in lineage["stages"]] == ["ct", "sft", "ppo"]
    assert stages[-1] == (100, "eval") and [d for d, _ in stages] == sorted(d for d, _ in stages)
    # evaluated for real, and worse than the current model on the same seeds
    assert rep["metrics"]["eval_signature"] == reg.get(v0.version).metrics["eval_signature"]
    assert compare_key(rep["metrics"]) < compare_key(reg.get(v0.version).metrics)
    assert rep["decision"].startswith(f"not promoted, {v0.version} stays")


def test_bad_flywheel_settings_are_refused_by_name(store, capsys):
    from main import main
    from trainer.flywheel.iteration import FlywheelConfig

    with pytest.raises(FlywheelError, match="unknown sandbox family 'nope'"):
        FlywheelConfig(families=["nope"])
    store.set_setting("flywheel.config", {"sft_stepz": 3})
    with pytest.raises(FlywheelError, match="unknown setting.*sft_stepz"):
        FlywheelConfig.load(store)
    assert main(["flywheel", "run", "--data", str(store.root)]) == 2  # the saved config is named, not ignored
    assert "sft_stepz" in capsys.readouterr().err
    store.set_setting("flywheel.config", {})
    assert main(["flywheel", "run", "--sft-steps", "-1", "--data", str(store.root)]) == 2
    assert "sft_steps must be >= 0, got -1" in capsys.readouterr().err


def test_the_first_iteration_starts_from_the_shipped_default_model(store):
    """Before, the flywheel started from random weights (0% held-out) while Supervise and Drive used
    the shipped default model; now v0000 is a copy of the shipped model where it fits the screen
    size, evaluated for real, and a different size says why it cannot be used."""
    from trainer.flywheel.iteration import SHIPPED_MODEL, FlywheelConfig, bootstrap_model, first_model

    cfg = FlywheelConfig(families=[FAMILY], eval_seeds=2, max_steps=3)  # 320x240, the shipped model's size
    assert first_model(cfg) == "the shipped default model"
    reg = Registry(store)
    v0 = bootstrap_model(store, cfg, reg)
    assert v0.version == "v0000" and v0.status == "current" and v0.note == "the shipped default model"
    assert (Path(v0.path) / "model.safetensors").read_bytes() == (SHIPPED_MODEL / "model.safetensors").read_bytes()
    assert Path(v0.path) != SHIPPED_MODEL and v0.metrics["families"][FAMILY]["episodes"] == 2
    assert v0.metrics["format_rate"] > 0.9  # a trained model, not random weights
    small = FlywheelConfig(families=[FAMILY], width=224, height=168)
    assert first_model(small) == ("a new model with random weights "
                                  "(the shipped default model is for 320x240 screens, not 224x168)")
    assert "random weights" in first_model(FlywheelConfig(families=[FAMILY], base="scratch"))
    with pytest.raises(FlywheelError, match="base must be 'default' or 'scratch'"):
        FlywheelConfig(base="shipped")


def test_the_decision_is_said_in_words():
    from trainer.flywheel.registry import ModelVersion, explain_decision

    def mv(version, success, progress=0.0, n=30):
        return ModelVersion(version, "p", metrics={"mean_success": success, "mean_progress": progress,
                                                   "families": {FAMILY: {"episodes": n}}})

    assert explain_decision(mv("v2", 0.1), mv("v1", 0.2), False) == \
        "not promoted, v1 stays: held-out success 10.0% vs 20.0% on 30 episodes"
    assert explain_decision(mv("v2", 0.2, 0.5), mv("v1", 0.2, 0.4), True) == \
        "promoted over v1: held-out success 20.0% vs 20.0% on 30 episodes, a tie broken by more partial progress"
    assert "needs a gain of at least 5.0%" in explain_decision(mv("v2", 0.22), mv("v1", 0.2), False, 0.05)
