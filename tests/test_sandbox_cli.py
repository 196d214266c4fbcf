"""`python main.py sandbox ...` end to end: a PNG of a task, expert episodes in a real store, eval JSON."""
from __future__ import annotations

import json

import pytest
from pytest import approx

from main import main
from tests.vlm_fixtures import one_thread  # noqa: F401 - fixture


def test_show_saves_a_png_offscreen(tmp_path, capsys):
    out = tmp_path / "task.png"
    assert main(["sandbox", "show", "--family", "menu", "--seed", "3", "--png", str(out), "--expert-steps", "1"]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")
    assert "Choose" in capsys.readouterr().out


def test_show_without_png_offscreen_says_why(capsys):
    assert main(["sandbox", "show", "--family", "menu"]) == 2
    assert "--png" in capsys.readouterr().err


def test_show_unknown_family_is_named(tmp_path, capsys):
    assert main(["sandbox", "show", "--family", "nosuch", "--png", str(tmp_path / "x.png")]) == 2
    assert "nosuch" in capsys.readouterr().err


def test_generate_writes_rollouts_into_the_store(tmp_path):
    from agent.storage.store import Store

    data = tmp_path / "data"
    assert main(["sandbox", "generate", "--episodes", "6", "--data", str(data), "--families", "dialog,form,tabs"]) == 0
    with Store(data) as store:
        eps = store.list_episodes()
        assert len(eps) == 6
        ep = store.load_episode(eps[0].id)
        assert ep.kind == "rollout" and ep.producer == "expert" and ep.platform == "sandbox"
        assert ep.outcome.success is True and ep.outcome.source == "verifier" and ep.meta["family"] in ("dialog", "form", "tabs")
        assert all(s.thought and store.get_blob(s.observation.screenshot).startswith(b"\x89PNG") for s in ep.steps)
        assert ep.steps[-1].terminated and not ep.steps[-1].truncated
        # each step keeps the element list of the frame it acted on; the expert's clicks land in it
        for e in (store.load_episode(x.id) for x in eps):
            for s in e.steps:
                assert s.observation.elements_source == "sandbox" and s.observation.elements
                for a in [s.action]:
                    if a.name == "click":
                        x, y = a.args["start_box"][0] * s.observation.width, a.args["start_box"][1] * s.observation.height
                        assert any(el.contains(x, y) for el in s.observation.elements), (a, s.observation.elements)
        assert store.check() == []


def test_eval_json(capsys):
    assert main(["sandbox", "eval", "--policy", "expert", "--episodes", "4", "--families", "radio,slider", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    intervals = out.pop("intervals")
    assert out == {"overall": 1.0, "families": {"radio": 1.0, "slider": 1.0}}
    assert intervals["overall"] == {"episodes": 4, "ci95": [approx(0.5101, abs=1e-4), approx(1.0)]}  # Wilson, 4 of 4
    assert intervals["families"]["radio"]["episodes"] == 2


def test_eval_default_model_batched_over_env_processes(capsys, one_thread):  # noqa: F811
    """The default model over 3 envs (one batched generation per round) gives each episode what
    one env gives it: the same per-episode outcomes, and the table names episodes and intervals."""
    args = ["sandbox", "eval", "--policy", "default", "--episodes", "6", "--families", "radio,tabs", "--trace", "--json"]
    assert main(args + ["--envs", "3"]) == 0
    batched = json.loads(capsys.readouterr().out)
    assert main(args + ["--envs", "1"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert batched["families"] == alone["families"] and batched["trace"] == alone["trace"]
    assert batched["intervals"]["overall"]["episodes"] == 6
    assert main(["sandbox", "eval", "--policy", "default", "--episodes", "2", "--families", "radio", "--envs", "2"]) == 0
    table = capsys.readouterr().out
    assert "95% interval" in table and "overall" in table
    assert main(["sandbox", "eval", "--policy", "default", "--episodes", "2", "--envs", "0"]) == 2
    assert "--envs must be at least 1" in capsys.readouterr().err


def test_eval_model_policy_without_a_model_says_so(tmp_path, capsys):
    assert main(["sandbox", "eval", "--policy", "local", "--model-dir", str(tmp_path / "none"), "--episodes", "1"]) == 2
    assert "local" in capsys.readouterr().err


@pytest.mark.parametrize("policy", ["endpoint"])
def test_eval_endpoint_needs_url(policy, capsys):
    assert main(["sandbox", "eval", "--policy", policy, "--episodes", "1"]) == 2
    assert "--url" in capsys.readouterr().err


def test_eval_grounding_scores_the_default_model_and_refuses_scripted_policies(capsys, one_thread):  # noqa: F811
    assert main(["sandbox", "eval", "--policy", "default", "--grounding", "--episodes", "4", "--families",
                 "click_button,list_pick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["families"]) == {"click_button", "list_pick"}
    assert all(0.0 <= v <= 1.0 for v in out["families"].values()) and 0.0 <= out["overall"] <= 1.0
    assert set(out["named"]["families"]) == {"click_button", "list_pick"} and 0.0 <= out["named"]["overall"] <= 1.0
    assert main(["sandbox", "eval", "--policy", "default", "--grounding", "--episodes", "2", "--families",
                 "radio"]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[-3:] == ["unparsed", "named", "hits|named"]
    row = table.splitlines()[1].split()
    assert row[0] == "radio" and row[1] == "4"  # two screens, two elements asked on each
    assert row[3].startswith("[") and row[4].endswith("]")  # the hit rate's 95% interval
    assert len(row) == 8 and row[6].endswith("%") and row[7].endswith("%")
    assert table.splitlines()[-1].split()[:2] == ["overall", "4"]
    assert main(["sandbox", "eval", "--policy", "expert", "--grounding", "--episodes", "4"]) == 2
    assert "--grounding scores a model" in capsys.readouterr().err


def test_eval_trace_shows_what_each_step_did(capsys):
    """The expert's clicks all land on the element it means and each changes the screen; random
    actions mostly hit nothing and change nothing, and the table and the episode lines say so."""
    assert main(["sandbox", "eval", "--policy", "expert", "--episodes", "6", "--families", "radio,check_boxes,click_button",
                 "--trace", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["overall"] == 1.0
    for fam, row in out["trace"].items():
        assert row["episodes"] == 2 and row["clicks_per_episode"] >= 1
        assert row["missed"] == 0.0 and row["no_effect"] == 0.0 and row["unparsed"] == 0.0, fam
    assert main(["sandbox", "eval", "--policy", "random", "--episodes", "8", "--families", "radio,click_button",
                 "--trace"]) == 0
    text = capsys.readouterr().out
    assert text.count(" failure: ") + text.count(" success: ") == 8
    assert "click nothing (" in text and "no effect" in text
    header = next(line for line in text.splitlines() if line.startswith("family"))
    assert header.split() == ["family", "n", "success", "95%", "interval", "clicks/ep", "missed", "no", "effect"]


def test_trace_summary_counts_by_hand():
    from trainer.rollout.runner import Trajectory, Turn, trace_summary

    def turn(action, hit, changed):
        return Turn([], [], [], "", action=action, hit=hit, changed=changed)

    trajs = [Trajectory(0, "radio", "", [turn("click", "", False), turn("click", "Red", True), turn("", None, None)]),
             Trajectory(1, "radio", "", [turn("wait", None, False), turn("click", "Red", None)])]
    got = trace_summary(trajs)["radio"]
    # 3 clicks in 2 episodes, one on nothing; of the 3 turns whose effect was judged, 2 changed nothing
    assert got == {"episodes": 2, "clicks_per_episode": 1.5, "missed": approx(1 / 3), "no_effect": approx(2 / 3),
                   "unparsed": approx(1 / 5)}


def test_eval_trace_of_the_default_model(capsys, one_thread):  # noqa: F811
    assert main(["sandbox", "eval", "--policy", "default", "--episodes", "2", "--families", "radio", "--trace",
                 "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["trace"]["radio"]
    assert row["episodes"] == 2 and row["clicks_per_episode"] > 0  # the model's replies were parsed and traced
    assert 0.0 <= row["missed"] <= 1.0 and 0.0 <= row["no_effect"] <= 1.0
