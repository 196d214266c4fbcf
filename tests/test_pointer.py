"""The element-list pointer (agent.vlm.pointer): where its keys and queries are, the reply it writes,
its log-probabilities under PPO (against a softmax computed by hand), its SFT loss, and the side
file it is saved in."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from agent.elements import Element, ElementError, elements_from_dicts, format_lines, parse_block
from agent.executors.base import Frame
from agent.grammar import parse_normalized
from agent.policies.base import build_prompt
from agent.policies.memory import Memory, MemoryStep
from agent.schema import Action, ScreenGeometry
from agent.vlm import pointer
from tests.vlm_fixtures import one_thread, tiny_vlm_dir  # noqa: F401

W, H = 336, 252
ELEMENTS = [Element("button", "Save", (10, 40, 80, 68)), Element("button", "Paste", (100, 40, 170, 68)),
            Element("checkbox", "Dark mode", (10, 80, 120, 108), ("checked",))]


def frame(elements=ELEMENTS):
    return Frame(ScreenGeometry.simple(W, H), pixels=np.full((H, W, 3), 235, np.uint8), elements=elements)


def chat(instruction="Click 'Paste'.", memory=None, elements=ELEMENTS):
    return (memory or Memory()).build_messages(build_prompt(instruction, ("desktop",)), frame(elements))


@pytest.fixture(scope="module")
def model_and_processor(tiny_vlm_dir):  # noqa: F811
    from agent.vlm.model import load_vlm

    torch.manual_seed(0)
    model, processor = load_vlm(tiny_vlm_dir)
    pointer.attach(model)
    return model, processor


# ---------------------------------------------------------------- the list as text


def test_list_lines_round_trip_and_bad_elements_are_named():
    text = format_lines(ELEMENTS, "smart-resize", W, H)
    entries = parse_block("some prompt\n" + text)
    assert [(e.role, e.name, e.box, e.states) for e in entries] == [
        ("button", "Save", (10, 40, 80, 68), ()), ("button", "Paste", (100, 40, 170, 68), ()),
        ("checkbox", "Dark mode", (10, 80, 120, 108), ("checked",))]
    assert entries[1].center == (135, 54)
    with pytest.raises(ElementError, match=r"elements\[1\]: 'box'"):
        elements_from_dicts([{"role": "button", "name": "a", "box": [0, 0, 1, 1]}, {"role": "button", "box": [1, 2]}])
    # a name with a quote cannot break the line grammar
    odd = format_lines([Element("button", "Don't save", (0, 0, 10, 10))], "smart-resize", W, H)
    assert parse_block(odd)[0].name == "Don\u2019t save"


def test_memory_shows_the_current_list_and_history_keeps_list_or_screenshot():
    mem = Memory()
    mem.add(MemoryStep("I'll click 'Save'.", [Action("click", {"start_box": (0.13, 0.21)})], frame()))
    msgs = mem.build_messages(build_prompt("Click 'Paste'.", ("desktop",)), frame())
    images = [p for m in msgs if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image"]
    assert len(images) == 1  # the history step shows its list, not its screenshot too
    texts = [m["content"] for m in msgs if isinstance(m["content"], str)]
    assert any(t.startswith("Elements:\n[0] button 'Save'") for t in texts)
    assert msgs[-1]["content"][1]["text"].startswith("Elements:")
    shots = Memory(history_view="screenshots")
    shots.add(MemoryStep("", [Action("click", {"start_box": (0.1, 0.1)})], frame()))
    msgs = shots.build_messages("go", frame())
    assert sum(1 for m in msgs if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image") == 2


# ---------------------------------------------------------------- layout, rewrite


def test_layout_finds_entries_and_the_click_site(model_and_processor):
    from agent.vlm.inputs import build_inputs, extend_inputs

    model, processor = model_and_processor
    tok = processor.tokenizer
    prompt = build_inputs(processor, chat(), add_generation_prompt=True)
    reply = "Thought: I'll click 'Paste'.\nAction: click(start_box='(5,7)')"
    full, _ = extend_inputs(prompt, tok(reply, add_special_tokens=False)["input_ids"])
    ids = full["input_ids"][0].tolist()
    lay = pointer.layout(tok, ids, prompt["input_ids"].shape[1])
    assert [e.name for e in lay.entries] == ["Save", "Paste", "Dark mode"]
    texts = pointer.token_texts(tok, ids)
    assert all(texts[k].strip().endswith(e.name[-1]) for k, e in zip(lay.keys, lay.entries, strict=True))
    (site,) = lay.sites
    assert texts[site.query].endswith("(") and site.written == "5,7" and site.names == ["Paste"]
    assert lay.named == [0.0, 1.0, 0.0]  # the instruction "Click 'Paste'." names entry 1
    pointer.label_choices(lay)
    assert site.choice == lay.none  # (5,7) lies in no entry
    assert pointer.snap_reply("Action: click(start_box='(120,50)')", lay.entries) == "Action: click(start_box='(135,54)')"


def test_the_chosen_entry_is_written_as_its_centre_and_parses(model_and_processor):
    model, processor = model_and_processor
    tok = processor.tokenizer
    from agent.vlm.inputs import build_inputs

    prompt_ids = build_inputs(processor, chat(), add_generation_prompt=True)["input_ids"][0].tolist()
    reply = "Thought: I'll click 'Paste'.\nAction: click(start_box='(5,7)')"
    rid = tok(reply, add_special_tokens=False)["input_ids"]
    lay = pointer.layout(tok, prompt_ids + rid, len(prompt_ids))
    ids, lps = pointer.rewrite(tok, lay, len(prompt_ids), rid, [-0.5] * len(rid), [1], [-0.25])
    text = tok.decode(ids, skip_special_tokens=True)
    assert text.endswith("click(start_box='(135,54)')")
    parsed = parse_normalized(text, "smart-resize", W, H)
    assert parsed and parsed.actions[0].args["start_box"][:2] == pytest.approx((135 / W, 54 / H), abs=1e-3)
    first = lay.sites[0].query + 1 - len(prompt_ids)
    assert lps[first] == -0.25 and lps[first + 1: first + 6] == [0.0] * 5 and lps[:first] == [-0.5] * first
    # "no entry": the model's own digits stay, the choice's log-prob joins the first one's
    ids2, lps2 = pointer.rewrite(tok, lay, len(prompt_ids), rid, [-0.5] * len(rid), [lay.none], [-1.0])
    assert ids2 == rid and lps2[first] == -1.5


# ---------------------------------------------------------------- PPO: a hand-computed softmax


def test_ppo_logprob_of_a_pointer_choice_is_the_heads_softmax(model_and_processor, one_thread):  # noqa: F811
    from agent.vlm.inputs import build_inputs, extend_inputs, to_model
    from trainer.learn.ppo_batch import Pack, build_turns, pack_logprobs
    from trainer.rollout.runner import Trajectory, Turn

    model, processor = model_and_processor
    tok = processor.tokenizer
    messages = chat()
    prompt_ids = build_inputs(processor, messages, add_generation_prompt=True)["input_ids"][0].tolist()
    reply = "Thought: I'll click 'Paste'.\nAction: click(start_box='(5,7)')<|im_end|>"
    rid = tok(reply, add_special_tokens=False)["input_ids"]
    lay = pointer.layout(tok, prompt_ids + rid, len(prompt_ids))
    ids, lps = pointer.rewrite(tok, lay, len(prompt_ids), rid, [0.0] * len(rid), [1], [0.0])
    turn = Turn(messages, ids, lps, tok.decode(ids, skip_special_tokens=True), pointer=[1])
    tb, = build_turns([Trajectory(1, "click_button", "Click 'Paste'.", [turn])], processor)
    assert tb.pointer is not None and tb.pointer.sites[0].choice == 1
    lp = pack_logprobs(model, Pack.build([tb], 0), temperature=1.0)

    # by hand: the last hidden states, the head's projections, the copy feature, a softmax
    prompt = build_inputs(processor, messages, add_generation_prompt=True)
    full, target = extend_inputs(prompt, ids)
    with torch.no_grad():
        hidden = model(**to_model(full, model), output_hidden_states=True).hidden_states[-1][0]
    head = pointer.head_of(model)
    lay2 = tb.pointer
    site = lay2.sites[0]
    q = hidden[site.query] @ head.q.weight.T + head.q.bias
    scores = []
    emb = model.get_input_embeddings().weight.detach()
    paste = emb[torch.tensor(tok("Paste", add_special_tokens=False)["input_ids"])].mean(0)
    for key, e in zip(lay2.keys, lay2.entries, strict=True):
        k = hidden[key] @ head.k.weight.T + head.k.bias
        name = emb[torch.tensor(tok(e.name, add_special_tokens=False)["input_ids"])].mean(0)
        cos = float(torch.dot(paste, name) / (paste.norm() * name.norm()))
        named = 1.0 if e.name == "Paste" else 0.0  # the instruction is "Click 'Paste'."
        scores.append(float((q @ k).detach()) / math.sqrt(q.numel()) + float(head.alpha.detach()) * cos
                      + float(head.beta.detach()) * named)
    scores.append(float(q @ head.none) / math.sqrt(q.numel()))
    expected = scores[1] - math.log(sum(math.exp(s) for s in scores))
    first = int(target[0].nonzero()[0])  # the flat lp starts at the reply's first token
    flat = site.digits[0] - first
    assert float(lp[flat]) == pytest.approx(expected, abs=1e-4)
    assert all(float(lp[d - first]) == 0.0 for d in site.digits[1:])  # forced digits carry nothing
    # the gradient reaches the head
    lp[flat].backward()
    assert head.q.weight.grad is not None and float(head.q.weight.grad.abs().sum()) > 0
    model.zero_grad(set_to_none=True)


def test_tokens_after_a_rewritten_site_take_the_proximal_logprob_as_behaviour(model_and_processor, one_thread):  # noqa: F811
    # the actor sampled "')" after its own digits; the reply holds the entry's, so the log-probs it
    # recorded after the site describe another context: decoupled PPO must not weigh them by it
    from agent.vlm.inputs import build_inputs
    from trainer.learn.ppo import behaviour_after_rewrite
    from trainer.learn.ppo_batch import Pack, build_turns, pack_logprobs
    from trainer.rollout.runner import Trajectory, Turn

    model, processor = model_and_processor
    tok = processor.tokenizer
    messages = chat()
    prompt_ids = build_inputs(processor, messages, add_generation_prompt=True)["input_ids"][0].tolist()
    rid = tok("Thought: I'll click 'Paste'.\nAction: click(start_box='(5,7)')<|im_end|>", add_special_tokens=False)["input_ids"]
    lay = pointer.layout(tok, prompt_ids + rid, len(prompt_ids))
    for choice, rewritten in ((1, True), (lay.none, False)):
        ids, lps = pointer.rewrite(tok, lay, len(prompt_ids), rid, [-9.0] * len(rid), [choice], [-0.25])
        turn = Turn(messages, ids, lps, tok.decode(ids, skip_special_tokens=True), pointer=[choice])
        tb, = build_turns([Trajectory(1, "click_button", "Click 'Paste'.", [turn])], processor)
        with torch.no_grad():
            tb.old_lp = pack_logprobs(model, Pack.build([tb], 0), temperature=1.0)
        before = tb.behaviour_lp.clone()
        n = behaviour_after_rewrite(tb)
        site = tb.pointer.sites[0]
        after = site.digits[-1] + 1 - len(prompt_ids)  # the reply index of the token after the digits
        if rewritten:
            assert n == len(ids) - after and n >= 2  # "')" and the stop token
            assert torch.equal(tb.behaviour_lp[after:], tb.old_lp[after:])
            assert torch.equal(tb.behaviour_lp[:after], before[:after])  # the thought and the choice keep theirs
            assert float(before[after]) == -9.0 and float(tb.behaviour_lp[after]) != -9.0
        else:  # "no entry": the model's own digits stayed, so did the context
            assert n == 0 and torch.equal(tb.behaviour_lp, before)


# ---------------------------------------------------------------- SFT and the side file


def test_sft_teaches_the_pointer_the_demonstrated_entry(model_and_processor, tmp_path, one_thread):  # noqa: F811
    from agent.vlm.model import load_vlm, sft_loss
    from trainer.learn.sft import Sample, encode, save_checkpoint

    model, processor = model_and_processor
    # the demonstration clicks inside 'Dark mode' (not at its centre) under a thought naming nothing
    sample = Sample(chat("Switch the theme."), "Thought: I'll turn it on.\nAction: click(start_box='(20,90)')")
    enc = encode(processor, sample)
    lay = enc["pointer"]
    assert lay.sites[0].choice == 2 and lay.sites[0].written == "65,94"  # snapped to the entry's centre

    def choice_lp():
        from agent.vlm.model import action_logprobs

        with torch.no_grad():
            _, hidden = action_logprobs(model, enc, enc["assistant_mask"], return_hidden=True)
            return float(torch.log_softmax(pointer.site_logits(model, lay, hidden[0]), -1)[0, 2])

    before = choice_lp()
    head = pointer.head_of(model)
    opt = torch.optim.AdamW(list(model.parameters()), lr=3e-3)
    for _ in range(40):
        opt.zero_grad()
        sft_loss(model, enc, enc["assistant_mask"]).backward()
        opt.step()
    after = choice_lp()
    assert after > before + 0.3 and after > math.log(0.5)

    # generation: the reply's click is the chosen entry's centre, the choice recorded, and it parses
    from agent.vlm.model import generate

    g = generate(model, processor, sample.messages, max_new_tokens=40, details=True)
    assert g.pointer == [2], g.text
    assert g.text.endswith("click(start_box='(65,94)')") and len(g.logprobs) == len(g.token_ids)
    assert parse_normalized(g.text, "smart-resize", W, H)
    # the batched path (left padding, a cached prompt start, kept turns) chooses the same
    from agent.vlm.batch import ImageCache, generate_batch

    cache = ImageCache()
    other = chat("Switch the theme now.")
    for _ in range(2):  # the second call reuses each slot's kept turn
        gens = generate_batch(model, processor, [sample.messages, other], max_new_tokens=40, cache=cache, slots=[0, 1])
        assert gens[0].text == g.text and gens[0].pointer == [2] and gens[0].token_ids == g.token_ids
        assert gens[0].logprobs == pytest.approx(g.logprobs, abs=1e-4)

    save_checkpoint(model, processor, tmp_path / "ckpt")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "ckpt" / "model.safetensors"), "pt") as f:
        assert not any(k.startswith(pointer.ATTR) for k in f.keys())  # stock loaders never see the head
    assert (tmp_path / "ckpt" / pointer.HEAD_FILE).is_file()
    again, _ = load_vlm(tmp_path / "ckpt")
    assert torch.equal(pointer.head_of(again).q.weight, head.q.weight.detach())
    import transformers

    stock = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(str(tmp_path / "ckpt"))
    assert pointer.head_of(stock) is None
    (tmp_path / "ckpt" / pointer.HEAD_FILE).write_bytes(b"not a safetensors file")
    from agent.vlm.model import VLMError

    with pytest.raises(VLMError, match="pointer head did not load"):
        load_vlm(tmp_path / "ckpt")


def test_dpo_scores_a_click_by_the_pointer_and_moves_its_choice(model_and_processor, one_thread):  # noqa: F811
    """A supervisor's edit that moves a click from 'Save' to 'Paste': DPO's sequence log-prob is the
    reply's tokens with the pointer's log-softmax of the clicked entry in place of the digits it
    writes (as PPO scores it), so training on the pair moves the pointer's choice itself."""
    import copy

    from agent.vlm.model import action_logprobs
    from trainer.learn.dpo import DPOConfig, PreferencePair, sequence_logprob, train_dpo
    from trainer.learn.sft import Sample, encode

    model, processor = model_and_processor
    model = copy.deepcopy(model)  # the module's model stays as the other tests expect it
    msgs = chat("Paste the text.")
    chosen = Sample(msgs, "Thought: I paste it.\nAction: click(start_box='(120,50)')")   # inside 'Paste'
    rejected = Sample(msgs, "Thought: I paste it.\nAction: click(start_box='(30,50)')")  # inside 'Save'
    c, r = encode(processor, chosen), encode(processor, rejected)
    assert (c["pointer"].sites[0].choice, r["pointer"].sites[0].choice) == (1, 0)

    with torch.no_grad():  # by hand: every reply token but the site's digits, plus the head's choice
        lp, hidden = action_logprobs(model, c, c["assistant_mask"], return_hidden=True)
        lay = c["pointer"]
        lpp = torch.log_softmax(pointer.site_logits(model, lay, hidden[0]), -1)
        digits = lay.sites[0].digits
        want = float(lp.sum() - lp[0, digits].sum() + lpp[0, 1])
        assert float(sequence_logprob(model, c)) == pytest.approx(want, abs=1e-4)

    def prefers() -> float:  # the pointer's log-odds of 'Paste' over 'Save'
        with torch.no_grad():
            _, h = action_logprobs(model, c, c["assistant_mask"], return_hidden=True)
            out = torch.log_softmax(pointer.site_logits(model, c["pointer"], h[0]), -1)[0]
            return float(out[1] - out[0])

    before = prefers()
    res = train_dpo(model, processor, [PreferencePair(chosen, rejected, "ep", 0, "edit", "sam")],
                    DPOConfig(beta=0.5, lr=2e-3, batch_size=1, max_steps=10), progress=False)
    assert res["first_loss"] == pytest.approx(math.log(2), abs=1e-4) and res["last_loss"] < res["first_loss"] - 0.1
    assert res["last_accuracy"] == 1.0 and prefers() > before + 0.5
