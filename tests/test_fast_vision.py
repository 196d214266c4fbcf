"""agent.vlm.fast_vision: each saving gives the stock vision tower's outputs (fp32, within 1e-5)."""
from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch

from agent.vlm import batch as vbatch
from agent.vlm import fast_vision
from agent.vlm import model as vlm
from tests.conftest import ROOT
from tests.vlm_fixtures import one_thread, tiny_qwen3_dir, tiny_vlm_dir  # noqa: F401  (fixtures)

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = [(320, 200), (224, 224), (500, 130), (150, 400)]


def screenshot(w, h, seed=0):
    from PIL import Image, ImageDraw

    g = torch.Generator().manual_seed(seed)
    img = Image.new("RGB", (w, h), (230, 235, 240))
    d = ImageDraw.Draw(img)
    for _ in range(12):
        x, y = (torch.randint(0, max(w - 30, 1), (1,), generator=g).item(),
                torch.randint(0, max(h - 20, 1), (1,), generator=g).item())
        d.rectangle([x, y, x + 30, y + 18], fill=tuple(torch.randint(0, 255, (3,), generator=g).tolist()))
    return img


@pytest.fixture(scope="module")
def tiny(tiny_vlm_dir):  # noqa: F811
    model, processor = vlm.load_vlm(tiny_vlm_dir)
    return model, processor


def pixels(processor, images):
    out = processor.image_processor(images=images, return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


def tower_out(model, pv, grid, fast):
    tower = fast_vision.vision_tower(model)
    (fast_vision.install(model, force=True) if fast else fast_vision.uninstall(model))
    with torch.no_grad():
        return tower(pv, grid_thw=grid).pooler_output


def test_load_vlm_installs_it_and_the_env_var_turns_it_off(tiny, tiny_vlm_dir, tiny_qwen3_dir):  # noqa: F811
    model, _ = tiny
    assert fast_vision.vision_tower(model)._fast_vision
    code = ("import sys; from agent.vlm import model as vlm, fast_vision as fv; m, _ = vlm.load_vlm(sys.argv[1]);"
            "assert not getattr(fv.vision_tower(m), '_fast_vision', False)")
    env = dict(os.environ, TANDEM_FAST_VISION="0", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", code, str(tiny_vlm_dir)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    twin = fast_vision.vision_tower(copy.deepcopy(model))  # the PPO critic's copy: its own overrides and hooks
    assert twin.blocks[0].attn.forward.__self__ is twin.blocks[0].attn and len(twin._forward_pre_hooks) == 1
    fast_vision.uninstall(twin)
    assert not twin._forward_pre_hooks and "forward" not in twin.blocks[0].attn.__dict__
    assert len(fast_vision.vision_tower(model)._forward_pre_hooks) == 1  # the original untouched
    q3, _ = vlm.load_vlm(tiny_qwen3_dir)  # other classes keep the stock path
    assert fast_vision.vision_tower(q3) is None and not fast_vision.install(q3, force=True)


def test_processor_repeats_a_still_image_frame(tiny):
    _, processor = tiny
    pv, _ = pixels(processor, [screenshot(320, 200)])
    x = pv.view(pv.shape[0], 3, 2, -1)
    assert torch.equal(x[:, :, 0], x[:, :, 1])


@pytest.mark.parametrize("size", SIZES)
def test_patch_embedding_matches_conv3d(tiny, size):
    model, processor = tiny
    pe = fast_vision.vision_tower(model).patch_embed
    pv, _ = pixels(processor, [screenshot(*size)])
    with torch.no_grad():
        stock = pe.proj(pv.view(-1, 3, 2, 14, 14)).view(-1, pe.embed_dim)
        fast = fast_vision._patch_embed_forward(pe, pv)
    assert fast.shape == stock.shape and (fast - stock).abs().max() < 1e-5
    video = pv.clone()  # frames that differ: the stock Conv3d, still equal to it
    video.view(video.shape[0], 3, 2, -1)[:, :, 1] += 0.5
    with torch.no_grad():
        stock_v = pe.proj(video.view(-1, 3, 2, 14, 14)).view(-1, pe.embed_dim)
        assert torch.equal(fast_vision._patch_embed_forward(pe, video), stock_v)
    assert not torch.allclose(stock_v, stock)


def test_summed_kernel_follows_weight_updates(tiny):
    model, processor = tiny
    pe = copy.deepcopy(fast_vision.vision_tower(model).patch_embed)
    pv, _ = pixels(processor, [screenshot(224, 224)])
    with torch.no_grad():
        fast_vision._patch_embed_forward(pe, pv)
        pe.proj.weight.mul_(1.5)  # an optimizer step: in place
        stock = pe.proj(pv.view(-1, 3, 2, 14, 14)).view(-1, pe.embed_dim)
        assert (fast_vision._patch_embed_forward(pe, pv) - stock).abs().max() < 1e-5


def test_rotary_matches_stock(tiny):
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as m

    rot = fast_vision.vision_tower(model := tiny[0]).rotary_pos_emb
    pos = torch.stack(torch.meshgrid(torch.arange(12), torch.arange(20), indexing="ij"), -1).reshape(-1, 2)
    stock = m.Qwen2_5_VLVisionRotaryEmbedding.forward(rot, pos, pos)
    fast = fast_vision._rotary_forward(rot, pos, pos)
    for a, b in zip(stock, fast, strict=True):
        assert torch.equal(a, b)
    heads, hd = model.config.vision_config.num_heads, model.config.vision_config.hidden_size // 4
    qk = torch.randn(pos.shape[0], 2, heads, hd)
    want = m.apply_rotary_pos_emb_vision(qk[:, 0], qk[:, 1], *stock)
    got = fast_vision._rotate_qk(qk.clone(), *fast_vision._half_cos_sin(*fast))
    assert max((got[:, i] - want[i]).abs().max().item() for i in (0, 1)) < 1e-5


@pytest.mark.parametrize("size", SIZES)
def test_windowed_attention_matches_per_window_calls(tiny, size):
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as m

    model, processor = tiny
    tower = fast_vision.vision_tower(model)
    pv, grid = pixels(processor, [screenshot(*size)])
    window_index, cu_window = m.get_vision_window_index(grid, tower.spatial_merge_size, tower.window_size,
                                                        tower.patch_size)
    assert len(cu_window) > 2  # several windows, of more than one length for these sizes
    n = int(grid.prod())
    x = torch.randn(n, tower.config.hidden_size)
    pos = tower.rotary_pos_emb(x, m.get_vision_position_ids(grid, tower.spatial_merge_size))
    attn = tower.blocks[0].attn
    with torch.no_grad():
        stock = m.Qwen2_5_VLVisionAttention.forward(attn, x, cu_seqlens=cu_window, position_embeddings=pos)
        fast = fast_vision._attention_forward(attn, x, cu_seqlens=cu_window, position_embeddings=pos)
    assert (fast - stock).abs().max() < 1e-5
    odd = (pos[0] + torch.linspace(0, 1, pos[0].shape[-1]), pos[1])  # halves that differ: the stock path
    with torch.no_grad():
        assert torch.equal(fast_vision._attention_forward(attn, x, cu_seqlens=cu_window, position_embeddings=odd),
                           m.Qwen2_5_VLVisionAttention.forward(attn, x, cu_seqlens=cu_window, position_embeddings=odd))


def test_tower_matches_stock_on_a_batch_of_sizes(tiny):
    model, processor = tiny
    for images in ([screenshot(*s, seed=i) for i, s in enumerate(SIZES)], [screenshot(320, 200, seed=s) for s in range(3)]):
        pv, grid = pixels(processor, images)
        stock = tower_out(model, pv, grid, fast=False)
        fast = tower_out(model, pv, grid, fast=True)
        assert fast.shape == stock.shape and (fast - stock).abs().max() < 1e-5


def test_training_takes_the_stock_path_and_inference_the_fast_one(tiny):
    """With grad on (the learner, train_vision) the tower runs the stock code, whose memory the
    memory plan measures, and its gradients equal the uninstalled tower's; under no_grad (rollouts,
    evaluation) the savings run: their reused buffers appear."""
    model, processor = tiny
    tower = copy.deepcopy(fast_vision.vision_tower(model))
    pv, grid = pixels(processor, [screenshot(320, 200), screenshot(150, 400, seed=1)])
    fast_vision.install(tower, force=True)
    fast_vision._CTX.__dict__.pop("scratch", None)
    tower(pv, grid_thw=grid)
    assert not fast_vision._CTX.__dict__.get("scratch"), "a forward with grad on used the fast path"
    with torch.no_grad():
        tower(pv, grid_thw=grid)
    assert fast_vision._CTX.__dict__.get("scratch"), "an inference forward did not take the fast path"
    grads = []
    for fast in (False, True):
        (fast_vision.install(tower, force=True) if fast else fast_vision.uninstall(tower))
        tower.zero_grad()
        tower(pv, grid_thw=grid).pooler_output.pow(2).sum().backward()
        grads.append({k: p.grad.clone() for k, p in tower.named_parameters()})
    for k, g in grads[0].items():
        assert (grads[1][k] - g).abs().max() < 1e-4 * max(1.0, g.abs().max().item()), k


def test_greedy_generation_is_identical(tiny):
    model, processor = tiny
    chats = [[{"role": "user", "content": [{"type": "image", "image": screenshot(*s, seed=i)},
                                           {"type": "text", "text": "Click the OK button."}]}]
             for i, s in enumerate(SIZES)]
    texts = {}
    for fast in (False, True):
        (fast_vision.install(model, force=True) if fast else fast_vision.uninstall(model))
        single = [vlm.generate(model, processor, c, max_new_tokens=20) for c in chats[:2]]
        batched = vbatch.generate_batch(model, processor, chats, max_new_tokens=20)
        texts[fast] = (single, [getattr(g, "text", g) for g in batched])
    fast_vision.install(model, force=True)
    assert texts[True] == texts[False]
    assert all(texts[True][0]) or all(texts[True][1])  # something was generated
