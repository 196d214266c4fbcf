"""Exact savings for the Qwen2.5-VL vision tower, installed on a loaded model (load_vlm does).

The same outputs as transformers' stock path (to float rounding), with less work on a CPU:

- patch embedding: a still image's two temporal frames are equal (the image processor repeats
  the frame to fill temporal_patch_size), so the Conv3d is one matmul with the kernel's two
  temporal halves summed: half the FLOPs. Checked per call (torch.equal on the two halves);
  real video, whose frames differ, takes the stock Conv3d.
- attention: the windows of a windowed layer (and the images of a full-attention layer) are
  grouped by length and each group is one SDPA call over [n_windows, heads, len, dim], instead
  of one call per window; the output is written into one buffer instead of `cat`.
- rotary: cos/sin are prepared once per forward (the two halves of Qwen's cos/sin are equal,
  so one half is kept, shaped for broadcasting) and every block applies them in place to q and
  k together, without rotate_half's neg + cat and their allocations.

Qwen2.5-VL only; other classes (Qwen2-VL, Qwen3-VL) keep the stock path. Off with the
environment variable TANDEM_FAST_VISION=0 (for comparison), or `uninstall(model)`.
"""
from __future__ import annotations

import itertools
import os
import threading
import types

import torch
import torch.nn.functional as F

ENV = "TANDEM_FAST_VISION"

# the current tower forward's prepared rotary and attention plans, keyed by the tensors the stock
# tower passes every block (the same objects for the whole forward); thread-local so two
# threads' forwards never share one
_CTX = threading.local()


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def vision_tower(model):
    """The Qwen2.5-VL vision tower of a model (ForConditionalGeneration, the inner model, or the
    tower itself); None for any other class."""
    for cand in (model, getattr(model, "visual", None), getattr(getattr(model, "model", None), "visual", None)):
        if cand is not None and type(cand).__name__ == "Qwen2_5_VisionTransformerPretrainedModel":
            return cand
    return None


def install(model, force: bool = False) -> bool:
    """Installs the savings on `model`'s Qwen2.5-VL vision tower; True when installed. Nothing is
    done (False) for other model classes, for flash attention, or when TANDEM_FAST_VISION=0
    (unless `force`). Idempotent."""
    if not (force or enabled()):
        return False
    tower = vision_tower(model)
    if tower is None or getattr(tower.config, "_attn_implementation", "sdpa") not in ("sdpa", "eager", None):
        return False
    if getattr(tower, "_fast_vision", False):
        return True
    tower.patch_embed.forward = types.MethodType(_patch_embed_forward, tower.patch_embed)
    tower.rotary_pos_emb.forward = types.MethodType(_rotary_forward, tower.rotary_pos_emb)
    for blk in tower.blocks:
        blk.attn.forward = types.MethodType(_attention_forward, blk.attn)
    # module-level functions, not closures: a deepcopy of the model (the PPO critic) keeps working
    tower.register_forward_pre_hook(_begin_forward)
    tower.register_forward_hook(_end_forward)
    tower._fast_vision = True
    return True


def uninstall(model) -> None:
    """Back to the stock path (the instance overrides removed)."""
    tower = vision_tower(model)
    if tower is None or not getattr(tower, "_fast_vision", False):
        return
    for m in [tower.patch_embed, tower.rotary_pos_emb] + [blk.attn for blk in tower.blocks]:
        m.__dict__.pop("forward", None)
    # found by function, not by handle: a deepcopy's handles point at the original's hook dicts
    for hooks in (tower._forward_pre_hooks, tower._forward_hooks):
        for k in [k for k, fn in hooks.items() if fn in (_begin_forward, _end_forward)]:
            del hooks[k]
    tower._fast_vision = False


def _begin_forward(module, args):
    _CTX.plans = {}


def _end_forward(module, args, output):
    _CTX.plans = None


def _scratch(tag, shape, like):
    """A reused buffer of `shape` for a temporary that dies within the call (this thread's own):
    on a CPU a fresh large tensor costs page faults on every call (glibc hands big blocks back to
    the OS), which measured as much as the arithmetic on it. Grows as needed; never for autograd."""
    bufs = _CTX.__dict__.setdefault("scratch", {})
    numel = 1
    for d in shape:
        numel *= d
    key = (tag, like.dtype, like.device)
    buf = bufs.get(key)
    if buf is None or buf.numel() < numel:
        buf = bufs[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
    return buf[:numel].view(shape)


def _cached(key_tensor, kind, build):
    """build(), cached for the current tower forward under (kind, the tensor's identity)."""
    plans = getattr(_CTX, "plans", None)
    if plans is None:
        return build()
    key = (kind, id(key_tensor))
    hit = plans.get(key)
    if hit is not None and hit[0] is key_tensor:
        return hit[1]
    value = build()
    plans[key] = (key_tensor, value)  # the tensor held: its id cannot be reused while cached
    return value


# ---------------------------------------------------------------- patch embedding

def _patch_embed_forward(self, hidden_states):
    if torch.is_grad_enabled():  # training: the stock path, so memory plans (trainer.learn.memory_plan) hold
        return type(self).forward(self, hidden_states)
    w = self.proj.weight
    x = hidden_states.view(-1, self.in_channels, self.temporal_patch_size, self.patch_size * self.patch_size)
    x = x.to(dtype=w.dtype)
    if self.temporal_patch_size != 2 or not torch.equal(x[:, :, 0], x[:, :, 1]):
        # video (frames differ), or a layout this does not cover: the stock Conv3d
        x = x.view(-1, self.in_channels, self.temporal_patch_size, self.patch_size, self.patch_size)
        return self.proj(x).view(-1, self.embed_dim)
    x0 = x[:, :, 0]
    if not (torch.is_grad_enabled() and w.requires_grad):
        x0 = _scratch("patch", (x.shape[0], x0.shape[1] * x0.shape[2]), x).view_as(x0).copy_(x0)
    return F.linear(x0.reshape(x.shape[0], -1), _summed_kernel(self, w))


def _summed_kernel(self, w):
    """The Conv3d kernel's two temporal halves summed, as a [embed_dim, C*P*P] matrix. Cached
    while the weight is unchanged (its version counter: an optimizer step or a load bumps it);
    recomputed (differentiably) whenever the weight takes gradients."""
    def build():
        w4 = w.view(w.shape[0], self.in_channels, 2, -1)
        return (w4[:, :, 0] + w4[:, :, 1]).reshape(w.shape[0], -1)

    if torch.is_grad_enabled() and w.requires_grad:
        return build()
    cache = self.__dict__.get("_fast_kernel")  # the weight itself held, so a new one is never taken for it
    if cache is None or cache[0] is not w or cache[1] != w._version:
        with torch.no_grad():
            cache = (w, w._version, build())
        self.__dict__["_fast_kernel"] = cache
    return cache[2]


# ---------------------------------------------------------------- rotary

def _rotary_forward(self, x, position_ids):
    """Stock Qwen2_5_VLVisionRotaryEmbedding.forward without its two cats: the [h, w, h, w]
    layout written into one buffer."""
    with torch.no_grad():
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        n = freqs.shape[0]
        half = freqs.reshape(n, -1)  # [h freqs, w freqs]: stock's freq_hw
        out = []
        for fn in (torch.cos, torch.sin):
            buf = torch.empty(n, 2, half.shape[1], device=half.device, dtype=torch.float)
            fn(half, out=buf[:, 0])
            if self.attention_scaling != 1.0:
                buf[:, 0].mul_(self.attention_scaling)
            buf[:, 1].copy_(buf[:, 0])
            out.append(buf.view(n, -1))
        return out[0], out[1]


def _half_cos_sin(cos, sin):
    """(c, s) of shape [N, 1, 1, D/2] in float32: Qwen's vision cos/sin repeat one half twice.
    None when they do not (cos/sin from elsewhere): the stock attention then."""
    h = cos.shape[-1] // 2
    if not (torch.equal(cos[:, :h], cos[:, h:]) and torch.equal(sin[:, :h], sin[:, h:])):
        return None
    return tuple(t[:, :h].float().reshape(t.shape[0], 1, 1, h) for t in (cos, sin))


def _rotate_qk(qk, c, s):
    """Rotary on q and k together: qk [N, 2, H, D] -> rotated. (x1, x2) -> (x1 c - x2 s, x2 c + x1 s),
    which is stock's x*cos + rotate_half(x)*sin with equal cos/sin halves. In place (no allocation
    but one half-size temporary) when no gradient flows through it."""
    dtype = qk.dtype
    h = qk.shape[-1] // 2
    if dtype == torch.float32 and not (torch.is_grad_enabled() and qk.requires_grad):
        x1, x2 = qk[..., :h], qk[..., h:]
        t = torch.mul(x1, s, out=_scratch("rope", x1.shape, x1))
        x1.mul_(c).addcmul_(x2, s, value=-1.0)
        x2.mul_(c).add_(t)
        return qk
    x = qk.float()  # stock rotates in float32 whatever the model's dtype
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(dtype)


# ---------------------------------------------------------------- attention

def _attention_plan(cu_seqlens, n):
    """The segments of cu_seqlens grouped by length: [(length, index)], index None when the group
    is the whole sequence in order (a view does), else a [n_segments, length] gather index."""
    bounds = cu_seqlens.tolist()
    groups: dict[int, list[int]] = {}
    for a, b in itertools.pairwise(bounds):
        if b > a:
            groups.setdefault(b - a, []).append(a)
    plan = []
    for length, starts in groups.items():
        if len(starts) * length == n and starts == list(range(0, n, length)):
            plan.append((length, None))
        else:
            st = torch.tensor(starts, device=cu_seqlens.device, dtype=torch.long)
            plan.append((length, st[:, None] + torch.arange(length, device=st.device)))
    return plan


def _attention_forward(self, hidden_states, cu_seqlens, position_embeddings=None, max_seqlen=None, **kwargs):
    cos, sin = position_embeddings
    half = None if torch.is_grad_enabled() else _cached(cos, "rope", lambda: _half_cos_sin(cos, sin))
    if half is None:  # training (the stock path: its memory is what the plans measure), or a layout this does not cover
        return type(self).forward(self, hidden_states, cu_seqlens, position_embeddings, max_seqlen, **kwargs)
    c, s = half
    n = hidden_states.shape[0]
    heads, hd = self.num_heads, self.head_dim
    qkv = self.qkv(hidden_states).view(n, 3, heads, hd)
    qk = _rotate_qk(qkv[:, :2], c, s)
    if qk.data_ptr() != qkv.data_ptr() or qk.requires_grad:  # rotated out of place: regroup
        qkv = torch.cat((qk, qkv[:, 2:].to(qk.dtype)), dim=1)
    plan = _cached(cu_seqlens, "attn", lambda: _attention_plan(cu_seqlens, n))
    out = None
    for length, index in plan:
        if index is None:
            g = qkv.view(-1, length, 3, heads, hd)  # [nw, L, 3, H, D]
        elif qkv.requires_grad:
            g = qkv[index]
        else:
            g = torch.index_select(qkv, 0, index.reshape(-1), out=_scratch("gather", (index.numel(), 3, heads, hd), qkv))
            g = g.view(*index.shape, 3, heads, hd)
        q, k, v = (g[:, :, i].transpose(1, 2) for i in range(3))  # [nw, H, L, D]
        o = F.scaled_dot_product_attention(q, k, v, scale=self.scaling).transpose(1, 2)  # [nw, L, H, D]
        if index is None:  # one group, the whole sequence in order
            out = o.reshape(n, heads, hd) if o.requires_grad else _scratch("attn", (n, heads, hd), o)
            if not o.requires_grad:
                out.view(o.shape).copy_(o)
            break
        if out is None:
            out = o.new_zeros(n, heads, hd) if o.requires_grad else _scratch("attn", (n, heads, hd), o)
        out = out.index_put((index,), o) if o.requires_grad else out.index_put_((index,), o)
    return self.proj(out.reshape(n, heads * hd))
