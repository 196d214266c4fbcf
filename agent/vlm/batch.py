"""Batched generation for many chats at once (rollouts and evaluation over many environments).

`generate_batch(model, processor, chats)` answers N chats with one padded `generate` call (KV
cache, every row stops at its own end-of-turn token) and returns one `Generation` per chat, the
same text and per-token log-probs as `agent.vlm.model.generate` gives each chat alone (tested to 1e-4).

An `ImageCache` makes the multi-turn case cheap:
- the screenshots in an agent's memory come back turn after turn, so each distinct screenshot is
  preprocessed (resized, patched) once and encoded by the vision tower once;
- every agent prompt starts with the same few hundred tokens (the system message and UI-TARS's
  prompt up to the instruction), so their keys and values are computed once and every row's
  cache starts from them. Rows are laid out [shared prefix][padding][own tokens]: the attention
  mask hides the padding and the rotary positions skip it, so each row sees what it would alone.
- an agent's prompt at turn t usually extends its prompt at turn t-1 (the same start, the
  reply it gave, then the new screenshot), so with `slots` (one key per chat: the caller's
  environment slot) each slot's last keys and values are kept and every call computes only what
  a row does not share with its slot's last sequence (the longest common prefix of token ids,
  screenshots compared by content). Rows are laid out [padding][reused][padding][new]; the mask
  hides both paddings and the rotary positions skip them, so each row still sees exactly what it
  would alone. Since every row is padded to the longest reused and the longest new part, rows
  reuse their kept turns only when that makes the padded batch cheaper (`_cheapest_reuse`).
Features, prefixes and kept turns depend on the weights: `clear_features()` whenever the weights
change (VLMActor.load_weights does).
"""
from __future__ import annotations

import copy
import hashlib
import time
from collections import OrderedDict

from agent.vlm import pointer, typed_copy
from agent.vlm.inputs import VLMError, collate_inputs, to_model, to_template_messages
from agent.vlm.model import Generation, generation_kwargs


def image_key(img) -> str:
    """A content hash of an RGB PIL image (size included)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{img.size[0]}x{img.size[1]}:".encode())
    h.update(img.tobytes())
    return h.hexdigest()


class ImageCache:
    """Per distinct screenshot: its pixel rows and grid (the image processor's output) and, once
    encoded, the vision tower's merged features (plus Qwen3-VL's DeepStack features). Bounded:
    the least recently used entries go first past `max_images`."""

    def __init__(self, max_images: int = 4096, chunk: int = 32):
        if max_images < 1:
            raise ValueError(f"max_images must be at least 1, got {max_images}")
        self.max_images, self.chunk = max_images, chunk
        self.pixels: OrderedDict[str, tuple] = OrderedDict()  # key -> (pixel rows, grid_thw [3])
        self.features: dict[str, object] = {}
        self.deepstack: dict[str, list] = {}
        self.prefixes: OrderedDict[tuple, object] = OrderedDict()  # shared prompt start -> its KV cache (batch 1)
        self.turns: OrderedDict[object, tuple] = OrderedDict()  # slot -> (signature, [(keys, values)] per layer)
        self.max_turns = 1024  # slots kept (least recently used go first)
        self.image_ids: dict[str, int] = {}  # image key -> a number for signatures
        self.hits = self.misses = 0
        self.prompt_tokens = self.reused_tokens = 0  # over all generate_batch calls: tokens asked, tokens not computed
        self.last_reused: list[int] = []  # per row of the last call: tokens whose keys and values were reused

    def __len__(self) -> int:
        return len(self.pixels)

    def prepare(self, processor, images) -> list[str]:
        """Keys of `images` (PIL), running the image processor once over those not seen yet."""
        keys = [image_key(im) for im in images]
        todo = {}
        for k, im in zip(keys, images, strict=True):
            if k in self.pixels:
                self.pixels.move_to_end(k)
                self.hits += 1
            elif k not in todo:
                todo[k] = im
                self.misses += 1
        if todo:
            enc = processor.image_processor(images=list(todo.values()), return_tensors="pt")
            row = 0
            for k, thw in zip(todo, enc["image_grid_thw"], strict=True):
                n = int(thw.prod())
                self.pixels[k] = (enc["pixel_values"][row: row + n], thw)
                row += n
            self._evict(keep=set(keys))
        return keys

    def encode(self, backbone, keys=None) -> dict:
        """Vision features of every key (all images when None) without them yet; `backbone` is a
        Qwen-VL model's inner model (`model.model`). Attention stays inside each image, so
        encoding `chunk` images per call changes nothing but the speed. Returns the features."""
        import torch

        todo = list(dict.fromkeys(k for k in (self.pixels if keys is None else keys) if k not in self.features))
        for at in range(0, len(todo), self.chunk):
            part = todo[at: at + self.chunk]
            pv = torch.cat([self.pixels[k][0] for k in part]).to(backbone.device, dtype=backbone.dtype)
            grid = torch.stack([self.pixels[k][1] for k in part]).to(backbone.device)
            with torch.no_grad():
                out = backbone.get_image_features(pv, grid, return_dict=True)
            for i, (k, f) in enumerate(zip(part, out.pooler_output, strict=True)):
                self.features[k] = f.detach()
                layers = getattr(out, "deepstack_features", None) or []
                self.deepstack[k] = [layer[i].detach() for layer in layers]
        return self.features

    def model_inputs(self, keys) -> dict:
        """The encoded images `keys`, in order, as agent.vlm.inputs.to_model takes them instead
        of pixel_values: "image_embeds" (and Qwen3-VL's "image_deepstack")."""
        out = {"image_embeds": tuple(self.features[k] for k in keys)}
        if any(self.deepstack.get(k) for k in keys):
            out["image_deepstack"] = [self.deepstack[k] for k in keys]
        return out

    def clear_features(self) -> None:
        self.features.clear()
        self.deepstack.clear()
        self.prefixes.clear()
        self.turns.clear()

    def signature(self, row: dict, keys: list[str], spans: list[tuple[int, int]]):
        """The row's token ids with each image's tokens (`spans`, image_spans) replaced by a number
        of its own (negative, so never a token id): two rows agree on a stretch exactly when their
        text and screenshots do."""
        sig = row["input_ids"][0].clone()
        for (start, end), key in zip(spans, keys, strict=True):
            sig[start:end] = -1 - self.image_ids.setdefault(key, len(self.image_ids))
        return sig

    def reusable(self, slot, sig, limit: int) -> tuple[int, list | None]:
        """(n, per-layer (keys, values) of batch 1 and length >= n): the longest start of `sig`, at
        most `limit` tokens, that the slot's kept sequence shares; (0, None) when none is kept."""
        kept = self.turns.get(slot)
        if kept is None:
            return 0, None
        self.turns.move_to_end(slot)
        old, layers = kept
        n = min(limit, len(old), len(sig))
        diff = (old[:n] != sig[:n]).nonzero()
        return (int(diff[0]) if len(diff) else n), layers

    def keep_turn(self, slot, sig, layers: list) -> None:
        self.turns[slot] = (sig, layers)
        self.turns.move_to_end(slot)
        while len(self.turns) > self.max_turns:
            self.turns.popitem(last=False)

    def prefix_cache(self, model, rows: list[dict], min_tokens: int = 16):
        """(length, KV cache of batch 1) of a text-only start every row shares, computed once and
        kept (a few of them); (0, None) when the rows share less than `min_tokens`."""
        import torch

        ids = [r["input_ids"][0] for r in rows]
        limit = min(int(x.shape[0]) for x in ids) - 1  # each row keeps a token to feed generate
        for key in reversed(self.prefixes):
            n = len(key)
            if n <= limit and all(x[:n].tolist() == list(key) for x in ids):
                self.prefixes.move_to_end(key)
                return n, self.prefixes[key]
        if len(rows) < 2:
            return 0, None
        first = ids[0][:limit]
        n = limit
        for x in ids[1:]:
            diff = (x[:n] != first[:n]).nonzero()
            n = int(diff[0]) if len(diff) else n
        vision = rows[0]["mm_token_type_ids"][0][:n].nonzero()
        n = int(vision[0]) if len(vision) else n  # the prefix is text: images are per row
        if n < min_tokens:
            return 0, None
        from transformers import DynamicCache

        with torch.no_grad():
            out = model(input_ids=first[:n].unsqueeze(0).to(model.device),
                        attention_mask=torch.ones(1, n, dtype=torch.long, device=model.device),
                        past_key_values=DynamicCache(), use_cache=True)
        key = tuple(first[:n].tolist())
        self.prefixes[key] = out.past_key_values
        while len(self.prefixes) > 4:
            self.prefixes.popitem(last=False)
        return n, out.past_key_values

    def _evict(self, keep: set) -> None:
        while len(self.pixels) > self.max_images:
            k = next(iter(self.pixels))
            if k in keep:  # everything left is in use right now: allow the overshoot
                break
            self.pixels.pop(k)
            self.features.pop(k, None)
            self.deepstack.pop(k, None)


def build_batch_inputs(processor, chats, cache: ImageCache | None = None) -> tuple[list[dict], list[list[str]]]:
    """Per chat, model inputs (batch of 1, as agent.vlm.inputs.build_inputs gives them, with a
    generation prompt) and its image keys in order. Each distinct image is preprocessed once
    (through `cache`); the texts are tokenized in one call."""
    import torch

    cache = cache if cache is not None else ImageCache()
    tok = processor.tokenizer
    image_token = processor.image_token
    merge = processor.image_processor.merge_size ** 2
    texts, keys_per_chat = [], []
    for i, messages in enumerate(chats):
        tmessages, pil = to_template_messages(messages, tokenizer=tok)
        text = processor.apply_chat_template(tmessages, tokenize=False, add_generation_prompt=True)
        keys = cache.prepare(processor, pil) if pil else []
        if text.count(image_token) != len(keys):
            raise VLMError(f"chat {i}: the template has {text.count(image_token)} image tokens for {len(keys)} images")
        pieces = text.split(image_token)
        out = [pieces[0]]
        for k, rest in zip(keys, pieces[1:], strict=True):  # the processor's expansion: one token per merged patch
            out.append(image_token * (int(cache.pixels[k][1].prod()) // merge))
            out.append(rest)
        texts.append("".join(out))
        keys_per_chat.append(keys)
    enc = tok(texts, add_special_tokens=False)
    rows = []
    for ids, keys in zip(enc["input_ids"], keys_per_chat, strict=True):
        t = torch.tensor([ids], dtype=torch.long)
        row = {"input_ids": t, "attention_mask": torch.ones_like(t),
               "mm_token_type_ids": (t == processor.image_token_id).long()}
        if keys:
            row["pixel_values"] = torch.cat([cache.pixels[k][0] for k in keys])
            row["image_grid_thw"] = torch.stack([cache.pixels[k][1] for k in keys])
        rows.append(row)
    return rows, keys_per_chat


def _layout(rows: list[dict], n_prefix: int, pad_id: int) -> dict:
    """One batch of the rows: [the shared prefix][left padding][each row's own tokens]."""
    import torch

    per_token = ("input_ids", "attention_mask", "mm_token_type_ids")
    own = [{k: (v[:, n_prefix:] if k in per_token else v) for k, v in r.items()} for r in rows]
    batch = collate_inputs(own, pad_id, padding_side="left")
    if n_prefix:
        for k in per_token:
            batch[k] = torch.cat([rows[0][k][:, :n_prefix].expand(len(rows), -1), batch[k]], dim=1)
    return batch


def _reuse_layout(rows: list[dict], reused: list[int], layers: list, pad_id: int) -> tuple[dict, object]:
    """One batch of the rows and its KV cache when row b's first reused[b] tokens come from
    layers[b] (per layer (keys, values) of batch 1): [padding][reused][padding][own tokens]."""
    import torch
    from transformers import DynamicCache

    per_token = ("input_ids", "attention_mask", "mm_token_type_ids")
    width = max(reused)
    own = [{k: (v[:, r:] if k in per_token else v) for k, v in row.items()} for row, r in zip(rows, reused, strict=True)]
    batch = collate_inputs(own, pad_id, padding_side="left")  # every row's images, reused ones included
    for k in per_token:
        fill = pad_id if k == "input_ids" else 0
        head = [torch.cat([row[k].new_full((1, width - r), fill), row[k][:, :r]], dim=1) for row, r in zip(rows, reused, strict=True)]
        batch[k] = torch.cat([torch.cat(head), batch[k]], dim=1)
    ref = next(kv for kv in layers if kv is not None)
    data = []
    for i, (k0, v0) in enumerate(ref):
        keys = k0.new_zeros(len(rows), k0.shape[1], width, k0.shape[3])
        values = v0.new_zeros(len(rows), v0.shape[1], width, v0.shape[3])
        for b, (r, kv) in enumerate(zip(reused, layers, strict=True)):
            if r:
                keys[b, :, width - r:] = kv[i][0][0, :, :r]
                values[b, :, width - r:] = kv[i][1][0, :, :r]
        data.append((keys, values))
    return batch, DynamicCache(ddp_cache_data=data)


def image_spans(row: dict) -> list[tuple[int, int]]:
    """[start, end) of each image's tokens in a row (batch of 1), in order."""
    import torch

    mm = (row["mm_token_type_ids"][0] != 0).to(torch.int8)
    edges = torch.diff(mm, prepend=mm.new_zeros(1), append=mm.new_zeros(1)).nonzero().flatten().tolist()
    return list(zip(edges[::2], edges[1::2], strict=True))


def _kept_per_row(cache: ImageCache, rows, keys, spans, slots, n_prefix: int, min_tokens: int = 16):
    """Per row: (tokens its slot's kept turn covers, or 0 when that is not more than the shared
    prefix; the kept per-layer KV; the row's signature). A kept stretch never ends inside an image."""
    out = []
    for row, ks, row_spans, slot in zip(rows, keys, spans, slots, strict=True):
        sig = cache.signature(row, ks, row_spans)
        n, layers = cache.reusable(slot, sig, len(sig) - 1) if slot is not None else (0, None)  # feed >= 1 token
        for start, end in row_spans:
            if start < n < end:
                n = start
        out.append((n, layers, sig) if n > max(n_prefix, min_tokens - 1) else (0, None, sig))
    return out


def _layout_cost(config, lengths: list[int], reused: list[int], steps: int) -> float:
    """Multiply-adds per language layer of one batched generate whose row b is lengths[b] tokens,
    the first reused[b] of them reused: every row is padded to the widest new part and the widest
    reused part, and padding costs what tokens cost (linear layers per token, attention per
    query-key pair), prefill and `steps` decoding steps."""
    text = getattr(config, "text_config", config)
    d, inter = text.hidden_size, text.intermediate_size
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or d // heads
    kv = getattr(text, "num_key_value_heads", heads) * head_dim
    per_token = 2 * d * heads * head_dim + 2 * d * kv + 3 * d * inter
    per_pair = 2 * heads * head_dim
    rows, past = len(lengths), max(reused)
    new = max(n - r for n, r in zip(lengths, reused, strict=True))
    prefill = rows * new * (per_token + (past + new) * per_pair)
    return prefill + steps * rows * (per_token + (past + new + steps / 2) * per_pair)


def _cheapest_reuse(config, lengths: list[int], kept: list[int], n_prefix: int, steps: int) -> list[int]:
    """Per row, the tokens to reuse: kept[b] (its kept turn; 0: none) or the shared n_prefix,
    whichever set makes the padded batch cheapest. A row reusing far more than the others pads
    every row's cache to its length, and a row with a long new part pads every row's new part, so
    reusing everything kept is not always cheapest (for a model as small as the default, attention
    over the padding outweighs the tokens saved). Candidates: reuse only where kept <= a cap."""
    best, best_cost = None, None
    for cap in sorted({n_prefix, *kept}):
        reused = [k if n_prefix < k <= cap else n_prefix for k in kept]
        cost = _layout_cost(config, lengths, reused, steps)
        if best_cost is None or cost < best_cost:
            best, best_cost = reused, cost
    return best


def generate_batch(model, processor, chats, *, max_new_tokens: int = 256, temperature: float = 0.0,
                   top_p: float = 1.0, seed: int | None = None, cache: ImageCache | None = None,
                   slots: list | None = None) -> list:
    """One `Generation` per chat (text, token ids, per-token log-probs at the sampling
    temperature), from one batched `generate`: rows left-padded, each cut at its own first stop
    token (the stop included, as a batch-of-one reply has it). temperature 0 is greedy. With a
    cache, screenshots seen before skip the image processor and, their features cached, the
    vision tower. With `slots` (one hashable per chat, e.g. the environment it plays; None for a
    row with nothing to keep), each slot's sequence is kept and the next call for that slot
    computes only what is new."""
    import torch

    if not chats:
        return []
    if slots is not None and len(slots) != len(chats):
        raise ValueError(f"{len(slots)} slots for {len(chats)} chats")
    kwargs = generation_kwargs(processor, max_new_tokens, temperature, top_p)
    stops = kwargs["eos_token_id"]
    cache = cache if cache is not None else ImageCache()
    rows, keys = build_batch_inputs(processor, chats, cache)
    n_prefix, prefix_kv = cache.prefix_cache(model, rows)

    with_pointer = pointer.head_of(model) is not None
    kept = None
    reused = [n_prefix] * len(rows)
    if slots is not None:
        spans = [image_spans(r) for r in rows]
        kept = _kept_per_row(cache, rows, keys, spans, slots, n_prefix)
        if with_pointer:  # the pointer reads the current list's hidden states: never take them from a cache
            kept = [_before_list(processor.tokenizer, row, k, n_prefix) for row, k in zip(rows, kept, strict=True)]
        lengths = [int(r["input_ids"].shape[1]) for r in rows]
        reused = _cheapest_reuse(model.config, lengths, [n for n, _, _ in kept], n_prefix, min(max_new_tokens, 64))
    if any(r != n_prefix for r in reused):
        prefix_layers = [(layer.keys, layer.values) for layer in prefix_kv.layers] if prefix_kv is not None else None
        layers = [kv if r == n else prefix_layers for r, (n, kv, _) in zip(reused, kept, strict=True)]
        batch, kwargs["past_key_values"] = _reuse_layout(rows, reused, layers, stops[-1])
        flat = [k for ks, row_spans, r in zip(keys, spans, reused, strict=True)
                for k, (start, _) in zip(ks, row_spans, strict=True) if start >= r]
    else:
        batch = _layout(rows, n_prefix, stops[-1])
        flat = [k for ks in keys for k in ks]
        if prefix_kv is not None:  # generate extends this copy; the cached one stays for the next call
            past = copy.deepcopy(prefix_kv)
            past.batch_repeat_interleave(len(rows))
            kwargs["past_key_values"] = past
    batch.pop("pixel_values", None)
    if flat:
        cache.encode(model.model, flat)
        batch.update(cache.model_inputs(flat))
    cache.prompt_tokens += sum(int(r["input_ids"].shape[1]) for r in rows)
    cache.reused_tokens += sum(reused)
    cache.last_reused = list(reused)
    if hasattr(model.model, "rope_deltas"):  # positions come from this batch, never an earlier call's
        model.model.rope_deltas = None
    if with_pointer:  # the head reads the last hidden states of the list's entries and of each `_box='(`
        kwargs["output_hidden_states"] = True
    sample = temperature > 0
    devices = [model.device] if model.device.type == "cuda" else []
    t0 = time.perf_counter()
    stop_set = set(stops)
    results, lengths = [], []
    width = batch["input_ids"].shape[1]
    with torch.random.fork_rng(devices=devices, enabled=seed is not None), torch.no_grad():
        if seed is not None:
            torch.manual_seed(seed)
        out = model.generate(**to_model(batch, model), **kwargs)
        gen = out.sequences[:, width:]
        if gen.shape[1]:
            logits = torch.stack(out.logits[: gen.shape[1]], dim=1).float()  # [B, steps, V]
            lp = torch.log_softmax(logits / (temperature if sample else 1.0), dim=-1)
            chosen = lp.gather(2, gen.unsqueeze(2)).squeeze(2)
        for b in range(len(chats)):
            ids = gen[b].tolist()
            end = next((j + 1 for j, t in enumerate(ids) if t in stop_set), len(ids))  # padding follows a stop
            ids = ids[:end]
            lengths.append(end)
            logprobs = chosen[b, :end].tolist() if ids else []
            n_row = int(rows[b]["input_ids"].shape[1])
            choices = None
            if with_pointer:
                got = pointer.apply_to_generation(model, processor.tokenizer, rows[b]["input_ids"][0].tolist(), ids,
                                                  logprobs, pointer.generated_hidden(out, b, n_row, width),
                                                  temperature if sample else 0.0)
                if got is not None:
                    ids, logprobs, choices = got
                copied = typed_copy.apply_to_generation(processor.tokenizer, rows[b]["input_ids"][0].tolist(), ids,
                                                        logprobs)
                if copied is not None:
                    ids, logprobs = copied
            text = processor.tokenizer.decode(ids, skip_special_tokens=True)
            results.append(Generation(text, ids, logprobs, n_row, 0.0, pointer=choices,
                                      prompt_ids=rows[b]["input_ids"][0].tolist(), image_keys=list(keys[b])))
    seconds = time.perf_counter() - t0
    for r in results:
        r.seconds = seconds
    if slots is not None and out.past_key_values is not None:
        _keep_turns(cache, out.past_key_values, batch["attention_mask"], width, gen, lengths,
                    [sig for *_, sig in kept], slots)
    return results


def _before_list(tokenizer, row: dict, kept: tuple, n_prefix: int, min_tokens: int = 16) -> tuple:
    """A row's kept-turn reuse (_kept_per_row's tuple) cut where its last element list starts."""
    n, layers, sig = kept
    start = pointer.list_start(tokenizer, row["input_ids"][0].tolist()) if n else None
    if start is None or n <= start:
        return kept
    return (start, layers, sig) if start > max(n_prefix, min_tokens - 1) else (0, None, sig)


def _keep_turns(cache: ImageCache, past, mask, width: int, gen, lengths: list[int], sigs, slots) -> None:
    """Keep each row's keys and values (its real tokens, then its reply as sampled, `lengths[b]`
    tokens, as far as the cache holds it) under its slot for the next call."""
    import torch

    layers = [(layer.keys, layer.values) for layer in past.layers]
    generated = layers[0][0].shape[2] - width  # the last sampled token was never fed back
    for b, (n, sig, slot) in enumerate(zip(lengths, sigs, slots, strict=True)):
        if slot is None:
            continue
        m = min(n, generated)
        idx = torch.cat([mask[b].nonzero().flatten().to(layers[0][0].device),
                         torch.arange(width, width + m, device=layers[0][0].device)])
        kept = [(k[b:b + 1].index_select(2, idx), v[b:b + 1].index_select(2, idx)) for k, v in layers]
        cache.keep_turn(slot, torch.cat([sig, gen[b, :m].to(sig.device)]), kept)
