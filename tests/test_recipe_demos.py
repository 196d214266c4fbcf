"""The default model's demonstrations: the scripted expert in the real Qt sandbox, with and
without injected mistakes ("slips") it must recover from."""
from __future__ import annotations

import json

import pytest

from trainer.rollout.actors import Actor

ENV = {"width": 224, "height": 168}


def _text_of(message) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return " ".join(part.get("text", "") for part in content if isinstance(part, dict))


def test_slipped_turns_are_context_not_targets_and_the_expert_recovers():
    from agent.coords import SMART_RESIZE
    from agent.grammar import parse_normalized
    from trainer.recipe.default_model import demonstrations

    trajs, samples = demonstrations(["radio", "check_boxes"], 4, progress=False, slip=1.0, **ENV)
    # slip 1.0: every episode's first turn is the mistake, and only that one
    assert trajs and all(tr.slipped == [0] for tr in trajs)
    assert all(tr.success for tr in trajs)  # a random click or a cut-off reply cannot fail these families
    assert len(samples) == sum(len(tr.turns) - 1 for tr in trajs)
    sources = {s.source for s in samples}
    assert not any(f"{tr.family}:{tr.seed}#0" in sources for tr in trajs)
    for s in samples:  # every target is the expert's, and parses
        assert parse_normalized(s.target, SMART_RESIZE, ENV["width"], ENV["height"], platform="sandbox")
    kinds = set()
    for tr in trajs:
        slip, after = tr.turns[0], tr.turns[1]
        if slip.parse_error:  # a cut-off reply: the next prompt asks again
            kinds.add("cut")
            assert "could not be used" in _text_of(after.messages[-1])
        else:  # a click somewhere: the next prompt carries it in the history
            kinds.add("click")
            history = " ".join(_text_of(m) for m in after.messages)
            assert "click(" in slip.text and slip.text.split("Action:")[1].strip() in history
    assert kinds == {"cut", "click"}  # both kinds of slip occur in 8 episodes (seeded)


def test_without_slips_every_turn_of_every_success_is_a_sample():
    from trainer.recipe.default_model import demonstrations

    trajs, samples = demonstrations(["radio", "check_boxes"], 3, progress=False, **ENV)
    assert all(tr.slipped == [] and tr.success for tr in trajs)
    assert len(samples) == sum(len(tr.turns) for tr in trajs)
    again = demonstrations(["radio", "check_boxes"], 3, progress=False, slip=0.5, **ENV)[1]
    assert [s.target for s in again] != [s.target for s in samples]  # the slips changed the data


def test_slip_must_be_a_probability():
    from trainer.learn.ppo_config import PPOConfig
    from trainer.recipe.default_model import RecipeConfig
    from trainer.rollout.actors import ExpertActor

    with pytest.raises(ValueError, match="slip must be a probability"):
        ExpertActor(None, slip=1.5)
    with pytest.raises(ValueError, match=r"recipe.demo_slip must be in \[0, 1\], got -0.1"):
        RecipeConfig(demo_slip=-0.1)  # refused when made
    with pytest.raises(ValueError, match="unknown task family 'nope'"):
        RecipeConfig(families=["radio", "nope"])
    with pytest.raises(ValueError, match="recipe.mrope must be one of interleaved, blocks, got 'spiral'"):
        RecipeConfig(mrope="spiral")
    with pytest.raises(ValueError, match=r"ppo.lora_r is not a setting of RecipeConfig"):
        RecipeConfig(ppo=PPOConfig(lora_r=4))


def test_train_default_refuses_bad_settings_before_any_work(tmp_path, capsys):
    from main import main

    for flags, message in ((["--demo-slip", "1.5"], "--demo-slip must be in [0, 1], got 1.5"),
                           (["--format-penalty", "-1"], "--format-penalty must be >= 0, got -1.0"),
                           (["--target-kl", "0"], "--target-kl must be > 0, got 0.0"),
                           (["--families", "radio,bogus"], "unknown task family 'bogus'"),
                           (["--hidden", "100"], "--hidden must be a positive multiple of 32, got 100"),
                           (["--vision-depth", "0"], "--vision-depth must be at least 1, got 0"),
                           (["--rope-theta", "0.5"], "--rope-theta must be > 1, got 0.5"),
                           (["--click-reward", "-1"], "--click-reward must be >= 0, got -1.0"),
                           (["--kl-coef", "-1"], "--kl-coef must be >= 0, got -1.0"),
                           (["--no-effect-penalty", "-1"], "--no-effect-penalty must be >= 0, got -1.0"),
                           (["--dual-clip", "0.5"], "--dual-clip must be > 1, got 0.5"),
                           (["--device", "tpu"], "--device: unknown device 'tpu'"),
                           (["--sft-clip", "-1"], "--sft-clip must be >= 0, got -1.0")):
        rc = main(["--data", str(tmp_path / "data"), "train", "default", "--out", str(tmp_path / "m"), *flags])
        assert rc == 2, flags
        assert message in capsys.readouterr().err
    for flags, message in ((["--mrope", "spiral"], "argument --mrope: invalid choice: 'spiral'"),
                           (["--arch", "llava"], "argument --arch: invalid choice: 'llava'")):
        with pytest.raises(SystemExit) as e:  # a field's choices are the flag's
            main(["--data", str(tmp_path / "data"), "train", "default", "--out", str(tmp_path / "m"), *flags])
        assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "m").exists() and not (tmp_path / "m-work").exists()


def test_resume_refuses_an_sft_stage_made_with_other_settings(tmp_path, capsys):
    from dataclasses import asdict, replace

    from trainer.recipe.default_model import SFT_STAGE_KEYS, RecipeConfig, run_recipe

    work = tmp_path / "work"
    (work / "sft").mkdir(parents=True)
    (work / "sft" / "model.safetensors").write_bytes(b"not reached")
    old = RecipeConfig(demo_slip=0.2)
    stage = {"demos": {}, "params": 1, "sft": {}, "eval_sft": {},
             "config": {k: asdict(old)[k] for k in SFT_STAGE_KEYS}}
    (work / "stage_sft.json").write_text(json.dumps(stage))
    new = RecipeConfig(demo_slip=0.0, sft=replace(RecipeConfig().sft, epochs=3.0))
    with pytest.raises(ValueError, match=r"made with other settings \(demo_slip=0.2, sft.epochs=5.0\)"):
        run_recipe(tmp_path / "out", new, work_dir=work, resume=True, progress=False)
    # a stage recorded before the settings nested (flat sft_* keys) is read as such
    stage["config"] = {"demo_slip": 0.2, "sft_epochs": 5.0, "sft_batch": 8, "seed": 0}
    (work / "stage_sft.json").write_text(json.dumps(stage))
    with pytest.raises(ValueError, match=r"made with other settings \(demo_slip=0.2, sft.epochs=5.0\)"):
        run_recipe(tmp_path / "out", new, work_dir=work, resume=True, progress=False)
    # from the command line: one clear line, no traceback, nothing written
    from main import main

    assert main(["--data", str(tmp_path / "data"), "train", "default", "--out", str(tmp_path / "out"), "--work",
                 str(work), "--resume", "--demo-slip", "0", "--sft-epochs", "3"]) == 2
    assert "made with other settings (demo_slip=0.2, sft.epochs=5.0)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_grounding_samples_ask_for_one_element_and_click_its_centre():
    from agent.coords import SMART_RESIZE
    from agent.grammar import parse_normalized
    from trainer.rollout.grounding import grounding_samples

    samples = grounding_samples(["click_button", "list_pick"], 3, per_screen=2, progress=False, **ENV)
    assert len(samples) == 2 * 3 * 2
    for s in samples:
        name = s.source.split(":", 3)[3]
        prompt = _text_of(s.messages[-1]) if isinstance(s.messages[-1]["content"], str) else \
            " ".join(_text_of(m) for m in s.messages)
        assert f"'{name}'" in prompt  # the instruction names the element
        parsed = parse_normalized(s.target, SMART_RESIZE, ENV["width"], ENV["height"], platform="sandbox")
        assert parsed and parsed.actions[0].name == "click" and f"'{name}'" in parsed.thought
    with pytest.raises(ValueError, match="training seeds"):
        grounding_samples(["radio"], 5, seed_start=999_998, progress=False, **ENV)


class _Scripted(Actor):
    """Stands in for the model: answers from a lookup (screenshot, element name) -> reply."""

    def __init__(self, answer):
        self.answer = answer

    def generate(self, messages, *, greedy: bool = False):
        import hashlib
        import re

        from trainer.rollout.actors import ActorOutput

        frame = next(p["frame"] for m in messages if isinstance(m["content"], list) for p in m["content"]
                     if p.get("type") == "image")
        instruction = " ".join(_text_of(m) for m in messages).split("## User Instruction")[-1]
        name = re.search(r"'([^']+)'", instruction).group(1)
        return ActorOutput(self.answer(hashlib.sha1(frame.pixels.tobytes()).hexdigest(), name))


def test_grounding_eval_scores_clicks_inside_the_named_element():
    import hashlib

    from agent.coords import SMART_RESIZE
    from agent.grammar import format_normalized
    from agent.schema import Action
    from trainer.rollout.grounding import grounding_eval
    from trainer.sandbox.env import SandboxEnv
    from trainer.sandbox.task import HELDOUT_START

    fams, n = ["click_button", "list_pick"], 2
    truth = {}  # the true clicks, found by visiting the same held-out screens independently
    env = SandboxEnv(**ENV)
    try:
        for k in range(n * len(fams)):
            obs, _ = env.reset(seed=HELDOUT_START + k, options={"family": fams[k % len(fams)]})
            key = hashlib.sha1(obs["screenshot"].tobytes()).hexdigest()
            for text, action, _ in env.labelled_targets():
                truth[key, text] = action
    finally:
        env.close()

    def reply(action, thought="I need to click it."):
        return format_normalized(thought, [action], SMART_RESIZE, ENV["width"], ENV["height"])

    right = grounding_eval(_Scripted(lambda key, name: reply(truth[key, name])), fams, n, **ENV)
    assert right["mean_accuracy"] == 1.0 and all(r["asked"] == 2 * n for r in right["families"].values())
    assert right["mean_named"] == 0.0  # "it" names nothing
    corner = grounding_eval(_Scripted(lambda key, name: reply(Action("click", {"start_box": (0.001, 0.999)}))),
                            fams, n, **ENV)
    assert corner["mean_accuracy"] == 0.0 and all(r["unparsed"] == 0 for r in corner["families"].values())
    # the instruction read (the thought names X) against X found: the two halves of a miss
    read_and_hit = grounding_eval(_Scripted(lambda key, name: reply(truth[key, name], f"I need to click '{name}'.")),
                                  fams, n, **ENV)
    assert read_and_hit["mean_named"] == 1.0
    assert all(r["named"] == 1.0 and r["accuracy_named"] == 1.0 for r in read_and_hit["families"].values())
    read_and_missed = grounding_eval(_Scripted(lambda key, name: reply(Action("click", {"start_box": (0.001, 0.999)}),
                                                                       f"The {name} one, I think.")), fams, n, **ENV)
    assert read_and_missed["mean_named"] == 1.0 and read_and_missed["mean_accuracy"] == 0.0
    assert all(r["accuracy_named"] == 0.0 for r in read_and_missed["families"].values())
    # a label inside a longer word is not a mention of it
    inside = grounding_eval(_Scripted(lambda key, name: reply(truth[key, name], f"I need to click 'x{name}x'.")),
                            fams, n, **ENV)
    assert inside["mean_named"] == 0.0 and inside["mean_accuracy"] == 1.0
    garbled = grounding_eval(_Scripted(lambda key, name: "Action: click(start_box='(1"), fams, n, **ENV)
    assert garbled["mean_accuracy"] == 0.0
    assert all(r["unparsed"] == r["asked"] for r in garbled["families"].values())


def test_eval_summary_reports_grounding_when_measured():
    from dataclasses import asdict

    from trainer.recipe.default_model import RecipeConfig, eval_summary

    def ev(success, grounding=None, named=None):
        r = {"families": {"radio": {"success": success}}, "mean_success": success}
        if grounding is not None:
            r["grounding"] = {"mean_accuracy": grounding, "families": {}}
        if named is not None:
            r["grounding"]["mean_named"] = named
        return r

    report = {"config": asdict(RecipeConfig(families=["radio"])), "eval_sft": ev(0.25, 0.4, 0.7),
              "eval_ppo": ev(0.5, 0.45, 0.8)}
    summary = eval_summary(report)
    assert summary["mean"] == {"sft": 0.25, "ppo": 0.5, "delta": 0.25}
    assert summary["grounding"] == {"sft": 0.4, "ppo": 0.45}
    assert summary["named"] == {"sft": 0.7, "ppo": 0.8}
    report["eval_sft"] = ev(0.25, 0.4)  # an SFT stage resumed from before the thought's naming was measured
    assert eval_summary(report)["named"] == {"ppo": 0.8}
    report["eval_sft"] = ev(0.25)  # an SFT stage resumed from before grounding was measured
    assert eval_summary(report)["grounding"] == {"ppo": 0.45}


def test_rollouts_record_each_click_beside_the_experts_and_asking_leaves_the_task_as_it_was():
    """What the dense grounding reward (PPOConfig.click_reward) compares: the turn's click and
    where the expert would have clicked in the same state."""
    from trainer.rl.rewards import click_rewards
    from trainer.rollout.actors import ActorOutput, ExpertActor
    from trainer.rollout.runner import run_episode
    from trainer.sandbox.env import SandboxEnv

    env = SandboxEnv(**ENV)
    try:
        env.reset(seed=11, options={"family": "check_boxes"})
        before = env.task.rng.getstate()
        first = env.expert_click()
        assert first is not None and all(0.0 < v < 1.0 for v in first)
        assert env.expert_click() == first and env.task.rng.getstate() == before  # no random choice used up
        _, action = env.expert_action()  # the expert's own answer is one of the two places a box reacts
        assert env.task.rng.getstate() != before

        expert = ExpertActor(env)
        for seed in range(3):
            tr = run_episode(expert, env, seed, family="click_button")
            assert tr.success and len(tr.turns) == 1
            # the expert's reply, written in the model's pixels and parsed back, lands where it asked
            assert click_rewards([tr.turns[0].point], [tr.turns[0].expert_point]) == [pytest.approx(1.0, abs=0.01)]

        class Corner(Actor):  # clicks the top-left corner, then writes something that does not parse
            def __init__(self):
                self.n = 0

            def generate(self, messages, greedy=False):
                self.n += 1
                return ActorOutput("Thought: corner\nAction: click(start_box='(1,1)')" if self.n == 1 else "nonsense")

        tr = run_episode(Corner(), env, 5, family="radio", max_steps=2)
        a, b = tr.turns
        assert a.point == pytest.approx((1 / 336, 1 / 252), abs=1e-3) and a.expert_point is not None
        assert b.point is None and b.parse_error  # no click: nothing to compare
        assert click_rewards([a.point, b.point], [a.expert_point, b.expert_point])[0] < 0.01
    finally:
        env.close()
