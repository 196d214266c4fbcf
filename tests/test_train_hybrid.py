"""The hybrid families through training: demonstrations with the tools on, and `train ppo` on a hybrid
family, whose rollouts call a tool and see its output in the next turn's observation."""
from __future__ import annotations

import json

import pytest

from tests.vlm_fixtures import one_thread, tiny_vlm_dir  # noqa: F401 - fixtures

pytest.importorskip("trainer.rl.gae", reason="trainer/rl (the PPO math) is not written yet")

SCREEN = {"width": 224, "height": 168}


def test_env_spec_carries_the_tools_to_the_env_and_names_a_bad_value():
    from trainer.rollout.specs import EnvSpec, SpecError
    from trainer.sandbox.env_process import make_envs

    with pytest.raises(SpecError, match="EnvSpec.tools must be True or False, got 'yes'"):
        EnvSpec(tools="yes")
    assert EnvSpec().kwargs()["tools"] is False
    for n in (1, 2):  # in this process, and each env in a process of its own
        envs = make_envs(n, **EnvSpec(**SCREEN, tools=True).kwargs())
        try:
            assert all(e.tools and "terminal" in e.platforms for e in envs)
        finally:
            for e in envs:
                e.close()


def test_recipe_demonstrations_of_a_hybrid_family_with_the_tools_teach_the_call_and_show_its_output():
    from trainer.recipe.default_model import demonstrations

    trajs, samples = demonstrations(["output_decides"], 2, **SCREEN, progress=False, tools=True)
    assert all(t.success for t in trajs) and len(samples) == sum(len(t.turns) for t in trajs)
    calls = [s for s in samples if "run_command(command='wc" in s.target]
    assert len(calls) == 2  # each episode's first target is the tool call
    # the turn after it shows the command's output in its prompt (the text the model reads)
    after = [s for s in samples if s.source.endswith("#1")]
    shown = [p.get("text", "") for s in after for m in s.messages if isinstance(m.get("content"), list)
             for p in m["content"]]
    assert len(after) == 2 and sum("wc -" in t and ".log" in t for t in shown) >= 2
    with pytest.raises(Exception, match="cannot be played without the tools"):
        demonstrations(["config_to_form"], 1, **SCREEN, progress=False)


def test_train_ppo_tools_flag_defaults_on_for_a_hybrid_family_and_off_is_refused_where_it_cannot_play(
        tiny_vlm_dir, tmp_path, capsys):  # noqa: F811
    from main import main
    from trainer.learn.cli import ppo_tools

    assert ppo_tools(None, ["radio", "output_decides"]) is True
    assert ppo_tools(None, ["radio"]) is False and ppo_tools(None, None) is False
    assert ppo_tools("off", ["output_decides"]) is False and ppo_tools("on", ["radio"]) is True
    rc = main(["--data", str(tmp_path / "data"), "train", "ppo", "--model", str(tiny_vlm_dir), "--out",
               str(tmp_path / "p"), "--families", "config_to_form", "--tools", "off"])
    assert rc == 2 and "config_to_form cannot be played without the tools" in capsys.readouterr().err


def test_one_ppo_update_on_a_hybrid_family_calls_a_tool_and_sees_its_output(
        tiny_vlm_dir, tmp_path, capsys, one_thread):  # noqa: F811
    """The tiny model is first taught (a few SFT steps on the expert's first turns, tools on) to open
    output_decides with its `wc` command; one `train ppo` update (tools on by default for a hybrid
    family) then plays those seeds: the rollouts run the command and the next turn's frame carries
    its output, which the PPO metrics count."""
    from main import main
    from trainer.learn.metrics import read_metrics
    from trainer.learn.sft import Sample, SFTConfig, load_for_training, train_sft
    from trainer.rollout.runner import demonstrate

    trajs = demonstrate([(0, "output_decides"), (1, "output_decides")], env_kw={**SCREEN, "tools": True, "observation": "pixels"})
    assert all(t.success for t in trajs)
    first = [t.turns[0] for t in trajs]
    assert all("run_command(command='wc" in t.text for t in first)  # the expert opens with the tool
    assert all(t.turns[1].tool_output["tool"] == "run_command" for t in trajs)  # and the next frame shows its output
    model, proc = load_for_training(tiny_vlm_dir, "cpu")
    taught = tmp_path / "taught"
    train_sft(model, proc, [Sample(t.messages, t.text, "demo") for t in first],
              SFTConfig(lr=3e-3, batch_size=2, max_steps=80, grad_clip=None, schedule="constant"), taught,
              progress=False)

    out = tmp_path / "run" / "ppo"
    rc = main(["--data", str(tmp_path / "data"), "train", "ppo", "--model", str(taught), "--out", str(out),
               "--updates", "1", "--batch", "2", "--workers", "0", "--value-pretrain", "0", "--epochs", "1",
               "--temperature", "0.05", "--max-new-tokens", "80", "--max-steps", "2", "--families", "output_decides",
               "--width", str(SCREEN["width"]), "--height", str(SCREEN["height"]), "--device", "cpu"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["updates"] == 1
    ppo = [r for r in read_metrics(tmp_path / "run" / "ppo-logs" / "metrics.jsonl") if r["phase"] == "ppo"]
    assert len(ppo) == 1
    # two episodes of two turns: the first turns call the tool (measured: both), the second turns see what it printed
    assert ppo[0]["tool_rate"] >= 0.25 and ppo[0]["tool_output_rate"] >= 0.25
