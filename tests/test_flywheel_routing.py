"""Scoring and routing on hand-made episodes in a real store: rule checks, outcome sources, the
routing rules, the decision table and undo, corrections as SFT samples and preference pairs."""
from __future__ import annotations

import json

import pytest

from agent.schema import Action, Outcome, Provenance
from tests.factories import make_episode
from tests.vlm_fixtures import tiny_vlm_dir  # noqa: F401 - fixture
from trainer.flywheel import FlywheelError
from trainer.flywheel.routing import Router, RoutingConfig, decide, export_corrections
from trainer.flywheel.scoring import OutcomeRewardModel, parse_judgement, rule_checks, score_episode


def test_a_clean_recording_passes_every_rule(store):
    ep = make_episode(store, 3)
    reasons, fatal, quality = rule_checks(ep)
    assert (reasons, fatal, quality) == ([], [], 1.0)


def test_rule_checks_name_each_problem(store):
    ep = make_episode(store, 5)  # click, type, scroll, drag, finished
    ep.steps[1].thought = "  "
    ep.steps[2].observation.screenshot = None
    ep.steps[3].raw_response = "Thought: hm\nAction: click(start_box='(12"  # cut off
    ep.steps.append(ep.steps[0].__class__(**{**ep.steps[0].__dict__, "index": 5}))  # a step after finished
    reasons, fatal, quality = rule_checks(ep)
    text = "\n".join(reasons)
    assert "step 2: empty thought" in text  # numbered from 1, as a person reads them (Library, Routing tab)
    assert "step 3: no screenshot" in text
    assert "step 4: the model's output did not parse" in text
    assert "step 6: comes after finished at step 5" in text
    assert fatal == []
    assert quality == pytest.approx(2 / 6)


def test_an_action_that_cannot_be_written_back_is_flagged(store):
    ep = make_episode(store, 1)
    ep.steps[0].action = Action("click", {"start_box": (1.7, 0.2)})  # outside the screenshot
    reasons, _, quality = rule_checks(ep)
    assert quality == 0.0 and "outside the screenshot" in reasons[0]


def test_outcome_sources_verifier_and_marks_are_kept(store):
    ep = make_episode(store, 2, kind="rollout")
    ep.outcome = Outcome(False, 0.0, "verifier")
    s = score_episode(ep)
    assert (s.outcome.success, s.outcome.source) == (False, "verifier")
    ep.outcome = Outcome(True, None, "annotator")
    s = score_episode(ep)
    assert (s.outcome.success, s.outcome.reward, s.outcome.source) == (True, 1.0, "annotator")


def test_parse_judgement():
    assert parse_judgement("Yes.") is True
    assert parse_judgement("no, the dialog is still open") is False
    assert parse_judgement("  The task was COMPLETED") is True
    assert parse_judgement("maybe") is None
    assert parse_judgement("") is None


def test_scripted_orm_sees_the_last_screenshots_and_the_instruction(store):
    seen = []

    def judge(messages):  # a scripted model: only the model may be scripted
        seen.append(messages)
        return "Yes"

    ep = make_episode(store, 3, kind="autonomous")
    s = score_episode(ep, image_of=store.get_blob, orm=OutcomeRewardModel(judge, last_screenshots=2))
    assert (s.outcome.success, s.outcome.source, s.judge_raw) == (True, "orm", "Yes")
    parts = seen[0][0]["content"]
    assert [p["type"] for p in parts] == ["image", "image", "text"]
    assert parts[1]["frame"].encoded == store.get_blob(ep.steps[-1].observation.screenshot)
    assert ep.instruction in parts[-1]["text"]
    # a verifier's result is never second-guessed by the ORM
    ep.outcome = Outcome(False, 0.0, "verifier")
    assert score_episode(ep, image_of=store.get_blob, orm=OutcomeRewardModel(judge)).outcome.source == "verifier"
    assert len(seen) == 1


def test_real_tiny_model_as_orm_runs_the_real_path(store, tiny_vlm_dir):  # noqa: F811
    ep = make_episode(store, 2, kind="autonomous")
    s = score_episode(ep, image_of=store.get_blob, orm=OutcomeRewardModel.local(tiny_vlm_dir, max_new_tokens=4))
    assert isinstance(s.judge_raw, str)
    # random weights rarely say yes or no; whatever it said is parsed, and an unclear answer is a reason
    assert s.outcome.success == parse_judgement(s.judge_raw)
    if s.outcome.success is None:
        assert any("neither yes nor no" in r for r in s.reasons)


def test_routing_rules():
    from trainer.flywheel.scoring import Score

    cfg = RoutingConfig()

    class E:  # only kind matters to decide()
        def __init__(self, kind):
            self.kind = kind

    ok = Score(Outcome(True, 1.0, "verifier"), 1.0)
    assert decide(E("rollout"), ok, cfg)[0] == "sft"
    assert decide(E("rollout"), Score(Outcome(True, 1.0, "verifier"), 0.75, ["step 1: empty thought"]), cfg)[0] == "ct"
    assert decide(E("rollout"), Score(Outcome(False, 0.0, "verifier"), 1.0), cfg)[0] == "ct"
    assert decide(E("rollout"), Score(Outcome(False, 0.0, "verifier"), 1.0), RoutingConfig(failed_to="rejected"))[0] == "rejected"
    assert decide(E("rollout"), Score(Outcome(), 1.0), cfg)[0] == "ct"  # unknown outcome
    # an unjudged recording is not SFT data unless trusted (before: every unjudged supervised run
    # went to SFT, a kill-switched run of random clicks among them)
    route, why = decide(E("recording"), Score(Outcome(), 1.0), cfg)
    assert route == "ct" and why[0].startswith("outcome unknown: unjudged episodes are not SFT data")
    assert decide(E("recording"), Score(Outcome(), 1.0), RoutingConfig(trust_human=True))[0] == "sft"
    # a demonstration without thoughts is not rejected for that alone (before: 3 of 4 thoughtless -> rejected)
    bare = Score(Outcome(True, 1.0, "annotator"), 0.25, ["step 0: empty thought"] * 3, thoughtless=3, steps=4)
    route, why = decide(E("recording"), bare, cfg)
    assert route == "ct" and why[0] == "3 of 4 steps have no thought: write them in the step viewer to make this SFT data"
    broken = Score(Outcome(True, 1.0, "annotator"), 0.25, ["step 0: invalid action"] * 3, thoughtless=0, steps=4)
    route, why = decide(E("recording"), broken, cfg)
    assert route == "rejected" and why[0] == "only 25% of the steps are usable (the floor is 50%)"
    assert decide(E("rollout"), Score(Outcome(True, 1.0, "verifier"), 0.4), cfg)[0] == "rejected"
    assert decide(E("rollout"), Score(Outcome(True), 0.0, ["no steps"], ["no steps"]), cfg) == ("rejected", ["no steps"])
    with pytest.raises(FlywheelError, match="sft_min_quality.*1.5"):
        RoutingConfig(sft_min_quality=1.5)
    with pytest.raises(FlywheelError, match="unknown setting.*bogus"):
        RoutingConfig.from_dict({"bogus": 1})


def test_routing_is_recorded_and_undone(store):
    good = make_episode(store, 2)  # a recording marked successful by its annotator, clean -> sft
    good.outcome = Outcome(True, 1.0, "annotator")
    store.save_episode(good)
    flawed = make_episode(store, 3, kind="rollout")
    flawed.outcome = Outcome(True, 1.0, "verifier")
    flawed.steps[1].thought = ""  # quality 2/3 -> ct
    store.save_episode(flawed)
    failed = make_episode(store, 2, kind="rollout")
    failed.outcome = Outcome(False, 0.0, "verifier")
    store.save_episode(failed)

    router = Router(store)
    counts = router.route(iteration=1)
    assert counts == {"sft": 1, "ct": 2, "rejected": 0}
    assert store.judgement(good.id).route == "sft" and store.judgement(flawed.id).route == "ct"
    # the judgement is the store's, of this content; the episode itself is as it was saved
    assert store.load_episode(good.id).to_dict() == good.to_dict()
    rows = router.decisions(1)
    assert {r["episode_id"]: r["route"] for r in rows} == {good.id: "sft", flawed.id: "ct", failed.id: "ct"}
    assert all(r["content_hash"] == store.load_episode_version(r["episode_id"])[1] for r in rows)
    assert any("empty thought" in x for r in rows if r["episode_id"] == flawed.id for x in r["reasons"])
    # the reason is kept with the judgement too (the Library shows it), and goes away on undo
    assert store.judgement(flawed.id).routing["why"][0] == (
        "1 of 3 steps have no thought: write them in the step viewer to make this SFT data")
    assert all(r["previous_route"] == "unscored" and r["time"] > 0 for r in rows)
    assert router.unscored() == []
    assert router.growth() == [{"iteration": 1, "sft": 1, "ct": 2, "rejected": 0}]

    assert router.undo(1) == 3
    assert {store.judgement(e.id).route for e in (good, flawed, failed)} == {"unscored"}
    assert store.judgement(failed.id).outcome is None  # the judged outcome before (none), restored
    assert store.load_episode(failed.id).outcome.source == "verifier"  # the episode's own, never touched
    assert store.judgement(flawed.id).routing == {} and store.judgement(flawed.id).revision == 2
    from agent.storage.store import StoreError

    with pytest.raises(StoreError, match="route is the flywheel's judgement of its content.*Store.judge"):
        store.update_episode_fields(good.id, route="sft")
    with pytest.raises(StoreError, match="route must be one of unscored, sft, ct, rejected, got 'gold'"):
        store.judge(good.id, "gold")
    assert router.undo(1) == 0  # twice is a no-op
    assert router.decisions(1) == [] and len(router.decisions(1, include_undone=True)) == 3
    assert router.pools()["unscored"] == 3


def test_corrections_become_sft_samples_and_preference_pairs(store, tmp_path):
    ep = make_episode(store, 3, kind="supervised")
    wrong = Action("click", {"start_box": (0.9, 0.9)})
    ep.steps[0].provenance = Provenance("corrected", proposal_thought="Click the corner.", proposal_action=wrong,
                                        decision="edit", decided_by="sam")
    store.save_episode(ep)
    make_episode(store, 2)  # no corrections: contributes nothing
    res = export_corrections(store, tmp_path / "out")
    assert (res["sft_samples"], res["preference_pairs"]) == (1, 1)
    pair = json.loads((tmp_path / "out" / "preferences.jsonl").read_text().strip())
    assert pair["episode_id"] == ep.id and pair["step"] == 0 and pair["decided_by"] == "sam"
    assert "click(start_box=" in pair["chosen"] and pair["chosen"] != pair["rejected"]
    assert pair["rejected"].startswith("Thought: Click the corner.")
    # the prompt the agent saw, ending with the current screenshot (its blob hash under "images")
    assert {"type": "image"} in pair["messages"][-1]["content"] and pair["images"] == [ep.steps[0].observation.screenshot]
    sample = json.loads((tmp_path / "out" / "corrections.jsonl").read_text().strip())
    assert sample["messages"][-1]["content"] == pair["chosen"] and sample["provenance"] == "corrected"
    assert sample["messages"][:-1] == pair["messages"] and pair["decision"] == "edit"

    from trainer.flywheel.routing import correction_samples

    samples = correction_samples(store, [ep.id])
    assert len(samples) == 1 and samples[0].source.endswith("#0") and "click(" in samples[0].target


def test_simulated_humans_are_marked_and_routed(store):
    from trainer.flywheel.simulated import simulate

    ids = simulate(store, recordings=2, supervised=1, families=["click_button"], width=224, height=168,
                   empty_thought_rate=0.0)
    assert (len(ids["recording"]), len(ids["supervised"])) == (2, 1)
    rec = store.load_episode(ids["recording"][0])
    assert rec.kind == "recording" and rec.meta["simulated"] and rec.outcome.source == "annotator"
    assert {s.provenance.source for s in rec.steps} == {"human"}
    sup = store.load_episode(ids["supervised"][0])
    assert sup.outcome.source == "supervisor" and any(s.provenance.source == "corrected" for s in sup.steps)
    # the corrected step keeps the wrong proposal as the model's reply, so its preference pair has two sides
    fixed = next(s for s in sup.steps if s.provenance.source == "corrected")
    assert fixed.raw_response.startswith("Thought: I will act here.")
    from trainer.learn.dpo import preference_pairs

    pairs = preference_pairs(store, [sup.id])
    assert len(pairs) == 1 and pairs[0].rejected.target == fixed.raw_response != pairs[0].chosen.target
    counts = Router(store).route(iteration=1)
    assert counts["sft"] == 3  # clean, successful (or a person's) episodes


def test_simulate_humans_from_the_cli_at_the_default_models_size_with_fresh_tasks_per_start(tmp_path, capsys):
    from agent.storage.model_files import DEFAULT_MODEL_DIR, model_screen
    from agent.storage.store import Store
    from main import main

    screen = model_screen(DEFAULT_MODEL_DIR)
    data = str(tmp_path / "data")
    for start in (0, 0, 7):
        assert main(["--data", data, "flywheel", "simulate-humans", "--recordings", "1", "--supervised", "0",
                     "--families", "radio", "--start", str(start)]) == 0
    store = Store(tmp_path / "data")
    try:
        eps = sorted((store.load_episode(e.id) for e in store.list_episodes()), key=lambda e: e.created_at)
    finally:
        store.close()
    assert len(eps) == 3
    assert {(e.steps[0].observation.width, e.steps[0].observation.height) for e in eps} == {
        (screen["width"], screen["height"])}  # pixel-exact for the model it trains (336x252)
    assert eps[0].instruction == eps[1].instruction != eps[2].instruction  # another start, another task


def test_flywheel_status_and_the_library_say_why_each_episode_went_where(store, qtbot, capsys):
    import json

    from main import main

    marked = make_episode(store, 2, instruction="Marked by its annotator")
    marked.outcome = Outcome(True, 1.0, "annotator")
    store.save_episode(marked)
    make_episode(store, 2, instruction="Nobody judged this one")
    Router(store).route(iteration=1)
    assert main(["flywheel", "status", "--json", "--data", str(store.root)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    why = {d["instruction"]: (d["route"], d["why"][0]) for d in out["routing"]["decisions"]}
    assert out["routing"]["iteration"] == 1
    assert why["Marked by its annotator"] == ("sft", "judged successful by annotator, every check passed")
    assert why["Nobody judged this one"][0] == "ct" and why["Nobody judged this one"][1].startswith("outcome unknown")

    from PySide6.QtCore import Qt

    from app.library_view import LibraryPage

    page = LibraryPage(store)
    qtbot.addWidget(page)
    row = page._row_of(marked.id)
    assert "judged successful by annotator" in page.proxy.index(row, 5).data(Qt.ToolTipRole)
    page.select_episode(marked.id)
    qtbot.waitUntil(lambda: page.viewer.episode is not None)
    assert "route sft (judged successful by annotator, every check passed)" in page.viewer.meta.text()


def test_an_episode_the_flywheel_cannot_read_is_skipped_and_named(store, tiny_vlm_dir, capsys):  # noqa: F811
    """One bad upload (a step whose info holds an unknown action, stored before the schema
    refused it) no longer stops every later iteration at its CT stage: the iteration routes and
    trains on the rest and names the episode it skipped."""
    import torch

    from trainer.flywheel.iteration import FlywheelConfig, run_iteration
    from trainer.flywheel.registry import Registry

    torch.set_num_threads(1)
    for _ in range(2):
        make_episode(store, 2, width=224, height=168)  # the good ones: unjudged recordings, CT
    bad = make_episode(store, 2, width=224, height=168)
    store.execute("UPDATE steps SET info = ? WHERE episode_id = ? AND idx = 1",
                  [json.dumps({"more_actions": [{"name": "no_such_action"}]}), bad.id])
    reg = Registry(store)
    reg.make_first(reg.register(tiny_vlm_dir).version, "first model")
    cfg = FlywheelConfig.from_dict(dict(width=224, height=168, max_steps=2, families=["click_button"], eval_episodes=1,
                                        rollouts=0, ct_steps=1, sft_steps=0, dpo_steps=0, batch=2, ppo_updates=0,
                                        max_new_tokens=8, miniwob_episodes=0))
    rep = run_iteration(store, cfg)
    assert "error" not in rep, rep.get("error")
    assert list(rep["skipped"]) == [bad.id]
    assert rep["skipped"][bad.id].startswith("does not load: SchemaError: action: unknown action 'no_such_action'")
    assert rep["routed"] == {"sft": 0, "ct": 2, "rejected": 0}
    ct = next(s for s in reg.get(rep["candidate"]).lineage["stages"] if s["phase"] == "ct")
    assert ct["steps"] == 1 and ct["samples"] == 4  # the two good episodes' steps
    saved = json.loads((store.root / "flywheel" / f"iteration-{rep['iteration']}.json").read_text())
    assert saved["skipped"] == rep["skipped"]
    from main import main

    assert main(["flywheel", "status", "--json", "--data", str(store.root)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["skipped"] == {"iteration": rep["iteration"], "episodes": rep["skipped"]}
