"""The tiny local Qwen2.5-VL (built here, nothing downloaded) drives the real loop against the
fake phone. Its random weights write garbage: the point is that garbage is re-asked, never
executed, recorded, and that the run ends cleanly."""
from __future__ import annotations

import pytest

from agent.executors.android import AndroidExecutor
from agent.grammar import parse_response
from agent.policies import LocalVLMPolicy, PolicyError
from agent.run.loop import AgentLoop, LoopConfig
from tests.fake_android import FakePhoneServer, connect_fake

INPUT_RPCS = {"click", "swipe", "pressKey", "pasteClipboard", "setClipboard", "injectInputEvent", "drag"}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from trainer.learn.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def test_tiny_model_drives_the_loop(tiny_dir, store):
    policy = LocalVLMPolicy(tiny_dir, platform="android", max_new_tokens=24, temperature=1.0, seed=0)
    with FakePhoneServer() as server:
        ex = AndroidExecutor(connect_fake(server), settle=0, wait_seconds=0.01)
        loop = AgentLoop(policy, ex, store=store, config=LoopConfig(max_steps=3, max_reasks=2))
        res = loop.run("Type hello into the text field")
        ex.close()
        calls = [c for c in server.phone.calls if c[0] in INPUT_RPCS]
    assert policy.last_generation is not None and policy.last_generation.prompt_tokens > 50  # prompt + screenshot went in
    ep = store.load_episode(res.episode.id)
    assert ep.meta["end_reason"] == res.reason
    failures = [f for s in ep.steps for f in s.info.get("parse_failures", [])] + ep.meta.get("unexecuted", {}).get("parse_failures", [])
    for s in ep.steps:  # everything executed came from output that parses
        assert parse_response(s.raw_response), s.raw_response
    for f in failures:  # everything that did not parse is kept with its reason, and was not executed
        assert not parse_response(f["raw"]) or "outside" in f["reason"] or "not available" in f["reason"]
    if not ep.steps:
        assert res.reason.startswith("unparseable output 3 times") and calls == []
    assert len(calls) <= 2 * len(ep.steps)  # no input beyond what the recorded steps did
    assert failures or ep.steps


def test_missing_model_dir_is_a_clear_policy_error(tmp_path):
    from agent.executors.base import frame_from_image_bytes
    from agent.policies.memory import Memory
    from tests.factories import screenshot_png

    policy = LocalVLMPolicy(tmp_path / "nope")
    with pytest.raises(PolicyError, match="nope"):
        policy.propose("x", Memory(), frame_from_image_bytes(screenshot_png()))


def test_the_default_model_keeps_the_last_step_and_acts_the_same(tmp_path):
    """Driving a sandbox task with the shipped default model: keeping the last step's keys and
    values (and the screenshots' features) gives the same greedy steps as recomputing every
    prompt, and from the second step on a growing part of each prompt is not computed again."""
    from agent import coords
    from agent.storage.model_files import DEFAULT_MODEL_DIR
    from agent.storage.store import Store
    from app.sandbox_executor import SandboxProcessExecutor

    runs, reused = {}, []
    for keep in (True, False):
        policy = LocalVLMPolicy(str(DEFAULT_MODEL_DIR), space=coords.SMART_RESIZE, max_new_tokens=64, keep_turns=keep)
        if keep:  # record what each step reused
            generate = policy.generate

            def generate_and_count(messages, generate=generate, policy=policy):
                text = generate(messages)
                reused.append((policy.cache.last_reused[0], policy.last_generation.prompt_tokens))
                return text

            policy.generate = generate_and_count
        ex = SandboxProcessExecutor("check_boxes", 11)
        store = Store(tmp_path / f"data-{keep}")
        try:
            res = AgentLoop(policy, ex, store=store, config=LoopConfig(max_steps=4, max_reasks=1)).run(
                "Tick the boxes the task asks for")
            runs[keep] = [s.raw_response for s in store.load_episode(res.episode.id).steps]
        finally:
            ex.close()
            store.close()
    assert len(runs[True]) >= 3 and runs[True] == runs[False]
    assert reused[0][0] == 0  # nothing kept before the first step
    # a step in history shows its element list, not the screenshot and list it was asked with, so a
    # prompt extends the last one up to that step: measured 310 of 781, 508 of 978, 706 of 1176 tokens
    assert all(r > 0.35 * n for r, n in reused[1:3])
    assert all(a[0] < b[0] for a, b in zip(reused[1:], reused[2:], strict=False))  # each step reuses more than the last
