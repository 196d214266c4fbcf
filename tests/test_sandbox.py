"""The sandbox on real Qt widgets (offscreen): the expert solves every family, a random policy
rarely does, the verifier reads real widget state, pixels are deterministic, and the env obeys
Gymnasium's API, alone and in parallel processes."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from agent.schema import Action
from trainer.rollout.actors import ExpertActor, RandomActor
from trainer.rollout.runner import EpisodeRunner, plan, rates, run_episode
from trainer.sandbox.env import SandboxEnv
from trainer.sandbox.families import FAMILIES
from trainer.sandbox.task import HELDOUT_START


@pytest.fixture(scope="module")
def env():
    e = SandboxEnv()
    yield e
    e.close()


def _digest(obs) -> str:
    return hashlib.sha256(obs["screenshot"].tobytes()).hexdigest()


def test_at_least_twelve_families_of_rising_difficulty():
    levels = [c.level for c in FAMILIES.values()]
    assert len(FAMILIES) >= 12
    assert levels == sorted(levels) and levels[0] == 1 and levels[-1] >= 5


def _play(make, envs, tickets):
    """The tickets played by the one episode runner, as every policy is measured."""
    return EpisodeRunner(make(envs), envs, greedy=True).run_all(tickets)


def test_expert_solves_500_tasks_across_all_families(env):
    trajs = _play(ExpertActor, [env], plan(400, "train") + plan(100, "heldout"))
    failed = [(t.family, t.seed, t.status) for t in trajs if not t.success]
    assert not failed, failed
    assert {t.family for t in trajs} == set(FAMILIES)
    assert all(sum(u.reward for u in t.turns) == 1.0 and not any(u.parse_error for u in t.turns) for t in trajs)


def test_random_policy_solves_few(env):
    out = rates(_play(RandomActor, [env], plan(160, "heldout")))
    print("random policy success:", {k: round(v, 2) for k, v in out["families"].items()}, "overall", out["overall"])
    assert out["overall"] < 0.2


def test_expert_records_thoughts_and_screens(env, tmp_path):
    from agent.storage.store import Store
    from trainer.rollout.runner import trajectory_to_episode

    traj = run_episode(ExpertActor(env), env, 11, family="form")
    assert traj.success and len(traj.turns) >= 3
    assert "form" in traj.instruction.lower() or "fill" in traj.instruction.lower()
    store = Store(tmp_path / "data")
    try:
        ep = trajectory_to_episode(traj, store, producer="expert", policy_version="sandbox-expert")
        again = store.load_episode(ep.id)
        assert again.kind == "rollout" and again.outcome.success and again.meta["family"] == "form"
        assert len(again.steps) == len(traj.turns) and again.steps[-1].terminated
        for step, turn in zip(again.steps, traj.turns, strict=True):
            assert store.get_blob(step.observation.screenshot).startswith(b"\x89PNG")
            assert step.thought == turn.thought and step.thought and step.action == turn.actions[0]
            assert step.raw_response == turn.text and step.observation.elements  # the sandbox's element list
    finally:
        store.close()


def test_same_seed_same_pixels_and_different_seeds_differ(env):
    obs1, info1 = env.reset(seed=123, options={"family": "dropdown"})
    env.step(env.expert_action()[1])  # open a popup, then start again
    env.reset(seed=7, options={"family": "menu"})
    obs2, info2 = env.reset(seed=123, options={"family": "dropdown"})
    assert info1["instruction"] == info2["instruction"]
    assert np.array_equal(obs1["screenshot"], obs2["screenshot"])
    other, _ = env.reset(seed=124, options={"family": "dropdown"})
    assert not np.array_equal(obs1["screenshot"], other["screenshot"])
    # the same after the same actions, popups included
    a = env.reset(seed=5, options={"family": "settings_chain"})[0]
    for _ in range(2):
        a = env.step(env.expert_action()[1])[0]
    b = env.reset(seed=5, options={"family": "settings_chain"})[0]
    for _ in range(2):
        b = env.step(env.expert_action()[1])[0]
    assert np.array_equal(a["screenshot"], b["screenshot"])


def test_reset_without_seed_draws_from_the_split():
    e = SandboxEnv(split="heldout")
    try:
        e.reset(seed=None)
        _, info = e.reset()
        assert info["task_seed"] >= HELDOUT_START and info["split"] == "heldout"
    finally:
        e.close()


# ------------------------------------------------------------ the verifier is not fooled
def _seed_where(env, family, pred):
    for seed in range(200):
        env.reset(seed=seed, options={"family": family})
        if pred(env.task):
            return seed
    raise AssertionError(f"no seed of {family} fits")


def _point(env, widget, rect=None):
    return env.screen.point_of(widget, rect)


def test_wrong_button_fails(env):
    env.reset(seed=3, options={"family": "click_button"})
    t = env.task
    wrong = next(b for k, b in t.buttons.items() if k != t.target)
    _, reward, term, _, info = env.step(Action("click", {"start_box": _point(env, wrong)}))
    assert reward == 0 and term and info["status"] == "failed" and not info["success"]


def test_wrong_checkbox_is_not_success(env):
    def fits(t):
        return any(not c.isChecked() for k, c in t.boxes.items() if k not in t.want)

    env.reset(seed=_seed_where(env, "check_boxes", fits), options={"family": "check_boxes"})
    t = env.task
    extra = next(k for k, c in t.boxes.items() if k not in t.want and not c.isChecked())
    env.step(t.click_toggle(t.boxes[extra]))  # a box that must stay off
    for k in t.want:  # then every wanted box, as the instruction says
        if not t.boxes[k].isChecked():
            _, reward, _, _, info = env.step(t.click_toggle(t.boxes[k]))
            assert reward == 0 and not info["success"]
    assert t.boxes[extra].isChecked() and all(t.boxes[k].isChecked() for k in t.want)
    assert not t.verdict().status == "success"


def test_text_in_the_wrong_field_is_not_success(env):
    env.reset(seed=_seed_where(env, "type_text", lambda t: len(t.edits) >= 2), options={"family": "type_text"})
    t = env.task
    other = next(e for k, e in t.edits.items() if k != t.field)
    env.step(Action("click", {"start_box": _point(env, other)}))
    _, reward, term, _, info = env.step(Action("type", {"content": t.target}))
    assert other.text().endswith(t.target) and reward == 0 and not term and not info["success"]


def test_same_label_on_another_tab_is_not_success(env):
    env.reset(seed=_seed_where(env, "tabs", lambda t: t.tabs.tabText(0) != t.target[0] and (t.tabs.tabText(0), t.target[1]) in t.boxes),
              options={"family": "tabs"})
    t = env.task
    decoy = t.boxes[(t.tabs.tabText(0), t.target[1])]  # visible on the first tab, same label
    _, reward, _, _, info = env.step(t.click_toggle(decoy))
    assert decoy.isChecked() and reward == 0 and not info["success"] and info["status"] == "running"


def test_wrong_menu_entry_fails(env):
    env.reset(seed=4, options={"family": "menu"})
    t = env.task
    env.step(env.expert_action()[1])  # opens the right menu
    menu = t.menus[t.target[0]]
    wrong = next(a for (m, e), a in t.actions.items() if m == t.target[0] and e != t.target[1])
    _, reward, term, _, info = env.step(Action("click", {"start_box": _point(env, menu, menu.actionGeometry(wrong))}))
    assert reward == 0 and term and info["status"] == "failed"


def test_wrong_card_on_the_target_fails_to_pass(env):
    env.reset(seed=_seed_where(env, "drag_drop", lambda t: len(t.cards) >= 2), options={"family": "drag_drop"})
    t = env.task
    card = next(c for f, c in t.cards.items() if f != t.target[0])
    zone = t.zones[t.target[1]]
    _, reward, _, _, info = env.step(Action("drag", {"start_box": _point(env, card), "end_box": _point(env, zone)}))
    assert card.zone == t.target[1] and reward == 0 and not info["success"]
    # the expert notices the intruder and still solves it
    for _ in range(4):
        _, reward, term, trunc, info = env.step(env.expert_action()[1])
        if term or trunc:
            break
    assert info["success"]


def test_context_menu_on_the_wrong_file_fails(env):
    env.reset(seed=2, options={"family": "context_menu"})
    t = env.task
    lw = t.files.list
    other = next(lw.item(i) for i in range(lw.count()) if lw.item(i).text() != t.target[0])
    env.step(Action("right_single", {"start_box": _point(env, lw.viewport(), lw.visualItemRect(other))}))
    menu = t.files.menu
    assert menu.isVisible() and t.files.opened_on == other.text()
    _, reward, term, _, info = env.step(Action("click", {"start_box": _point(env, menu, menu.actionGeometry(t.files.actions[t.target[1]]))}))
    assert reward == 0 and term and info["status"] == "failed"


def test_modal_dialog_blocks_the_window_behind_it(env):
    env.reset(seed=_seed_where(env, "dialog", lambda t: t.starts_open), options={"family": "dialog"})
    t = env.task
    assert t.dialog.isVisible()
    clicks = []
    t.opener.clicked.connect(lambda: clicks.append(1))
    env.step(Action("click", {"start_box": (0.03, 0.95)}))  # the main window, outside the dialog
    assert t.dialog.isVisible() and not clicks


# ------------------------------------------------------------ the env's contract
def test_the_env_takes_actions_and_the_runner_parses_each_reply_once(env):
    from agent.grammar import parse_reply
    from trainer.rollout.actors import Actor, ActorOutput

    env.reset(seed=9, options={"family": "click_button"})
    _, reward, term, trunc, info = env.step(env.expert_response())  # text is not the env's to parse
    assert "parse_reply" in info["action_error"] and reward == 0 and not term and not trunc
    parsed = parse_reply(env.expert_response(), env.coords_space, env.width, env.height, platforms=(env.platform,))
    _, reward, term, _, info = env.step(list(parsed.actions))
    assert reward == 1 and term and info["success"] and parsed.thought.startswith("I need to click")

    class Script(Actor):  # an unknown action, then the expert's reply
        def __init__(self):
            self.replies = ["Action: clack(start_box='(1,2)')"]

        def generate(self, messages, *, greedy=False):
            return ActorOutput(self.replies.pop(0) if self.replies else env.expert_response())

    traj = run_episode(Script(), env, 9, family="click_button")
    bad, good = traj.turns
    assert "clack" in bad.parse_error and bad.reward == 0 and bad.changed is None and not bad.actions
    assert "could not be used" in "".join(str(m.get("content")) for m in good.messages)  # re-asked, with feedback
    assert good.parse_error is None and traj.success and good.actions[0].name == "click"


def test_step_limit_truncates_and_finished_terminates(env):
    _, info = env.reset(seed=1, options={"family": "form"})
    for _ in range(info["max_steps"]):
        _, reward, term, trunc, info = env.step(Action("wait", {}))
    assert trunc and not term and reward == 0
    env.reset(seed=1, options={"family": "form"})
    _, reward, term, trunc, info = env.step(Action("finished", {}))
    assert term and not trunc and reward == 0 and not info["success"]


def test_bad_family_and_seed_are_named(env):
    from trainer.sandbox.screen import SandboxError

    with pytest.raises(SandboxError, match="nosuch"):
        env.reset(seed=1, options={"family": "nosuch"})
    with pytest.raises(SandboxError, match="seed"):
        env.reset(options={"family": "menu", "task_seed": -5})


def test_gymnasium_env_checker():
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    from trainer.sandbox import ENV_ID, register

    register()
    e = gym.make(ENV_ID, width=256, height=192)
    try:
        check_env(e.unwrapped)
        obs, _ = e.reset(seed=3)
        assert obs["screenshot"].shape == (192, 256, 3) and obs in e.observation_space
    finally:
        e.close()


def test_parallel_workers_match_in_process(env):
    from trainer.sandbox.env_process import make_envs

    tickets = plan(8, "heldout", ["dropdown", "drag_drop", "menu", "search_chain"])
    here = [(t.family, t.seed, len(t.turns), t.success) for t in _play(ExpertActor, [env], tickets)]
    envs = make_envs(2)
    try:
        there = [(t.family, t.seed, len(t.turns), t.success) for t in _play(ExpertActor, envs, tickets)]
    finally:
        for e in envs:
            e.close()
    assert here == there and all(x[3] for x in there)


def test_async_vector_env_one_per_process():
    from trainer.sandbox.env import make_vector_env

    v = make_vector_env(2)
    try:
        obs, info = v.reset(seed=[11, 11], options={"family": "radio"})
        assert obs["screenshot"].shape == (2, 240, 320, 3)
        assert np.array_equal(obs["screenshot"][0], obs["screenshot"][1])  # same seed, two processes
        acts = v.call("expert_action")
        _, reward, term, trunc, info = v.step(tuple(a for _, a in acts))
        assert list(reward) == [1.0, 1.0] and all(term)
    finally:
        v.close()


def test_each_labelled_target_is_clicked_where_it_says(env):
    """Grounding labels: the click of every listed element lands on that element (real widgets)."""
    for seed in range(4):
        env.reset(seed=seed, options={"family": "click_button"})
        targets = env.labelled_targets()
        assert {text for text, _, _ in targets} == set(env.task.buttons)
        for text, action, (x0, y0, x1, y1) in targets:
            x, y = action.args["start_box"]
            assert x0 < x < x1 and y0 < y < y1  # the click is inside the element's box
            env.reset(seed=seed, options={"family": "click_button"})
            env.step(action)
            assert env.task.clicked == [text]
    # list items: the label's click selects exactly that item, as the expert's click does
    env.reset(seed=5, options={"family": "list_pick"})
    t = env.task
    by_text = {text: action for text, action, _ in env.labelled_targets()}
    assert by_text[t.target].args["start_box"] == t.expert()[1].args["start_box"]
    # check boxes: the click toggles the box named, none other
    env.reset(seed=2, options={"family": "check_boxes"})
    name, action, _ = env.labelled_targets()[0]
    before = {k: c.isChecked() for k, c in env.task.boxes.items()}
    env.step(action)
    after = {k: c.isChecked() for k, c in env.task.boxes.items()}
    assert [k for k in before if before[k] != after[k]] == [name]


def test_labelled_targets_leave_out_hidden_and_ambiguous_elements(env):
    env.reset(seed=1, options={"family": "tabs"})
    texts = [text for text, _, _ in env.labelled_targets()]
    assert len(texts) == len(set(texts))
    from PySide6.QtWidgets import QAbstractButton

    buttons = [b for b in env.screen.window.findChildren(QAbstractButton) if b.text()]
    hidden_only = {b.text() for b in buttons if not b.isVisible()} - {b.text() for b in buttons if b.isVisible()}
    assert hidden_only and not hidden_only & set(texts)  # the other tabs' check boxes are not on screen
    with pytest.raises(RuntimeError, match="reset"):
        SandboxEnv().labelled_targets()
