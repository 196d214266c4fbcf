"""Batched generation for many chats at once (rollouts and evaluation over many environments).

`generate_batch(model, processor, chats)` answers N chats with one padded `generate` call (KV
cache, every row stops at its own end-of-turn token) and returns one `Generation` per chat, the
same text and per-token log-probs as `agent.vlm.generate` gives each chat alone (tested to 1e-4).

An `ImageCache` makes the multi-turn case cheap:
- the screenshots in an agent's memory come back turn after turn, so each distinct screenshot is
  preprocessed (resized, patched) once and encoded by the vision tower once;
- every agent prompt starts with the same few hundred tokens (the system message and UI-TARS's
  prompt up to the instruction), so their keys and values are computed once and every row's
  cache starts from them. Rows are laid out [shared prefix][padding][own tokens]: the attention
  mask hides the padding and the rotary positions skip it, so each row sees what it would alone.
Features and prefixes depend on the weights: `clear_features()` whenever the weights change
(VLMActor.load_weights does).
"""
from __future__ import annotations

import copy
import hashlib
import time
from collections import OrderedDict

from agent.vlm_inputs import VLMError, collate_inputs, to_template_messages


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
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self.pixels)

    def prepare(self, processor, images) -> list[str]:
        """Keys of `images` (PIL), running the image processor once over those not seen yet."""
        keys = [image_key(im) for im in images]
        todo = {}
        for k, im in zip(keys, images):
            if k in self.pixels:
                self.pixels.move_to_end(k)
                self.hits += 1
            elif k not in todo:
                todo[k] = im
                self.misses += 1
        if todo:
            enc = processor.image_processor(images=list(todo.values()), return_tensors="pt")
            row = 0
            for k, thw in zip(todo, enc["image_grid_thw"]):
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
            for i, (k, f) in enumerate(zip(part, out.pooler_output)):
                self.features[k] = f.detach()
                layers = getattr(out, "deepstack_features", None) or []
                self.deepstack[k] = [layer[i].detach() for layer in layers]
        return self.features

    def model_inputs(self, keys) -> dict:
        """The encoded images `keys`, in order, as agent.vlm_inputs.to_model takes them instead
        of pixel_values: "image_embeds" (and Qwen3-VL's "image_deepstack")."""
        out = {"image_embeds": tuple(self.features[k] for k in keys)}
        if any(self.deepstack.get(k) for k in keys):
            out["image_deepstack"] = [self.deepstack[k] for k in keys]
        return out

    def clear_features(self) -> None:
        self.features.clear()
        self.deepstack.clear()
        self.prefixes.clear()

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
    """Per chat, model inputs (batch of 1, as agent.vlm_inputs.build_inputs gives them, with a
    generation prompt) and its image keys in order. Each distinct image is preprocessed once
    (through `cache`); the texts are tokenized in one call."""
    import torch

    cache = cache if cache is not None else ImageCache()
    tok = processor.tokenizer
    image_token = processor.image_token
    merge = processor.image_processor.merge_size ** 2
    texts, keys_per_chat = [], []
    for i, messages in enumerate(chats):
        tmessages, pil = to_template_messages(messages)
        text = processor.apply_chat_template(tmessages, tokenize=False, add_generation_prompt=True)
        keys = cache.prepare(processor, pil) if pil else []
        if text.count(image_token) != len(keys):
            raise VLMError(f"chat {i}: the template has {text.count(image_token)} image tokens for {len(keys)} images")
        pieces = text.split(image_token)
        out = [pieces[0]]
        for k, rest in zip(keys, pieces[1:]):  # the processor's expansion: one token per merged patch
            out.append(image_token * (int(cache.pixels[k][1].prod()) // merge))
            out.append(rest)
        texts.append("".join(out))
        keys_per_chat.append(keys)
    enc = tok(texts, add_special_tokens=False)
    rows = []
    for ids, keys in zip(enc["input_ids"], keys_per_chat):
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


def generate_batch(model, processor, chats, *, max_new_tokens: int = 256, temperature: float = 0.0,
                   top_p: float = 1.0, seed: int | None = None, cache: ImageCache | None = None) -> list:
    """One `Generation` per chat (text, token ids, per-token log-probs at the sampling
    temperature), from one batched `generate`: rows left-padded, each cut at its own first stop
    token (the stop included, as a batch-of-one reply has it). temperature 0 is greedy. With a
    cache, screenshots seen before skip the image processor and, their features cached, the
    vision tower."""
    import torch

    from agent.vlm import Generation, generation_kwargs
    from agent.vlm_inputs import to_model

    if not chats:
        return []
    kwargs = generation_kwargs(processor, max_new_tokens, temperature, top_p)
    stops = kwargs["eos_token_id"]
    cache = cache if cache is not None else ImageCache()
    rows, keys = build_batch_inputs(processor, chats, cache)
    n_prefix, prefix_kv = cache.prefix_cache(model, rows)
    batch = _layout(rows, n_prefix, stops[-1])
    flat = [k for ks in keys for k in ks]
    if flat:
        cache.encode(model.model, flat)
        batch.pop("pixel_values")
        batch.update(cache.model_inputs(flat))
    sample = temperature > 0
    if prefix_kv is not None:  # generate extends this copy; the cached one stays for the next call
        past = copy.deepcopy(prefix_kv)
        past.batch_repeat_interleave(len(rows))
        kwargs["past_key_values"] = past
    devices = [model.device] if model.device.type == "cuda" else []
    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=devices, enabled=seed is not None), torch.no_grad():
        if seed is not None:
            torch.manual_seed(seed)
        out = model.generate(**to_model(batch, model), **kwargs)
    seconds = time.perf_counter() - t0
    width = batch["input_ids"].shape[1]
    gen = out.sequences[:, width:]
    if gen.shape[1]:
        logits = torch.stack(out.logits[: gen.shape[1]], dim=1).float()  # [B, steps, V]
        lp = torch.log_softmax(logits / (temperature if sample else 1.0), dim=-1)
        chosen = lp.gather(2, gen.unsqueeze(2)).squeeze(2)
    stop_set = set(stops)
    results = []
    for b in range(len(chats)):
        ids = gen[b].tolist()
        end = next((j + 1 for j, t in enumerate(ids) if t in stop_set), len(ids))  # padding follows a stop
        ids = ids[:end]
        logprobs = chosen[b, :end].tolist() if ids else []
        text = processor.tokenizer.decode(ids, skip_special_tokens=True)
        results.append(Generation(text, ids, logprobs, int(rows[b]["input_ids"].shape[1]), seconds))
    return results
