"""The shipped default model (assets/default_model, built by `python main.py train default`): a
standard checkpoint of a few MB that agent.vlm.model loads, with its held-out numbers and curves beside
it, and that runs on sandbox tasks out of the box through LocalVLMPolicy and the sandbox CLI."""
from __future__ import annotations

import json

from tests.conftest import ROOT
from tests.vlm_fixtures import one_thread  # noqa: F401 - fixture

MODEL = ROOT / "assets" / "default_model"


def _families() -> list[str]:
    return json.loads((MODEL / "tandem_training.json").read_text())["report"]["config"]["families"]


def test_default_model_is_a_small_standard_checkpoint():
    from agent.vlm.model import load_vlm

    assert MODEL.is_dir(), f"{MODEL} is missing: build it with `python main.py train default --out assets/default_model`"
    size = sum(p.stat().st_size for p in MODEL.rglob("*") if p.is_file())
    assert size < 16 * 2**20, f"the default model takes {size / 2**20:.1f} MB; it must stay a few MB"
    model, processor = load_vlm(MODEL, device="cpu")
    assert model.config.model_type == "qwen2_5_vl" and sum(p.numel() for p in model.parameters()) < 5_000_000
    ev = json.loads((MODEL / "eval.json").read_text())
    fams = _families()
    assert set(ev["families"]) == set(fams)
    for v in ev["families"].values():
        assert 0.0 <= v["sft"] <= 1.0 and 0.0 <= v["ppo"] <= 1.0
    assert (MODEL / "training_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    games = ev["config"].get("games")
    if games:  # the games stage ran: what ships is its model, scored on the games before and after it
        assert set(ev["games"]["per_game"]) == set(games) and ev["final"]["stage"] == "games"
        assert 0.0 <= ev["final"]["success"] <= 1.0 and ev["games"]["overall"]["after"] is not None


def test_default_model_acts_on_sandbox_tasks_through_the_agent_policy(one_thread):  # noqa: F811
    """LocalVLMPolicy (what the agent runs) on the first held-out task of each trained family:
    the loop runs through, and the replies parse into clicks the sandbox executes. Not every
    reply parses (the model is tiny: about one step in ten does not, measured), so the test
    asserts most do, and that success is the verifier's word."""
    from agent.policies import LocalVLMPolicy
    from trainer.rollout.actors import PolicyActor
    from trainer.rollout.runner import run_episode
    from trainer.sandbox.env import SandboxEnv
    from trainer.sandbox.task import HELDOUT_START

    policy = LocalVLMPolicy(str(MODEL), platform="sandbox", max_new_tokens=64)
    from trainer.rollout.sandbox_cli import model_screen
    from trainer.sandbox.env import observation_for

    screen = model_screen(MODEL)  # the size it was trained at
    env = SandboxEnv(screen.get("width", 320), screen.get("height", 240), coords_space=policy.space,
                     observation=observation_for(MODEL))
    trajs = []
    try:
        for k, fam in enumerate(_families()):
            trajs.append(run_episode(PolicyActor(policy), env, HELDOUT_START + k, family=fam, greedy=True))
    finally:
        env.close()
        policy.close()
    turns = [u for t in trajs for u in t.turns]
    parsed = [u for u in turns if u.parse_error is None]
    assert len(parsed) >= 0.6 * len(turns), [(u.text, u.parse_error) for u in turns if u.parse_error]
    from agent.actions import validate

    # every parsed reply is an action of the sandbox's space; the clicks dominate and land on listed elements
    acted = [u.actions[0] for u in parsed]
    assert len(acted) == len(parsed) and all(validate(a) is None for a in acted)
    assert sum(a.name == "click" for a in acted) >= 0.5 * len(acted)
    for t in trajs:
        assert t.success == (t.status == "success") and 1 <= len(t.turns)


def test_sandbox_eval_with_the_default_policy_out_of_the_box(capsys, one_thread):  # noqa: F811
    from main import main

    n = len(_families())  # one held-out episode of each family it was trained on
    assert main(["sandbox", "eval", "--policy", "default", "--episodes", str(n), "--split", "heldout", "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert set(out["families"]) == set(_families())  # it evaluates the families it was trained on
    assert "families it was trained on" in captured.err
    assert 0.0 <= out["overall"] <= 1.0
