"""Batched rollouts: one left-padded generate for many chats gives what each chat gets alone;
the one episode runner over several environments (each in its own process) resets finished
slots, keeps the parse-error rule, and plays the same episodes as one environment does."""
from __future__ import annotations

import pytest

from tests.vlm_fixtures import one_thread, tiny_any_dir, tiny_qwen3_dir, tiny_vlm_dir  # noqa: F401 - fixtures

ENV = {"width": 224, "height": 168}


def _chats(n: int, env_kw=ENV):
    """Agent prompts of different lengths: 0 to 3 earlier steps in memory (1 to 4 screenshots)."""
    from agent.memory import Memory, MemoryStep
    from agent.policies.base import build_prompt
    from trainer.episodes import frame_of
    from trainer.sandbox.env import SandboxEnv

    env = SandboxEnv(**env_kw)
    chats = []
    try:
        for k in range(n):
            obs, info = env.reset(seed=k, options={"family": ("radio", "click_button", "check_boxes")[k % 3]})
            mem = Memory()
            for _ in range(k % 4):
                mem.add(MemoryStep("looking around", [], frame_of(obs)))
                obs, *_ = env.step("Thought: try\nAction: click(start_box='(30,40)')")
            chats.append(mem.build_messages(build_prompt(info["instruction"], ("desktop",)), frame_of(obs),
                                            space=env.coords_space))
    finally:
        env.close()
    return chats


def test_batch_inputs_equal_the_processors_own(tiny_any_dir):  # noqa: F811
    import torch

    from agent.vlm import build_inputs, load_processor
    from agent.vlm_batch import ImageCache, build_batch_inputs

    proc = load_processor(tiny_any_dir)
    chats = _chats(4)
    cache = ImageCache()
    rows, keys = build_batch_inputs(proc, chats, cache)
    for row, chat, ks in zip(rows, chats, keys):
        ref = build_inputs(proc, chat, add_generation_prompt=True)
        assert set(ref) == set(row)
        for k in ref:
            assert torch.equal(ref[k], row[k]), k
        assert len(ks) == int(ref["image_grid_thw"].shape[0])
    # the screenshots of the earlier steps come back in later chats: each was processed once
    assert cache.misses == len(cache) < sum(len(ks) for ks in keys)


def test_batched_greedy_generation_matches_batch_of_one(tiny_any_dir, one_thread):  # noqa: F811
    """Rows of different lengths (left padding) give the same greedy text and log-probs as each
    chat alone, with the image features cached or not."""
    from agent.vlm import generate, load_vlm
    from agent.vlm_batch import ImageCache, generate_batch

    model, proc = load_vlm(tiny_any_dir, device="cpu")
    chats = _chats(5)
    alone = [generate(model, proc, c, max_new_tokens=16, details=True) for c in chats]
    assert len({a.prompt_tokens for a in alone}) > 1  # the rows really differ in length
    cache = ImageCache()
    for _ in range(2):  # the second pass takes every screenshot's features from the cache
        batch = generate_batch(model, proc, chats, max_new_tokens=16, cache=cache)
        for a, b in zip(alone, batch):
            assert b.text == a.text
            assert b.token_ids == a.token_ids
            assert b.prompt_tokens == a.prompt_tokens
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    assert cache.hits > 0 and len(cache.features) == len(cache)


def test_sampled_batch_logprobs_are_the_models_own(tiny_vlm_dir, one_thread):  # noqa: F811
    """Sampled rows: the recorded log-prob of each token is what scoring the reply again gives
    (what PPO's behaviour log-probs must be), and a row stops at its own end token."""
    import torch

    from agent.vlm import action_logprobs, build_inputs, extend_inputs, load_vlm, stop_token_ids
    from agent.vlm_batch import generate_batch

    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    chats = _chats(4)
    gens = generate_batch(model, proc, chats, max_new_tokens=12, temperature=1.0, seed=3)
    stops = set(stop_token_ids(proc))
    for chat, g in zip(chats, gens):
        assert 1 <= len(g.token_ids) <= 12 and len(g.logprobs) == len(g.token_ids)
        assert not any(t in stops for t in g.token_ids[:-1])  # nothing after a stop token is kept
        full, target = extend_inputs(build_inputs(proc, chat, add_generation_prompt=True), g.token_ids)
        with torch.no_grad():
            again = action_logprobs(model, full, target, temperature=1.0)[target]
        assert torch.allclose(again, torch.tensor(g.logprobs), atol=1e-4)


def test_image_cache_is_bounded_and_forgets_features_when_weights_change(tiny_vlm_dir, tmp_path):  # noqa: F811
    from PIL import Image

    from agent.vlm import load_processor
    from agent.vlm_batch import ImageCache
    from trainer.actor import VLMActor
    from trainer.rollout import publish_weights

    proc = load_processor(tiny_vlm_dir)
    imgs = [Image.new("RGB", (56, 56), (k * 40, 0, 0)) for k in range(5)]
    cache = ImageCache(max_images=3)
    cache.prepare(proc, imgs[:3])
    cache.prepare(proc, imgs[3:])
    assert len(cache) == 3  # the two oldest went
    with pytest.raises(ValueError, match="max_images"):
        ImageCache(max_images=0)
    actor = VLMActor.load(tiny_vlm_dir)
    actor.generate_batch(_chats(1))
    assert actor.cache.features
    actor.load_weights(publish_weights(actor.model, tmp_path, 1))
    assert not actor.cache.features  # features of the old weights are gone; pixels stay
    assert len(actor.cache)


# ---------------------------------------------------------------- the runner


class ScriptedActor:
    """The model, scripted: per instruction keyword, the replies to give turn by turn."""

    def __init__(self, replies):
        self.replies, self.calls = replies, []

    def generate(self, messages, *, greedy=False):
        from trainer.actor import ActorOutput

        text = messages[1]["content"] if isinstance(messages[1]["content"], str) else ""
        asked = sum(1 for m in messages if m["role"] == "assistant") + sum(
            1 for m in messages if isinstance(m["content"], list) and any(p.get("text", "").startswith("Your previous")
                                                                           for p in m["content"] if p["type"] == "text"))
        self.calls.append(text)
        return ActorOutput(self.replies(text, asked))


def test_runner_resets_finished_slots_and_plays_every_ticket():
    """Two env processes, five tickets whose episodes end after 1, 3 or 2 turns: every ticket comes
    back in ticket order, with the same turns as a one-env run of it, and slots were reused."""
    from trainer.episodes import EpisodeRunner, run_episode
    from trainer.sandbox.env import SandboxEnv
    from trainer.sandbox.env_process import EnvProcess, make_envs

    def replies(_text, _asked):
        return "Thought: I am done.\nAction: finished(content='ok')"

    tickets = [(0, "radio"), (1, "click_button"), (2, "radio"), (3, "check_boxes"), (4, "click_button")]
    envs = make_envs(2, **ENV)
    assert all(isinstance(e, EnvProcess) for e in envs)
    try:
        runner = EpisodeRunner(ScriptedActor(replies), envs, max_steps=3)
        trajs = runner.run_all(tickets)
    finally:
        for e in envs:
            e.close()
    assert [(t.seed, t.family) for t in trajs] == tickets
    assert all(t.terminated and not t.truncated and len(t.turns) == 1 for t in trajs)
    assert runner.rounds == 3  # 5 one-turn episodes over 2 slots: slots refilled as episodes end
    env = SandboxEnv(**ENV)
    try:
        one = run_episode(ScriptedActor(replies), env, 3, family="check_boxes", max_steps=3)
    finally:
        env.close()
    assert one.instruction == trajs[3].instruction and [u.text for u in one.turns] == [u.text for u in trajs[3].turns]


def test_runner_parse_error_rule():
    """An unparseable reply is a turn: it counts toward the step limit and the next prompt carries
    feedback; with end_on_parse_error the episode ends there, failed."""
    from trainer.episodes import EpisodeRunner
    from trainer.sandbox.env_process import make_envs

    def replies(_text, asked):
        return "I think I should click" if asked == 0 else "Thought: done\nAction: finished(content='')"

    envs = make_envs(2, **ENV)
    try:
        tr = EpisodeRunner(ScriptedActor(replies), envs, max_steps=4).run_all([(0, "radio"), (1, "radio")])
        ended = EpisodeRunner(ScriptedActor(replies), envs, max_steps=4, end_on_parse_error=True).run_all([(0, "radio")])
    finally:
        for e in envs:
            e.close()
    for t in tr:
        assert len(t.turns) == 2 and t.turns[0].parse_error and t.turns[1].parse_error is None
        assert t.turns[0].action == "" and t.turns[1].action == "finished"
        feedback = [p["text"] for p in t.turns[1].messages[-1]["content"] if p["type"] == "text"]
        assert feedback and feedback[0].startswith("Your previous output could not be used")
    assert len(ended[0].turns) == 1 and ended[0].terminated and not ended[0].success


def test_an_action_the_env_cannot_perform_is_not_a_format_error():
    """A reply that parses but whose action cannot be done (a hotkey of modifiers only) is the
    agent's mistake, kept as action_error: it counts as parsed for the format rate and PPO's
    format penalty, and needs no re-ask."""
    from trainer.episodes import EpisodeRunner, summarize
    from trainer.sandbox.env_process import make_envs

    def replies(_text, asked):
        return "Thought: copy\nAction: hotkey(key='ctrl shift')" if asked == 0 else "Thought: done\nAction: finished(content='')"

    envs = make_envs(1, **ENV)
    try:
        (t,) = EpisodeRunner(ScriptedActor(replies), envs, max_steps=3).run_all([(0, "radio")])
    finally:
        for e in envs:
            e.close()
    first = t.turns[0]
    assert first.parse_error is None and "presses only modifiers" in first.action_error and first.action == "hotkey"
    assert summarize([t], ["radio"])["format_rate"] == 1.0
    feedback = [p["text"] for p in t.turns[1].messages[-1]["content"] if p["type"] == "text"]
    assert not any(f.startswith("Your previous output could not be used") for f in feedback)


def test_sandboxes_in_one_process_interfere_so_each_gets_its_own():
    """Qt's popups are per application: a combo box left open in one in-process sandbox swallows
    a click in another. In processes of their own they do not interfere."""
    from trainer.sandbox.env import SandboxEnv
    from trainer.sandbox.env_process import EnvProcess

    def tab_click_changes_screen(make) -> bool:
        a, b = make(), make()
        try:
            a.reset(seed=0, options={"family": "dropdown"})
            b.reset(seed=1000001, options={"family": "tabs"})
            _, action = a.expert_action()  # opens the combo box's popup
            a.step(action)
            _, action = b.expert_action()  # click the named tab
            return bool(b.step(action)[4]["screen_changed"])
        finally:
            a.close()
            b.close()

    assert not tab_click_changes_screen(lambda: SandboxEnv(**ENV))
    assert tab_click_changes_screen(lambda: EnvProcess(**ENV))


def test_env_process_errors_name_the_call():
    import os
    import signal

    from trainer.sandbox.env_process import EnvProcess, EnvProcessError

    env = EnvProcess(**ENV)
    try:
        with pytest.raises(EnvProcessError, match="reset failed.*nope"):
            env.reset(seed=0, options={"family": "nope"})
        obs, info = env.reset(seed=0, options={"family": "radio"})  # the env is still usable
        assert obs["screenshot"].shape == (168, 224, 3)
        os.kill(env.proc.pid, signal.SIGKILL)
        env.proc.join(timeout=5)
        with pytest.raises(EnvProcessError, match="died during step|is gone"):
            env.step("Thought: x\nAction: wait()")
    finally:
        env.close()
    with pytest.raises(EnvProcessError, match="start failed.*family"):
        EnvProcess(families=["no_such_family"])
