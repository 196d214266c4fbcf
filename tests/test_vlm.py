"""agent.vlm.model on the tiny Qwen2.5-VL and Qwen3-VL built by trainer.learn.tiny_model: loading, inputs, generation,
assistant masks, log-probs, and real AdamW steps that lower the loss."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time

import pytest

from agent.grammar import parse_response, system_prompt
from agent.vlm import model as vlm
from tests.conftest import ROOT
from tests.vlm_fixtures import TIMINGS, one_thread, tiny_qwen3_dir, tiny_vlm_dir  # noqa: F401  (fixtures)

pytestmark = pytest.mark.usefixtures("one_thread")

ANSWER_1 = "Thought: The OK button is at the top left; I click it.\nAction: click(start_box='(70,40)')"
ANSWER_2 = "Thought: Now I type the greeting.\nAction: type(content='hello\\n')"


def screenshot(w=320, h=200, color=(230, 235, 240)):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (w, h), color)
    d = ImageDraw.Draw(img)
    d.rectangle([20, 20, 120, 60], outline=(0, 0, 0), fill=(200, 210, 255))
    d.text((30, 32), "OK", fill=(0, 0, 0))
    return img


def chat(*answers, instruction="Press OK then type hello"):
    """system, prompt, then (screenshot, answer) pairs, ending with a screenshot to answer."""
    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": system_prompt(instruction, "desktop")}]
    for i, a in enumerate(answers):
        msgs.append({"role": "user", "content": [{"type": "image", "image": screenshot(color=(200 + 10 * i, 230, 240))}]})
        msgs.append({"role": "assistant", "content": a})
    msgs.append({"role": "user", "content": [{"type": "image", "image": screenshot(color=(240, 240, 200))},
                                             {"type": "text", "text": "What next?"}]})
    return msgs


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def tiny(request):
    """(model, processor) of each tiny model class in turn: Qwen2.5-VL, then Qwen3-VL."""
    model_dir = request.getfixturevalue("tiny_vlm_dir" if request.param == "qwen2_5_vl" else "tiny_qwen3_dir")
    model, processor = vlm.load_vlm(model_dir)
    return model, processor


def test_importing_vlm_does_not_import_torch():
    code = "import sys, agent.vlm.model; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_tiny_directory_is_a_small_standard_checkpoint(tiny):
    from pathlib import Path

    model, processor = tiny
    model_dir = Path(model.name_or_path)
    names = {p.name for p in model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", "generation_config.json"} <= names
    size = sum(p.stat().st_size for p in model_dir.iterdir())
    assert size < 12 * 2**20, f"tiny checkpoint is {size / 2**20:.1f} MiB"
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] in ("qwen2_5_vl", "qwen3_vl")
    text = config["text_config"]
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    assert sum(text["rope_parameters"]["mrope_section"]) == head_dim // 2
    assert type(model).__name__ == vlm.SUPPORTED_MODEL_TYPES[config["model_type"]]
    assert json.loads((model_dir / "processor_config.json").read_text())["processor_class"] == \
        vlm.STOCK_PROCESSORS[config["model_type"]]
    if config["model_type"] == "qwen3_vl":  # learned absolute positions in the vision tower
        assert config["vision_config"]["num_position_embeddings"] > 0
    assert str(model.device) == "cpu" and str(model.dtype) == "torch.float32"
    tok = processor.tokenizer
    assert 500 < len(tok) <= 4096
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"):
        assert tok.convert_tokens_to_ids(special) != tok.unk_token_id, special
        assert len(tok(special)["input_ids"]) == 1, special
    assert config["image_token_id"] == tok.convert_tokens_to_ids("<|image_pad|>")
    # trained on the grammar: an action line takes few tokens and round-trips exactly
    ids = tok(ANSWER_1)["input_ids"]
    assert len(ids) < len(ANSWER_1) / 2.5
    assert tok.decode(ids) == ANSWER_1


@pytest.mark.parametrize("w,h", [(320, 200), (1280, 800), (100, 700), (60, 40)])
def test_image_token_count_matches_the_inputs(tiny, w, h):
    _, processor = tiny
    msgs = [{"role": "user", "content": [{"type": "image", "image": screenshot(w, h)}]}]
    inputs = vlm.build_inputs(processor, msgs)
    n_pad = int((inputs["input_ids"] == processor.image_token_id).sum())
    assert vlm.image_token_count(processor, w, h) == n_pad
    assert int(inputs["mm_token_type_ids"].sum()) == n_pad  # image tokens are typed 1
    t, gh, gw = inputs["image_grid_thw"][0].tolist()
    rw, rh = vlm.resized_image_size(processor, w, h)
    assert (t, gh * 14, gw * 14) == (1, rh, rw)
    assert rw * rh <= 224 * 224
    assert set(inputs) == {"input_ids", "attention_mask", "pixel_values", "image_grid_thw", "mm_token_type_ids"}


def test_generate_is_a_deterministic_string(tiny):
    import torch

    model, processor = tiny
    msgs = chat()
    greedy = vlm.generate(model, processor, msgs, max_new_tokens=24)
    assert isinstance(greedy, str) and greedy == vlm.generate(model, processor, msgs, max_new_tokens=24)
    rng = torch.get_rng_state()
    a = vlm.generate(model, processor, msgs, max_new_tokens=24, temperature=1.0, seed=7, details=True)
    b = vlm.generate(model, processor, msgs, max_new_tokens=24, temperature=1.0, seed=7, details=True)
    assert torch.equal(rng, torch.get_rng_state())  # a seeded call leaves the global RNG alone
    assert a.token_ids == b.token_ids and a.text == b.text and a.logprobs == b.logprobs
    others = [vlm.generate(model, processor, msgs, max_new_tokens=24, temperature=1.0, seed=s) for s in (8, 9)]
    assert any(o != a.text for o in others)
    assert len(a.token_ids) == len(a.logprobs) > 0
    assert all(math.isfinite(x) and x <= 0 for x in a.logprobs)
    expected_prompt = vlm.build_inputs(processor, msgs)["input_ids"].shape[1]
    assert a.prompt_tokens == expected_prompt > 2 * vlm.image_token_count(processor, 320, 200)
    TIMINGS["generate_tok_s"] = a.tokens_per_second


def test_generation_logprobs_equal_a_rescoring_of_the_same_tokens(tiny):
    """What PPO relies on: log-probs recorded while sampling = log-probs recomputed later."""
    import torch

    model, processor = tiny
    g = vlm.generate(model, processor, chat(ANSWER_1), max_new_tokens=20, temperature=0.7, seed=1, details=True)
    full, target = vlm.extend_inputs(g.inputs, g.token_ids)
    assert int(target.sum()) == len(g.token_ids)
    with torch.no_grad():
        lp = vlm.action_logprobs(model, full, target, temperature=0.7)
    assert torch.allclose(lp[target], torch.tensor(g.logprobs), atol=1e-4)
    with torch.no_grad():
        lp1 = vlm.action_logprobs(model, full, target, temperature=1.0)
    assert not torch.allclose(lp1[target], lp[target], atol=1e-3)  # temperature is applied


def test_generate_never_emits_vision_placeholders(tiny):
    """An untrained model may favour <|image_pad|>; a reply holding one could not be scored
    again (the processor would look for an image behind it). generate suppresses them, and the
    reply still re-scores to the log-probs recorded while sampling."""
    import torch

    model, processor = tiny
    banned = vlm.vision_token_ids(processor)
    tok = processor.tokenizer
    assert tok.convert_tokens_to_ids("<|image_pad|>") in banned and tok.convert_tokens_to_ids("<|im_end|>") not in banned
    pad = tok.convert_tokens_to_ids("<|image_pad|>")

    def favour_vision(module, args, out):  # the model now puts almost all its mass on vision tokens
        out = out.clone()
        out[..., banned] += 50.0
        out[..., pad] += 10.0
        return out

    hook = model.lm_head.register_forward_hook(favour_vision)
    try:
        inputs = vlm.to_model(vlm.build_inputs(processor, chat()), model)
        with torch.no_grad():
            assert int(model(**inputs).logits[0, -1].argmax()) == pad  # unsuppressed, it would say <|image_pad|>
        for kw in ({"temperature": 0.0}, {"temperature": 1.0, "seed": 3}):
            g = vlm.generate(model, processor, chat(), max_new_tokens=12, details=True, **kw)
            assert g.token_ids and not set(g.token_ids) & set(banned), kw
            full, target = vlm.extend_inputs(g.inputs, g.token_ids)
            with torch.no_grad():
                lp = vlm.action_logprobs(model, full, target, temperature=kw["temperature"] or 1.0)
            assert torch.allclose(lp[target], torch.tensor(g.logprobs), atol=1e-4)
    finally:
        hook.remove()


def test_assistant_mask_covers_exactly_the_assistant_turns(tiny):
    model, processor = tiny
    msgs = chat(ANSWER_1, ANSWER_2)[:-1]  # ends with the second answer
    inputs = vlm.build_inputs(processor, msgs, assistant_mask=True)
    assert inputs["input_ids"].shape[1] == inputs["attention_mask"].shape[1] == inputs["assistant_mask"].shape[1]
    ids, mask = inputs["input_ids"][0], inputs["assistant_mask"][0]
    tok = processor.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    want = [tok(a)["input_ids"] + [im_end] for a in (ANSWER_1, ANSWER_2)]
    assert int(mask.sum()) == sum(len(w) for w in want)
    # the masked tokens are the two answers, each closed by <|im_end|>, in order, contiguous per turn
    idx = mask.nonzero().flatten().tolist()
    runs, start = [], idx[0]
    for a, b in zip(idx, idx[1:] + [None], strict=True):
        if b != a + 1:
            runs.append(ids[start:a + 1].tolist())
            start = b
    assert runs == want
    assert not mask[ids == processor.image_token_id].any()
    last = vlm.assistant_token_mask(processor, inputs["input_ids"], last_only=True)[0]
    assert ids[last].tolist() == want[1]
    # a prompt awaiting an answer has nothing to train on
    prompt = vlm.build_inputs(processor, chat(ANSWER_1)[:3], add_generation_prompt=True, assistant_mask=True)
    assert not prompt["assistant_mask"].any()


def test_action_logprobs_shapes_values_and_gradients(tiny):
    import torch

    model, processor = tiny
    inputs = vlm.build_inputs(processor, chat(ANSWER_1)[:-1], assistant_mask=True)
    mask = inputs["assistant_mask"]
    lp, ent = vlm.action_logprobs(model, inputs, mask, return_entropy=True)
    assert lp.shape == ent.shape == inputs["input_ids"].shape and lp.dtype == torch.float32
    assert torch.isfinite(lp).all() and (lp[mask] < 0).all() and (lp[~mask] == 0).all()
    vocab = len(processor.tokenizer)
    assert (ent[mask] > 0).all() and (ent[mask] <= math.log(model.config.text_config.vocab_size) + 1e-4).all()
    assert vocab <= model.config.text_config.vocab_size
    # the same numbers as a plain full-logits computation
    with torch.no_grad():
        logits = model(**vlm.to_model(inputs, model)).logits[0].float()
    ref = torch.log_softmax(logits[:-1], -1).gather(1, inputs["input_ids"][0, 1:, None]).squeeze(1)
    assert torch.allclose(lp[0, 1:][mask[0, 1:]], ref[mask[0, 1:]], atol=1e-5)
    model.zero_grad()
    (-lp.sum()).backward()
    assert model.lm_head.weight.grad.abs().sum() > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.model.visual.parameters())  # the image is in the graph
    model.zero_grad()
    bad = mask.clone()
    bad[0, 0] = True
    with pytest.raises(vlm.VLMError, match="position 0"):
        vlm.action_logprobs(model, inputs, bad)
    with pytest.raises(vlm.VLMError, match="does not match"):
        vlm.action_logprobs(model, inputs, mask[:, 1:])
    with pytest.raises(vlm.VLMError, match="no tokens"):
        vlm.action_logprobs(model, inputs, mask & False)


def test_a_padded_batch_scores_like_single_samples(tiny):
    """collate_inputs: samples of different lengths and image sizes, one text-only."""
    import torch

    model, processor = tiny
    samples = [
        vlm.build_inputs(processor, chat(ANSWER_1)[:-1], assistant_mask=True),
        vlm.build_inputs(processor, [{"role": "user", "content": [{"type": "image", "image": screenshot(500, 120)}]},
                                     {"role": "assistant", "content": ANSWER_2}], assistant_mask=True),
        vlm.build_inputs(processor, [{"role": "user", "content": "no screen"},
                                     {"role": "assistant", "content": ANSWER_2}], assistant_mask=True),
    ]
    pad = processor.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    batch = vlm.collate_inputs(samples, pad)
    lens = [s["input_ids"].shape[1] for s in samples]
    assert batch["input_ids"].shape == (3, max(lens)) and batch["image_grid_thw"].shape == (2, 3)
    assert batch["attention_mask"].sum(1).tolist() == lens and batch["assistant_mask"].dtype == torch.bool
    with torch.no_grad():
        lp = vlm.action_logprobs(model, batch, batch["assistant_mask"])
        for i, s in enumerate(samples):
            one = vlm.action_logprobs(model, s, s["assistant_mask"])
            assert torch.allclose(lp[i, : lens[i]], one[0], atol=1e-4), i
    with pytest.raises(vlm.VLMError, match="batch size"):
        vlm.collate_inputs([batch], pad)


def test_adamw_steps_lower_the_sft_loss(tiny_vlm_dir):  # noqa: F811
    """Real training: 20 AdamW steps on one (screenshot, prompt, action) sample."""
    import torch

    torch.manual_seed(0)
    model, processor = vlm.load_vlm(tiny_vlm_dir)  # a fresh copy: training changes it
    model.train()
    inputs = vlm.build_inputs(processor, chat(ANSWER_1)[:-1], assistant_mask=True)
    mask = inputs.pop("assistant_mask")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses, times = [], []
    for _ in range(20):
        t0 = time.perf_counter()
        loss = vlm.sft_loss(model, inputs, mask)
        opt.zero_grad()
        loss.backward()
        times.append(time.perf_counter() - t0)
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses)
    assert losses[0] > math.log(100)  # random weights: near-uniform over the vocabulary
    assert losses[-1] < 0.5 * losses[0], losses
    assert min(losses[-5:]) < min(losses[:5])
    model.eval()
    out = vlm.generate(model, processor, chat()[:-1] + [chat(ANSWER_1)[2]], max_new_tokens=40)
    TIMINGS["fwd_bwd_ms"] = 1000 * sorted(times)[len(times) // 2]
    TIMINGS["loss_first_last"] = (losses[0], losses[-1])
    TIMINGS["after_training"] = out
    print(f"\ntiny VLM: build {TIMINGS.get('build_s', float('nan')):.2f} s, generate "
          f"{TIMINGS.get('generate_tok_s', float('nan')):.0f} tok/s, forward+backward {TIMINGS['fwd_bwd_ms']:.1f} ms/sample, "
          f"loss {losses[0]:.2f} -> {losses[-1]:.3f}; after training: {out!r}")


def test_frames_from_memory_messages_work(tiny):
    """The neutral messages agent.policies.memory builds (image parts carry Frames) go straight in."""
    from agent.executors.base import frame_from_image_bytes
    from agent.policies.memory import Memory
    from tests.factories import screenshot_png

    model, processor = tiny
    frame = frame_from_image_bytes(screenshot_png(400, 300))
    msgs = Memory().build_messages(system_prompt("Press OK"), frame)
    inputs = vlm.build_inputs(processor, msgs)
    assert int((inputs["input_ids"] == processor.image_token_id).sum()) == vlm.image_token_count(processor, 400, 300)
    assert isinstance(vlm.generate(model, processor, msgs, max_new_tokens=4), str)


def test_bad_messages_are_clear_errors(tiny):
    _, processor = tiny
    with pytest.raises(vlm.VLMError, match="neither 'image' nor 'frame'"):
        vlm.build_inputs(processor, [{"role": "user", "content": [{"type": "image"}]}])
    with pytest.raises(vlm.VLMError, match="1 image parts but 2 images"):
        vlm.build_inputs(processor, [{"role": "user", "content": [{"type": "image"}]}], [screenshot(), screenshot()])
    with pytest.raises(vlm.VLMError, match="role must be"):
        vlm.build_inputs(processor, [{"role": "tool", "content": "x"}])
    with pytest.raises(vlm.VLMError, match="type must be"):
        vlm.build_inputs(processor, [{"role": "user", "content": [{"type": "audio"}]}])
    with pytest.raises(vlm.VLMError, match="empty"):
        vlm.build_inputs(processor, [])
    with pytest.raises(vlm.VLMError, match="message 0: expected a dict"):
        vlm.build_inputs(processor, ["hello"])
    with pytest.raises(vlm.VLMError, match="positive"):
        vlm.image_token_count(processor, 0, 10)


def test_load_errors_name_the_directory_and_what_is_missing(tmp_path, tiny_vlm_dir):  # noqa: F811
    with pytest.raises(vlm.VLMError, match="nope.*does not exist"):
        vlm.load_vlm(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(vlm.VLMError) as e:
        vlm.load_vlm(empty)
    msg = str(e.value)
    assert str(empty) in msg and "config.json" in msg and "weights" in msg and "tokenizer" in msg and "chat template" in msg
    half = tmp_path / "half"
    shutil.copytree(tiny_vlm_dir, half)
    (half / "model.safetensors").unlink()
    with pytest.raises(vlm.VLMError, match="missing weights") as e:
        vlm.load_vlm(half)
    assert "tokenizer" not in str(e.value)  # only what is actually missing
    other = tmp_path / "other"
    shutil.copytree(tiny_vlm_dir, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["model_type"] = "llama"
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(vlm.VLMError, match="'llama' is not supported"):
        vlm.load_vlm(other)
    with pytest.raises(vlm.VLMError, match="unknown dtype"):
        vlm.load_vlm(tiny_vlm_dir, dtype="float8")
    with pytest.raises(vlm.VLMError, match="unknown device"):
        vlm.load_vlm(tiny_vlm_dir, device="gpu7")
    broken = tmp_path / "broken"
    shutil.copytree(tiny_vlm_dir, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(vlm.VLMError, match="weights did not load"):
        vlm.load_vlm(broken)
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(vlm.VLMError, match="tokenizer or image processor did not load"):
        vlm.load_vlm(broken)


def test_ui_tars_file_layout_loads_the_same(tmp_path, tiny_vlm_dir):  # noqa: F811
    """UI-TARS-1.5-7B ships preprocessor_config.json and chat_template.json (older layout)."""
    d = tmp_path / "uitars"
    shutil.copytree(tiny_vlm_dir, d)
    image_proc = json.loads((d / "processor_config.json").read_text())["image_processor"]
    image_proc.update(processor_class="Qwen2_5_VLProcessor", min_pixels=3136, max_pixels=224 * 224)
    (d / "preprocessor_config.json").write_text(json.dumps(image_proc))
    (d / "processor_config.json").unlink()
    (d / "chat_template.json").write_text(json.dumps({"chat_template": (d / "chat_template.jinja").read_text()}))
    (d / "chat_template.jinja").unlink()
    model2, processor2 = vlm.load_vlm(d, dtype="fp32")
    model, processor = vlm.load_vlm(tiny_vlm_dir)
    assert type(processor2).__name__ == "ImageOnlyQwenVLProcessor"
    assert vlm.image_token_count(processor2, 1280, 800) == vlm.image_token_count(processor, 1280, 800)
    msgs = chat()
    assert vlm.generate(model2, processor2, msgs, max_new_tokens=12) == vlm.generate(model, processor, msgs, max_new_tokens=12)


def test_cli_builds_a_directory(tmp_path, capsys):
    from trainer.learn.tiny_model import main

    assert main([str(tmp_path / "m"), "--hidden", "64", "--layers", "1", "--vision-depth", "1", "--image-size", "112"]) == 0
    assert "parameters" in capsys.readouterr().out
    model, processor = vlm.load_vlm(tmp_path / "m")
    assert model.config.text_config.hidden_size == 64 and vlm.image_token_count(processor, 320, 200) <= 16
    assert main([str(tmp_path / "bad"), "--hidden", "100"]) == 2
    assert "multiple of 32" in capsys.readouterr().err


def test_grammar_corpus_parses():
    """The default corpus is real grammar: every example action line parses."""
    from trainer.learn.tiny_model import default_corpus

    texts = default_corpus()
    actions = [t for t in texts if t.startswith("Thought:")]
    assert len(actions) >= 12 * 10
    assert all(parse_response(t) for t in actions), [t for t in actions if not parse_response(t)][:3]
