"""Batched rollouts: one left-padded generate for many chats gives what each chat gets alone;
the one episode runner over several environments (each in its own process) resets finished
slots, keeps the parse-error rule, and plays the same episodes as one environment does."""
from __future__ import annotations

import pytest

from tests.vlm_fixtures import one_thread, tiny_any_dir, tiny_qwen3_dir, tiny_vlm_dir  # noqa: F401 - fixtures
from trainer.rollout.actors import Actor

ENV = {"width": 224, "height": 168, "observation": "pixels"}  # prompts that extend one another: what kept turns reuse


def _act(env, text: str):
    """A reply's actions, parsed as the runner parses them (the env takes actions, not text)."""
    from agent.grammar import parse_reply

    return list(parse_reply(text, env.coords_space, env.width, env.height, platforms=(env.platform,)).actions)


def _chats(n: int, env_kw=ENV):
    """Agent prompts of different lengths: 0 to 3 earlier steps in memory (1 to 4 screenshots)."""
    from agent.policies.base import build_prompt
    from agent.policies.memory import Memory, MemoryStep
    from trainer.rollout.runner import frame_of
    from trainer.sandbox.env import SandboxEnv

    env = SandboxEnv(**env_kw)
    chats = []
    try:
        for k in range(n):
            obs, info = env.reset(seed=k, options={"family": ("radio", "click_button", "check_boxes")[k % 3]})
            mem = Memory(history_view="screenshots")  # history screenshots: what the image cache is for
            for _ in range(k % 4):
                mem.add(MemoryStep("looking around", [], frame_of(obs)))
                obs, *_ = env.step(_act(env, "Thought: try\nAction: click(start_box='(30,40)')"))
            chats.append(mem.build_messages(build_prompt(info["instruction"], ("desktop",)), frame_of(obs),
                                            space=env.coords_space))
    finally:
        env.close()
    return chats


def test_batch_inputs_equal_the_processors_own(tiny_any_dir):  # noqa: F811
    import torch

    from agent.vlm.batch import ImageCache, build_batch_inputs
    from agent.vlm.model import build_inputs, load_processor

    proc = load_processor(tiny_any_dir)
    chats = _chats(4)
    cache = ImageCache()
    rows, keys = build_batch_inputs(proc, chats, cache)
    for row, chat, ks in zip(rows, chats, keys, strict=True):
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
    from agent.vlm.batch import ImageCache, generate_batch
    from agent.vlm.model import generate, load_vlm

    model, proc = load_vlm(tiny_any_dir, device="cpu")
    chats = _chats(5)
    alone = [generate(model, proc, c, max_new_tokens=16, details=True) for c in chats]
    assert len({a.prompt_tokens for a in alone}) > 1  # the rows really differ in length
    cache = ImageCache()
    for _ in range(2):  # the second pass takes every screenshot's features from the cache
        batch = generate_batch(model, proc, chats, max_new_tokens=16, cache=cache)
        for a, b in zip(alone, batch, strict=True):
            assert b.text == a.text
            assert b.token_ids == a.token_ids
            assert b.prompt_tokens == a.prompt_tokens
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    assert cache.hits > 0 and len(cache.features) == len(cache)


def test_sampled_batch_logprobs_are_the_models_own(tiny_vlm_dir, one_thread):  # noqa: F811
    """Sampled rows: the recorded log-prob of each token is what scoring the reply again gives
    (what PPO's behaviour log-probs must be), and a row stops at its own end token."""
    import torch

    from agent.vlm.batch import generate_batch
    from agent.vlm.model import action_logprobs, build_inputs, extend_inputs, load_vlm, stop_token_ids

    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    chats = _chats(4)
    gens = generate_batch(model, proc, chats, max_new_tokens=12, temperature=1.0, seed=3)
    stops = set(stop_token_ids(proc))
    for chat, g in zip(chats, gens, strict=True):
        assert 1 <= len(g.token_ids) <= 12 and len(g.logprobs) == len(g.token_ids)
        assert not any(t in stops for t in g.token_ids[:-1])  # nothing after a stop token is kept
        full, target = extend_inputs(build_inputs(proc, chat, add_generation_prompt=True), g.token_ids)
        with torch.no_grad():
            again = action_logprobs(model, full, target, temperature=1.0)[target]
        assert torch.allclose(again, torch.tensor(g.logprobs), atol=1e-4)


def test_image_cache_is_bounded_and_forgets_features_when_weights_change(tiny_vlm_dir, tmp_path):  # noqa: F811
    from PIL import Image

    from agent.vlm.batch import ImageCache
    from agent.vlm.model import load_processor
    from trainer.rollout.actors import VLMActor
    from trainer.rollout.pool import publish_weights

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


def _second_turns(env_kw=ENV):
    """Turn-1 prompts of three episodes, then the next call's prompts: episode 0 one step on (its
    screenshot and reply in memory, a new screenshot), episode 1 re-asked after a reply that did
    not parse (the same screenshot, feedback added), a fresh episode in slot 2, and a new slot 3."""
    from agent.policies.base import build_prompt
    from agent.policies.memory import Memory, MemoryStep
    from agent.run.loop import reask_feedback
    from agent.schema import Action
    from trainer.rollout.runner import frame_of
    from trainer.sandbox.env import SandboxEnv

    env = SandboxEnv(**env_kw)
    first, second = [], []
    try:
        for k, fam in enumerate(("radio", "click_button", "check_boxes")):
            obs, info = env.reset(seed=k, options={"family": fam})
            prompt, mem = build_prompt(info["instruction"], ("desktop",)), Memory()
            first.append(mem.build_messages(prompt, frame_of(obs), space=env.coords_space))
            if k == 0:
                mem.add(MemoryStep("I open it.", [Action("click", {"start_box": [30.0, 40.0]})], frame_of(obs)))
                obs, *_ = env.step(_act(env, "Thought: I open it.\nAction: click(start_box='(30,40)')"))
                second.append(mem.build_messages(prompt, frame_of(obs), space=env.coords_space))
            elif k == 1:
                second.append(mem.build_messages(prompt, frame_of(obs), space=env.coords_space,
                                                 feedback=reask_feedback("no Action line")))
        for seed in (7, 8):
            obs, info = env.reset(seed=seed, options={"family": "tabs"})
            second.append(Memory().build_messages(build_prompt(info["instruction"], ("desktop",)), frame_of(obs),
                                                   space=env.coords_space))
    finally:
        env.close()
    return first, second


def test_kept_turns_change_nothing_but_the_work(tiny_any_dir, one_thread):  # noqa: F811
    """With slots, each slot's last sequence is kept and the next call computes only what is new:
    the same greedy text and log-probs (1e-4) as a batch without kept turns, for a row one step
    on, a re-asked row, a fresh episode in a used slot and a new slot in one batch; the kept keys
    and values (prompt and reply) are what a fresh forward over those tokens computes."""
    import torch

    from agent.vlm.batch import ImageCache, generate_batch
    from agent.vlm.inputs import to_model
    from agent.vlm.model import build_inputs, extend_inputs, load_vlm

    model, proc = load_vlm(tiny_any_dir, device="cpu")
    first, second = _second_turns()
    cache = ImageCache()
    turn1 = generate_batch(model, proc, first, max_new_tokens=12, cache=cache, slots=[0, 1, 2])
    # what slot 0 keeps: its prompt and reply (but the last token, never fed back), as a fresh forward has them
    sig, kept = cache.turns[0]
    full, _ = extend_inputs(build_inputs(proc, first[0], add_generation_prompt=True), turn1[0].token_ids[:len(sig) - turn1[0].prompt_tokens])
    assert full["input_ids"].shape[1] == len(sig) > turn1[0].prompt_tokens
    with torch.no_grad():
        fresh = model(**to_model(full, model), use_cache=True).past_key_values
    for (k, v), layer in zip(kept, fresh.layers, strict=True):
        assert torch.allclose(k, layer.keys, atol=1e-4) and torch.allclose(v, layer.values, atol=1e-4)

    before = cache.reused_tokens
    reused = generate_batch(model, proc, second, max_new_tokens=12, cache=cache, slots=[0, 1, 2, 3])
    plain = generate_batch(model, proc, second, max_new_tokens=12)
    for a, b in zip(plain, reused, strict=True):
        assert b.token_ids == a.token_ids and b.text == a.text and b.prompt_tokens == a.prompt_tokens
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    # slot 0 reused its whole first prompt, slot 1 its prompt up to the feedback; the fresh episode
    # and the new slot start from the prompt start every row shares
    r = cache.last_reused
    assert r[0] == turn1[0].prompt_tokens and turn1[1].prompt_tokens - 8 <= r[1] < turn1[1].prompt_tokens
    assert 16 <= r[2] == r[3] < min(r[0], r[1]) - 50 and cache.reused_tokens - before == sum(r)
    with pytest.raises(ValueError, match="2 slots for 4 chats"):
        generate_batch(model, proc, second, cache=cache, slots=[0, 1])


def test_rows_reuse_what_makes_the_padded_batch_cheapest():
    """Every row of a batch is padded to the widest new part and the widest reused part, so a
    kept turn pays only when it narrows the new parts: with rows past a memory rewrite in the
    batch (their new part is long anyway) reusing would only pad every cache, and the rows keep
    to the shared prefix; when the rows that start fresh or continue all have short new parts,
    everything found is reused."""
    from types import SimpleNamespace

    from agent.vlm.batch import _cheapest_reuse, _layout_cost

    tiny = SimpleNamespace(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
    big = SimpleNamespace(hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4)
    # 6 fresh rows, 6 past a memory rewrite (a long new part), 4 one step on
    lengths, found = [430] * 6 + [1000] * 6 + [900] * 4, [300] * 12 + [780] * 4
    for config in (tiny, big):
        assert _cheapest_reuse(config, lengths, found, 300, 40) == [300] * 16
    # 8 fresh rows and 8 one step on: reusing narrows the new parts from 600 tokens to 130
    lengths, found = [430] * 8 + [900] * 8, [300] * 8 + [780] * 8
    for config in (tiny, big):
        assert _cheapest_reuse(config, lengths, found, 300, 40) == found
        assert _layout_cost(config, lengths, found, 40) < _layout_cost(config, lengths, [300] * 16, 40) / 2


# ---------------------------------------------------------------- the runner


class ScriptedActor(Actor):
    """The model, scripted: per instruction keyword, the replies to give turn by turn."""

    def __init__(self, replies):
        self.replies, self.calls = replies, []

    def generate(self, messages, *, greedy=False):
        from trainer.rollout.actors import ActorOutput

        text = messages[1]["content"] if isinstance(messages[1]["content"], str) else ""
        asked = sum(1 for m in messages if m["role"] == "assistant") + sum(
            1 for m in messages if isinstance(m["content"], list) and any(p.get("text", "").startswith("Your previous")
                                                                           for p in m["content"] if p["type"] == "text"))
        self.calls.append(text)
        return ActorOutput(self.replies(text, asked))


def test_runner_resets_finished_slots_and_plays_every_ticket():
    """Two env processes, five tickets whose episodes end after 1, 3 or 2 turns: every ticket comes
    back in ticket order, with the same turns as a one-env run of it, and slots were reused."""
    from trainer.rollout.runner import EpisodeRunner, run_episode
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
    """An unparseable reply is a turn (agent.run.reask's rule): it is not executed, it counts toward the
    step limit and the next prompt carries feedback; with end_on_parse_error the episode ends
    there, failed."""
    from trainer.rollout.runner import EpisodeRunner
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
    from trainer.rollout.runner import EpisodeRunner, summarize
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
            env.step(_act(env, "Thought: x\nAction: wait()"))
    finally:
        env.close()
    with pytest.raises(EnvProcessError, match="start failed.*family"):
        EnvProcess(families=["no_such_family"])
