"""The PPO learner's batch as tensors: trajectories -> turns (TurnBatch, prompt + generated
tokens, their screenshots encoded once by a frozen vision tower in an ImageBank) -> padded
micro-batches (Pack), so a forward (and backward) runs over many turns instead of one.

Turns are sorted by length and grouped greedily while rows x longest row (prompt tokens
included: that is what a forward computes and what a GPU holds) stays within a token budget; a
turn longer than the budget goes alone, and a budget of 0 gives one turn per forward, the
learner's sequential path. Rows are right-padded (agent.vlm.inputs.collate_inputs): causal
attention never lets a real token see the padding after it, and Qwen-VL's 3D rope index skips
positions whose attention_mask is 0, so each row scores as its batch-of-one forward does
(tests/test_ppo_packed.py checks log-probs, values and a whole update against the sequential
path). Image features from the ImageBank ("image_embeds", Qwen3-VL's "image_deepstack") are
concatenated in row order, the order in which the model scatters them into the image
placeholders (agent.vlm.inputs.to_model).

A turn's prompt is the token ids its actor generated from (Turn.prompt_ids), with its
trajectory's screenshots (Trajectory.images, each through the image processor once per batch),
as verl's agent loop hands over prompt and response ids: nothing is tokenized again (measured,
python -m tests.test_carried_ids, CPU time on one thread of a shared 2-core machine, 8 episodes of
32 turns: build_turns went from 307-321 ms to 47-70 ms with the default model, 4.4-6.7x, and
7.8-10x with the tiny one; what a worker pickles went from 8.2 MB to 1.9 MB). A turn without ids
(an actor that gives none) is tokenized from its chat as before.

Per-token results come back flattened row-major over the target mask, which is each turn's
generated tokens in row order; `Pack.split` and `Pack.scatter` hand them back per turn.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

from agent.vlm import pointer, typed_copy
from agent.vlm.batch import ImageCache
from agent.vlm.inputs import collate_inputs, to_model
from agent.vlm.model import action_logprobs, build_inputs, extend_inputs

# ---------------------------------------------------------------- trajectories -> turns


@dataclass
class TurnBatch:
    """One generated turn as the learner sees it: its inputs (batch of one) and what score() and
    the passes attach per generated token (log-probs, values, advantages, returns)."""
    inputs: dict  # prompt + generated tokens
    target: torch.Tensor  # bool [1, T]: the generated tokens
    behaviour_lp: torch.Tensor | None  # [n] log-probs under the policy that acted (None: not recorded)
    traj: int  # index of its trajectory in the batch
    weight: float = 1.0
    turn: int = 0  # its index among its trajectory's turns
    images: list[str] = field(default_factory=list)  # ImageBank keys, when the pixels live there
    old_lp: torch.Tensor | None = None
    ref_lp: torch.Tensor | None = None  # under the frozen start policy (kl_coef > 0)
    values: torch.Tensor | None = None
    adv: torch.Tensor | None = None
    ret: torch.Tensor | None = None
    tokens: int = field(init=False)  # n, the generated tokens (a Python int: no device sync to count them)
    pointer: object = None  # agent.vlm.pointer.Layout of its click sites, their choices set (the element-list pointer)
    copied: int | None = None  # the reply index where a type content copied from the instruction starts (typed_copy)

    def __post_init__(self):
        self.tokens = int(self.target.sum())


class ImageBank(ImageCache):
    """The distinct screenshots of a batch, each encoded once by a frozen vision tower (the
    rollouts' agent.vlm.batch.ImageCache, keyed here by the processed pixel rows).

    `add(inputs)` takes a turn's pixel_values apart per image (rows by image_grid_thw), keeps one
    copy of each distinct image (by content hash) and returns the turn's image keys in order;
    `encode(backbone)` (ImageCache's) runs the vision tower over all of them; `attach(turns)`
    puts each turn's features where its pixels were, as "image_embeds" (agent.vlm.model.to_model)."""

    def __init__(self, chunk: int = 16):
        super().__init__(max_images=1 << 30, chunk=chunk)  # one batch's screenshots: never evicted

    def add(self, inputs: dict) -> list[str]:
        pv, grid = inputs.get("pixel_values"), inputs.get("image_grid_thw")
        if pv is None or grid is None:
            return []
        keys, row = [], 0
        for thw in grid:
            n = int(thw.prod())
            rows = pv[row: row + n]
            row += n
            key = hashlib.blake2b(rows.contiguous().numpy().tobytes() + thw.numpy().tobytes(), digest_size=16).hexdigest()
            self.pixels.setdefault(key, (rows, thw))
            keys.append(key)
        if row != pv.shape[0]:
            raise ValueError(f"pixel_values has {pv.shape[0]} rows but image_grid_thw accounts for {row}")
        return keys

    def attach(self, turns) -> None:
        for tb in turns:
            if tb.images:
                tb.inputs.update(self.model_inputs(tb.images))


def build_turns(trajs, processor, bank: ImageBank | None = None, *, carried: bool = True) -> list[TurnBatch]:
    """One TurnBatch per generated turn. A turn that carries its prompt ids (Turn.prompt_ids, the
    tokens the actor generated from) is rebuilt from them and its trajectory's screenshots, each
    distinct one through the image processor once (carried_prompt); otherwise (or with
    carried=False) its chat is tokenized again. With a bank, the turn's pixels move into it (each
    distinct image kept once) and the turn keeps the keys."""
    out = []
    pixels = ImageCache(max_images=1 << 30)  # this batch's screenshots, processed once each
    for i, tr in enumerate(trajs):
        for k, turn in enumerate(tr.turns):
            if not turn.response_ids:
                continue  # nothing was generated: nothing to score
            keys = None
            if carried and getattr(turn, "prompt_ids", None) is not None:
                prompt, keys = carried_prompt(processor, turn, tr.images, pixels), turn.image_keys
            elif turn.messages is None:
                raise ValueError(f"trajectory {i} turn {k} has neither its prompt ids nor its chat")
            else:
                prompt = build_inputs(processor, turn.messages, add_generation_prompt=True)
            full, target = extend_inputs(prompt, turn.response_ids)
            behaviour = torch.tensor(turn.logprobs, dtype=torch.float32)
            tb = TurnBatch(full, target, behaviour if len(behaviour) == len(turn.response_ids) else None, i, tr.weight, k)
            tb.pointer = _pointer_layout(processor, full, prompt, turn)
            tb.copied = typed_copy.copied_from(processor.tokenizer, full["input_ids"][0].tolist(),
                                               int(prompt["input_ids"].shape[1]))
            if bank is not None:
                if keys:  # the screenshots' content keys: no hash over the pixel rows
                    for key in keys:
                        bank.pixels.setdefault(key, pixels.pixels[key])
                    tb.images = list(keys)
                else:
                    tb.images = bank.add(full)
                full.pop("pixel_values", None)
            out.append(tb)
    return out


def carried_prompt(processor, turn, images: dict, cache: ImageCache) -> dict:
    """A turn's prompt inputs (batch of one, as agent.vlm.inputs.build_inputs gives them) from the
    ids its actor generated from and its screenshots (`images`: key -> RGB image, the
    trajectory's), each distinct screenshot through the image processor once per `cache`."""
    ids = torch.tensor([turn.prompt_ids], dtype=torch.long)
    keys = list(turn.image_keys or [])
    todo = [k for k in dict.fromkeys(keys) if k not in cache.pixels]
    missing = [k for k in todo if k not in images]
    if missing:
        raise ValueError(f"the turn's screenshots {missing[:3]} are not among its trajectory's images")
    if todo:
        enc = processor.image_processor(images=[images[k] for k in todo], return_tensors="pt")
        row = 0
        for k, thw in zip(todo, enc["image_grid_thw"], strict=True):
            n = int(thw.prod())
            cache.pixels[k] = (enc["pixel_values"][row: row + n], thw)
            row += n
    image_tokens = int((ids == processor.image_token_id).sum())
    merge = processor.image_processor.merge_size ** 2
    expected = sum(int(cache.pixels[k][1].prod()) // merge for k in keys)
    if image_tokens != expected:
        raise ValueError(f"the prompt ids hold {image_tokens} image tokens, its {len(keys)} screenshots make {expected}")
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
           "mm_token_type_ids": (ids == processor.image_token_id).long()}
    if keys:
        out["pixel_values"] = torch.cat([cache.pixels[k][0] for k in keys])
        out["image_grid_thw"] = torch.stack([cache.pixels[k][1] for k in keys])
    return out


def _pointer_layout(processor, full: dict, prompt: dict, turn):
    """The turn's click sites with the entries the pointer chose when it generated the reply
    (Turn.pointer), or None: no pointer took part, or the sites no longer match the choices."""
    if not getattr(turn, "pointer", None):
        return None

    lay = pointer.layout(processor.tokenizer, full["input_ids"][0].tolist(), int(prompt["input_ids"].shape[1]))
    if lay is None or len(lay.sites) != len(turn.pointer) or any(not 0 <= c <= lay.none for c in turn.pointer):
        return None
    for s, c in zip(lay.sites, turn.pointer, strict=True):
        s.choice = int(c)
    return lay


def prepare_turns(trajs, processor, policy, cfg) -> list[TurnBatch]:
    """The batch's turns, with the images encoded once when the vision tower is frozen."""
    if cfg.train_vision:
        return build_turns(trajs, processor)
    bank = ImageBank()
    turns = build_turns(trajs, processor, bank)
    bank.encode(policy.model)
    bank.attach(turns)
    return turns


# ---------------------------------------------------------------- turns -> chains

# An agent's prompt at turn t usually extends its prompt and reply at turn t-1 (working memory
# appends the reply and the next screenshot; the sliding window and the episodic summaries rewrite
# the prompt only further on). Turns whose sequences extend one another form a chain: one row, the
# last turn's inputs, every member's generated tokens as targets. Causal attention makes each
# member's log-probs, entropies and values in that row exactly the ones its own row gives, and the
# forward computes the chain's tokens once instead of once per turn.


@dataclass
class Chain:
    """Turns of one trajectory, each one's prompt and reply the start of the next one's: one row."""
    members: list
    inputs: dict  # the last member's
    target: torch.Tensor  # bool [1, T]: every member's generated tokens
    tokens: int


def members_of(row) -> list:
    return row.members if isinstance(row, Chain) else [row]


def _extends(a, b) -> bool:
    """True when turn b's sequence starts with all of turn a's (tokens and screenshots)."""
    ia, ib = a.inputs["input_ids"], b.inputs["input_ids"]
    n = ia.shape[1]
    if ib.shape[1] <= n or not torch.equal(ia[0], ib[0, :n]):
        return False
    if a.images or b.images:  # encoded once in an ImageBank: compared by key
        return b.images[: len(a.images)] == a.images
    pa, pb = a.inputs.get("pixel_values"), b.inputs.get("pixel_values")
    if pa is None:
        return True
    return pb is not None and pb.shape[0] >= pa.shape[0] and torch.equal(pa, pb[: pa.shape[0]])


def chain_turns(turns: list) -> list:
    """`turns` as rows: per trajectory, in turn order, each maximal run of turns whose sequences
    extend one another as a Chain (a turn alone stays a TurnBatch). Members need not be adjacent
    turns: a turn whose sequence extends another's joins it whatever lies between."""
    rows = []
    by_traj: dict[int, list] = {}
    for tb in turns:
        by_traj.setdefault(tb.traj, []).append(tb)
    for group in by_traj.values():
        group.sort(key=lambda t: t.turn)
        run = [group[0]]
        for tb in group[1:]:
            if _extends(run[-1], tb):
                run.append(tb)
                continue
            rows.append(_row(run))
            run = [tb]
        rows.append(_row(run))
    return rows


def _row(run: list):
    if len(run) == 1:
        return run[0]
    last = run[-1]
    target = torch.zeros_like(last.target)
    for m in run:
        target[:, : m.target.shape[1]] |= m.target.to(target.device)
    return Chain(run, last.inputs, target, sum(m.tokens for m in run))


def minibatches(turns: list, size: int, chain: bool = False):
    """Shuffled minibatches of `size` turns (one optimizer step each): shuffled turns, or with
    `chain` shuffled chains (chain_turns), one split where it overflows a minibatch, so an
    episode's turns tend to share a minibatch and its forwards."""
    import random

    size = max(1, size)
    if not chain:
        items = list(turns)
        random.shuffle(items)
        for k in range(0, len(items), size):
            yield items[k : k + size]
        return
    rows = chain_turns(turns)
    random.shuffle(rows)
    mb: list = []
    for row in rows:
        for tb in members_of(row):
            mb.append(tb)
            if len(mb) == size:
                yield mb
                mb = []
    if mb:
        yield mb


# ---------------------------------------------------------------- turns -> micro-batches


_PRECOMPUTED = ("image_embeds", "image_deepstack")  # per image, not per token: concatenated, not padded


def micro_batches(turns: list, budget: int) -> list[list]:
    """`turns` (anything with .inputs["input_ids"] [1, T]) grouped so that rows x longest row
    <= budget, shortest first; budget 0: one turn each, in the given order."""
    if budget < 0:
        raise ValueError(f"micro_batch_tokens must be >= 0 (0: one turn per forward), got {budget}")
    if budget == 0:
        return [[tb] for tb in turns]
    groups, cur, widest = [], [], 0
    for tb in sorted(turns, key=lambda t: t.inputs["input_ids"].shape[1]):
        width = tb.inputs["input_ids"].shape[1]  # sorted: the newcomer is the longest row
        if cur and (len(cur) + 1) * max(widest, width) > budget:
            groups.append(cur)
            cur, widest = [], 0
        cur.append(tb)
        widest = max(widest, width)
    if cur:
        groups.append(cur)
    return groups


def pad_token_id(config) -> int:
    """A token to pad input_ids with: the config's pad token unless it is a vision placeholder
    (the model finds image positions by id, padding included); attention_mask hides it anyway."""
    text = getattr(config, "text_config", config)
    vision = {getattr(config, k, None) for k in ("image_token_id", "video_token_id", "vision_start_token_id")}
    for cand in (getattr(text, "pad_token_id", None), getattr(text, "eos_token_id", None), 0, 1, 2):
        if isinstance(cand, int) and cand not in vision:
            return cand
    raise ValueError("no token id to pad with")


# micro_batch_tokens None picks by device. Measured (python -m tests.test_ppo_packed: default model,
# 8 episodes, ~35 turns of ~550 tokens, one thread): on this 2-core CPU packing only loses, 1.00x at
# 1024 tokens, 0.93x at 2048, 0.78x at 8192: a turn's forward is ~90% arithmetic over its prompt
# (2.9 of 29 ms fwd+bwd is per-call overhead), and padded batches of several turns fall out of the
# core's 2 MB L2 cache (elementwise ops over [16, 550, 256] run at DRAM speed). On a GPU a forward
# of a model this size is kernel launches, as many for 16 rows as for one, so there it packs.
# on 2 CPU cores with the shared prefix on, 2,048-4,096 tokens measured 1.45-1.56x over one turn per
# forward (which alone was 1.27-1.35x); without the prefix packing gained nothing there
CPU_BUDGET = 2048
GPU_BUDGET = 8192


def budget_for(budget: int | None, device) -> int:
    """The micro-batch token budget to use on `device`: `budget` itself, or for None the default
    (CPU_BUDGET on a CPU, GPU_BUDGET elsewhere)."""
    if budget is not None:
        return budget
    return CPU_BUDGET if torch.device(device or "cpu").type == "cpu" else GPU_BUDGET


def packs(turns: list, model_config, device, budget: int | None, chain: bool = False):
    """The micro-batches of `turns` as Packs, one at a time (each collated as it is used); with
    `chain`, turns whose sequences extend one another share a row (chain_turns)."""
    pad = pad_token_id(model_config)
    rows = chain_turns(turns) if chain else turns
    return (Pack.build(group, pad, device) for group in micro_batches(rows, budget_for(budget, device)))


@dataclass
class Pack:
    """One micro-batch: `inputs` for a forward, `target` bool [B, T] on the model's device
    marking the generated tokens, `turns` the turns they belong to (a Chain's members share a
    row), `sizes` each turn's count of them."""
    turns: list
    inputs: dict
    target: torch.Tensor
    sizes: list[int]
    rows: list[int] = field(default_factory=list)  # each turn's row

    @classmethod
    def build(cls, rows: list, pad_id: int, device=None) -> Pack:
        """rows: TurnBatches or Chains; the Pack's turns are their members in row order (the order
        in which the target mask lists their tokens)."""
        members = [m for row in rows for m in members_of(row)]
        sizes = [m.tokens for m in members]
        row_of = [r for r, row in enumerate(rows) for _ in members_of(row)]
        if len(rows) == 1:  # the sequential path: the row's own tensors, nothing padded
            row = rows[0]
            return cls(members, row.inputs, row.target.to(device), sizes, row_of)
        items = [{k: v for k, v in row.inputs.items() if k not in _PRECOMPUTED} | {"target": row.target.cpu()}
                 for row in rows]
        inputs = collate_inputs(items, pad_id)
        target = inputs.pop("target").bool().to(device)
        if any("image_embeds" in row.inputs for row in rows):
            inputs["image_embeds"] = tuple(e for row in rows for e in row.inputs.get("image_embeds", ()))
        if any("image_deepstack" in row.inputs for row in rows):
            inputs["image_deepstack"] = [d for row in rows for d in row.inputs.get("image_deepstack", ())]
        return cls(members, inputs, target, sizes, row_of)

    def split(self, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A flat per-token tensor over the pack's generated tokens -> one tensor per turn."""
        return flat.split(self.sizes)

    def scatter(self, name: str, flat: torch.Tensor) -> None:
        """Set attribute `name` of each turn to its part of `flat`."""
        for tb, part in zip(self.turns, self.split(flat), strict=True):
            setattr(tb, name, part)

    def cat(self, name: str) -> torch.Tensor:
        """The turns' per-token attribute `name`, concatenated in row order."""
        return torch.cat([getattr(tb, name) for tb in self.turns])

    def token_weights(self) -> torch.Tensor:
        """Each generated token's trajectory weight (staleness decay), in row order."""
        w = torch.tensor([float(tb.weight) for tb in self.turns], device=self.target.device)
        return w.repeat_interleave(torch.tensor(self.sizes, device=self.target.device))


# ---------------------------------------------------------------- a shared prompt prefix, computed once

# Every agent prompt starts with the same few hundred text tokens (the system message and UI-TARS's
# prompt up to the instruction). With prefix sharing, a list of turns' common text start is forwarded
# once per model (`PrefixKV`), its keys and values expanded over each micro-batch's rows, and the
# micro-batches forward only what follows it (`forward_kwargs`): the attention mask spans prefix +
# suffix, and the 3D rope positions are the model's own get_rope_index over the whole rows, cut to
# the suffix, so every row sees what it sees unshared. With gradients, the prefix's keys and values
# are leaves that the micro-batches' backwards fill, and `PrefixKV.backward()` sends their summed
# gradient through the prefix's forward once (exact: the chain rule through a shared input).
# Measured (python -m tests.test_ppo_packed --threads 2 --rounds 5: default model, 8 episodes, 35-38 turns
# of ~550 tokens, 299 of them shared, one epoch; two runs): one turn per forward goes 1.27-1.35x as
# fast shared as unshared, and shared packs 1.31x at 1024 tokens, 1.45-1.51x at 2048, 1.52-1.56x at
# 4096, 1.43x at 8192 (unshared packs: 1.00-1.08x). Of an update's ~1.7 s shared (~2.3 s unshared),
# ~0.28 s is prepare_turns (tokenizing, the vision tower), which sharing does not touch.
MIN_SHARED_PREFIX = 16  # fewer shared tokens: not worth a forward of their own, the turns go unshared


def shared_prefix(turns: list, min_tokens: int = MIN_SHARED_PREFIX) -> torch.Tensor | None:
    """input_ids [1, n] of the longest text start all `turns` share, or None when there are
    fewer than two turns or they share fewer than `min_tokens`. The prefix stops before the first
    image token (images are per row) and leaves each row the token that predicts its first
    generated token."""
    if len(turns) < 2:
        return None
    ids = [tb.inputs["input_ids"][0] for tb in turns]
    first_target = min(int(tb.target[0].nonzero()[0]) for tb in turns)
    first = ids[0].cpu()
    n = first_target - 1
    for x in ids[1:]:
        diff = (x[:n].cpu() != first[:n]).nonzero()
        if len(diff):
            n = int(diff[0])
    for tb in turns:  # the same ids are the same token types; every row checked all the same
        vision = tb.inputs["mm_token_type_ids"][0][:n].nonzero()
        if len(vision):
            n = int(vision[0])
    return first[:n].unsqueeze(0) if n >= min_tokens else None


def _vl_model(model):
    """The Qwen-VL backbone (embeddings, vision, language model, get_rope_index) of `model`: a
    ...ForConditionalGeneration's .model, or the backbone itself (the critic's)."""
    return model.model if hasattr(model, "lm_head") else model


class PrefixKV:
    """The keys and values of a shared prefix (input_ids [1, n]) under `model`'s weights, from one
    forward. `grad`: keep that forward's graph; the micro-batches' backwards accumulate into the
    keys' and values' .grad, and `backward()` then propagates them into the weights."""

    def __init__(self, model, ids: torch.Tensor, grad: bool = False):
        from transformers import DynamicCache

        vl = _vl_model(model)
        dev = vl.device
        ids = ids.to(dev)
        self.n = int(ids.shape[1])
        ones = torch.ones_like(ids)
        pos = vl.get_rope_index(ids, torch.zeros_like(ids), attention_mask=ones)[0]
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            out = vl(input_ids=ids, attention_mask=ones, mm_token_type_ids=torch.zeros_like(ids), position_ids=pos,
                     past_key_values=DynamicCache(), use_cache=True)
        self._graph = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        track = any(t.requires_grad for kv in self._graph for t in kv)
        self.kv = [(k.detach().requires_grad_(track), v.detach().requires_grad_(track)) for k, v in self._graph]
        if not track:
            self._graph = []

    def cache(self, rows: int):
        """A fresh cache holding the prefix for `rows` rows (a forward extends it in place)."""
        from transformers import DynamicCache

        return DynamicCache(ddp_cache_data=[(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1))
                                            for k, v in self.kv])

    def backward(self) -> None:
        """The gradient the micro-batches left on the prefix's keys and values, through its forward."""
        outs, grads = [], []
        for (k, v), (lk, lv) in zip(self._graph, self.kv, strict=True):
            for t, leaf in ((k, lk), (v, lv)):
                if leaf.grad is not None:
                    outs.append(t)
                    grads.append(leaf.grad)
        if outs:
            torch.autograd.backward(outs, grads)
        self._graph = []
        for lk, lv in self.kv:
            lk.grad = lv.grad = None


def forward_kwargs(model, inputs: dict, prefix: PrefixKV | None = None) -> dict:
    """Keyword arguments for `model(...)` over `inputs` (whole rows, prefix included): the rows
    themselves, or with a prefix only what follows it, with its cache, the full attention mask
    and the rope positions of the whole rows cut to the suffix."""
    out = to_model(inputs, model)
    if prefix is None:
        return out
    n = prefix.n
    pos, _ = _vl_model(model).get_rope_index(out["input_ids"], out["mm_token_type_ids"], out.get("image_grid_thw"),
                                             attention_mask=out["attention_mask"])
    for k in ("input_ids", "mm_token_type_ids"):
        out[k] = out[k][:, n:]
    out["position_ids"] = pos[..., n:]
    out["past_key_values"] = prefix.cache(out["input_ids"].shape[0])
    return out


def suffix_target(target: torch.Tensor, prefix: PrefixKV | None) -> torch.Tensor:
    """The generated-token mask over what a forward with `prefix` computes."""
    return target if prefix is None else target[:, prefix.n:]


def pack_logprobs(model, p, temperature: float = 1.0, return_entropy: bool = False, prefix: PrefixKV | None = None):
    """Log-probs (with return_entropy, and entropies) of a Pack's generated tokens, flat in row
    order: agent.vlm.model.action_logprobs, or over the suffix after a shared prefix."""
    with_pointer = pointer.head_of(model) is not None and any(tb.pointer is not None for tb in p.turns)
    if prefix is None:
        out = action_logprobs(model, p.inputs, p.target, temperature=temperature, return_entropy=return_entropy,
                              return_hidden=with_pointer)
        out = out if isinstance(out, tuple) else (out,)
        lp, ent = out[0][p.target], (out[1][p.target] if return_entropy else None)
        hidden, offset, mask = (out[-1] if with_pointer else None), 0, p.target
    else:
        kw = forward_kwargs(model, p.inputs, prefix)
        mask = suffix_target(p.target, prefix).to(kw["input_ids"].device)
        predict_from = torch.zeros_like(mask)
        predict_from[:, :-1] = mask[:, 1:]  # logits at t-1 predict token t
        out = model(**kw, logits_to_keep=predict_from, use_cache=False, output_hidden_states=with_pointer)
        lp_all = torch.log_softmax(out.logits.reshape(-1, out.logits.shape[-1]).float() / temperature, dim=-1)
        lp = lp_all.gather(1, kw["input_ids"][mask].unsqueeze(1)).squeeze(1)
        ent = -(lp_all.exp() * lp_all).sum(-1) if return_entropy else None
        hidden, offset = (out.hidden_states[-1] if with_pointer else None), prefix.n
    if with_pointer:
        lp, ent = _with_pointer(model, p, mask, hidden, offset, lp, ent, temperature)
    return (lp, ent) if return_entropy else lp


def _with_pointer(model, p, mask, hidden, offset: int, lp, ent, temperature: float):
    """The pack's flat log-probs (and entropies) with each click site's pointer choice put in
    (agent.vlm.pointer.adjust_logprobs). mask: the generated tokens over the columns the forward
    computed (after `offset`, a shared prefix), row-major as lp is."""
    counts = mask.sum(1)
    starts = torch.cumsum(counts, 0) - counts  # each row's first flat index
    cols = [mask[r].nonzero().flatten().tolist() for r in range(mask.shape[0])]
    for tb, r in zip(p.turns, p.rows or [0] * len(p.turns), strict=True):
        lay = tb.pointer
        if lay is None:
            continue
        where = {c + offset: int(starts[r]) + i for i, c in enumerate(cols[r])}
        choices = [s.choice for s in lay.sites]
        if ent is None:
            lp = pointer.adjust_logprobs(model, lay, choices, hidden[r], offset, where.get, lp, None, temperature)
        else:
            lp, ent = pointer.adjust_logprobs(model, lay, choices, hidden[r], offset, where.get, lp, ent, temperature)
    return lp, ent


def prefix_kv(model, turns: list, share: bool, grad: bool = False) -> PrefixKV | None:
    """The shared prefix of `turns` under `model` (PPOConfig.share_prefix), or None: sharing off,
    or the turns share fewer than MIN_SHARED_PREFIX tokens (each row then forwards whole)."""
    ids = shared_prefix(turns) if share else None
    return None if ids is None else PrefixKV(model, ids, grad)
