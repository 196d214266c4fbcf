"""Typed text copied from the instruction (agent.vlm.typed_copy): the rule, the rewritten tokens and
their log-probs, PPO's behaviour for them, and the shipped default model typing a held-out task's
text through the one episode runner."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from agent.elements import Element
from agent.executors.base import Frame
from agent.grammar import parse_normalized
from agent.policies.base import build_prompt
from agent.policies.memory import Memory
from agent.schema import ScreenGeometry
from agent.vlm import typed_copy
from tests.vlm_fixtures import one_thread, tiny_vlm_dir  # noqa: F401

W, H = 336, 252
INSTRUCTION = "Enter 'it ship at draft' as the Username."


def test_the_type_content_becomes_the_nearest_quoted_string():
    reply = "Thought: I'll type 'world draft' into the Username field.\nAction: type(content='world draft')"
    new, at = typed_copy.copy_reply(reply, INSTRUCTION)
    assert new.endswith("type(content='it ship at draft')") and new[:at] == reply[:at]
    assert new.startswith("Thought: I'll type 'world draft'")  # the thought is the model's, as written
    two = "Fill in the form (Quantity '29'; Title 'Carol') and press Register."
    assert typed_copy.copy_reply("Action: type(content='Caro')", two)[0] == "Action: type(content='Carol')"
    assert typed_copy.copy_reply("Action: type(content='2')", two)[0] == "Action: type(content='29')"
    # a content that is already quoted, an instruction that quotes nothing, a reply that types nothing
    assert typed_copy.copy_reply("Action: type(content='Carol')", two) is None
    assert typed_copy.copy_reply("Action: type(content='abc')", "Type your name.") is None
    assert typed_copy.copy_reply("Action: click(start_box='(3,4)')", two) is None
    # an escaped quote in what the model wrote, and one the copy must escape
    assert typed_copy.copy_reply(r"Action: type(content='don\'t')", "Type 'dont' here.")[0] == \
        "Action: type(content='dont')"
    assert typed_copy.quoted("Search for 'Trent' and open the contact 'Trent Ritchie' or 'Trent'.") == \
        ["Trent", "Trent Ritchie"]
    assert typed_copy.quoted('Enter "Jerald" into the text field, then \'OK\'.') == ["Jerald", "OK"]  # MiniWoB++'s


def _chat(instruction):
    frame = Frame(ScreenGeometry.simple(W, H), pixels=np.full((H, W, 3), 235, np.uint8),
                  elements=[Element("textbox", "Username", (100, 40, 300, 68))])
    return Memory().build_messages(build_prompt(instruction, ("desktop",)), frame)


@pytest.fixture(scope="module")
def processor(tiny_vlm_dir):  # noqa: F811
    from agent.vlm.model import load_vlm

    return load_vlm(tiny_vlm_dir)[1]


def test_the_rewritten_reply_keeps_its_prefix_logprobs_and_parses(processor):
    from agent.vlm.inputs import build_inputs

    tok = processor.tokenizer
    prompt = build_inputs(processor, _chat(INSTRUCTION), add_generation_prompt=True)["input_ids"][0].tolist()
    reply = "Thought: I'll type it.\nAction: type(content='world draft')<|im_end|>"
    rid = tok(reply, add_special_tokens=False)["input_ids"]
    lps = [-0.5 - 0.01 * i for i in range(len(rid))]
    ids, new_lps = typed_copy.apply_to_generation(tok, prompt, rid, lps)
    text = tok.decode(ids, skip_special_tokens=False)
    assert text == "Thought: I'll type it.\nAction: type(content='it ship at draft')<|im_end|>"
    assert ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")  # the stop token is the special one again
    k = typed_copy.copied_from(tok, prompt + ids, len(prompt))
    assert tok.decode(ids[k:], skip_special_tokens=True).endswith("it ship at draft')")  # from the content on
    assert ids[:k] == rid[:k] and new_lps[:k] == lps[:k]  # the model's own tokens keep their log-probs
    assert len(new_lps) == len(ids) and all(v == 0.0 for v in new_lps[k:])  # the forced ones carry 0
    parsed = parse_normalized(tok.decode(ids, skip_special_tokens=True), "smart_resize", W, H)
    assert parsed.actions[0].args["content"] == "it ship at draft"
    # nothing to copy: the generation is left as it was
    assert typed_copy.apply_to_generation(tok, prompt, tok("Action: type(content='it ship at draft')",
                                                           add_special_tokens=False)["input_ids"], [0.0] * 20) is None
    bare = build_inputs(processor, _chat("Type your name."), add_generation_prompt=True)["input_ids"][0].tolist()
    assert typed_copy.apply_to_generation(tok, bare, rid, lps) is None


def test_ppo_gives_the_copied_tokens_the_learners_logprobs_as_behaviour(tiny_vlm_dir, one_thread):  # noqa: F811
    from agent.vlm.inputs import build_inputs
    from agent.vlm.model import load_vlm
    from trainer.learn.ppo import behaviour_after_rewrite
    from trainer.learn.ppo_batch import Pack, build_turns, pack_logprobs
    from trainer.rollout.runner import Trajectory, Turn

    model, processor = load_vlm(tiny_vlm_dir)
    tok = processor.tokenizer
    messages = _chat(INSTRUCTION)
    prompt = build_inputs(processor, messages, add_generation_prompt=True)["input_ids"][0].tolist()
    rid = tok("Thought: I'll type it.\nAction: type(content='world')<|im_end|>", add_special_tokens=False)["input_ids"]
    ids, lps = typed_copy.apply_to_generation(tok, prompt, rid, [-9.0] * len(rid))
    turn = Turn(messages, ids, lps, tok.decode(ids, skip_special_tokens=True))
    tb, = build_turns([Trajectory(1, "type_text", INSTRUCTION, [turn])], processor)
    with torch.no_grad():
        tb.old_lp = pack_logprobs(model, Pack.build([tb], 0), temperature=1.0)
    before = tb.behaviour_lp.clone()
    k = tb.copied
    assert k is not None and k == typed_copy.copied_from(tok, prompt + ids, len(prompt))
    assert behaviour_after_rewrite(tb) == len(ids) - k
    assert torch.equal(tb.behaviour_lp[k:], tb.old_lp[k:]) and torch.equal(tb.behaviour_lp[:k], before[:k])
    # a reply that types what the instruction does not quote keeps every recorded log-prob
    other = tok("Action: type(content='zzz')<|im_end|>", add_special_tokens=False)["input_ids"]
    tb2, = build_turns([Trajectory(1, "type_text", "Type your name.",
                                   [Turn(_chat("Type your name."), other, [-1.0] * len(other), "")])], processor)
    tb2.old_lp = torch.zeros(len(other))
    assert tb2.copied is None and behaviour_after_rewrite(tb2) == 0


@pytest.mark.parametrize("path", ["batched", "agent", "agent-one-shot"])
def test_the_default_model_types_the_instructions_text_on_held_out_tasks(path, one_thread):  # noqa: F811
    """The shipped model on held-out type_text tasks, through the runner and the sandbox, in the
    rollouts' batched generation and in the agent's policy (Drive, Supervise: one chat at a time,
    with its kept turns or through agent.vlm.model.generate):
    every type action it takes writes the instruction's quoted text (before the copy: other fields'
    words)."""
    from agent.policies import LocalVLMPolicy
    from agent.storage.model_files import DEFAULT_MODEL_DIR
    from trainer.rollout.actors import PolicyActor, VLMActor
    from trainer.rollout.runner import play
    from trainer.sandbox.env_process import make_envs
    from trainer.sandbox.task import HELDOUT_START

    if path == "batched":
        actor = VLMActor.load(DEFAULT_MODEL_DIR, max_new_tokens=64)
    else:
        policy = LocalVLMPolicy(str(DEFAULT_MODEL_DIR), platform="sandbox", max_new_tokens=64,
                                keep_turns=path == "agent")
        actor = PolicyActor(policy)
    envs = make_envs(2 if path == "batched" else 1, width=W, height=H, observation="elements")
    try:
        trajs = play(actor, [(HELDOUT_START + k, "type_text") for k in range(4)], envs=envs, greedy=True)
    finally:
        for e in envs:
            e.close()
        if path != "batched":
            policy.close()
    typed = [(t.instruction, a.args["content"]) for t in trajs for u in t.turns for a in u.actions if a.name == "type"]
    assert typed, "the model typed nothing in 4 type_text episodes"
    assert all(f"'{content}'" in instruction for instruction, content in typed), typed
