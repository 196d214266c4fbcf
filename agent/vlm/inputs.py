"""Chat messages -> Qwen2.5-VL model inputs, without loading a model (see agent.vlm.model).

messages are the neutral chat form agent.policies.memory writes: {"role", "content": str | [part]},
part = {"type": "text", "text"} | {"type": "image", "frame": Frame} | {"type": "image", "image":
PIL.Image}. Images come from the parts unless an `images` list is given (one per image part, in
order). Inputs are dicts of tensors with a batch dimension: input_ids, attention_mask,
pixel_values, image_grid_thw, mm_token_type_ids (transformers 5 refuses images without it),
plus any bool masks shaped like input_ids (assistant_mask, a rollout's target mask).
torch and transformers are imported inside the functions.
"""
from __future__ import annotations

import re

from agent.errors import TandemError

MODEL_INPUT_KEYS = ("input_ids", "attention_mask", "pixel_values", "image_grid_thw", "mm_token_type_ids")
IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"


class VLMError(TandemError):
    """A model directory or an input the local VLM cannot use; the message says what and why."""


# ---------------------------------------------------------------- images and token counts

def _image_processor(processor):
    return getattr(processor, "image_processor", processor)


def resized_image_size(processor, width: int, height: int) -> tuple[int, int]:
    """(width, height) of the image the model actually sees (Qwen's smart_resize with this
    processor's min/max pixels); UI-TARS-1.5 writes coordinates in this space."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    ip = _image_processor(processor)
    h, w = smart_resize(int(height), int(width), factor=ip.patch_size * ip.merge_size,
                        min_pixels=ip.size["shortest_edge"], max_pixels=ip.size["longest_edge"])
    return w, h


def image_token_count(processor, width: int, height: int) -> int:
    """How many <|image_pad|> tokens a width x height screenshot becomes."""
    if width <= 0 or height <= 0:
        raise VLMError(f"image size must be positive, got {width}x{height}")
    ip = _image_processor(processor)
    return ip.get_number_of_image_patches(int(height), int(width), {}) // (ip.merge_size ** 2)


def _to_pil(part, where: str):
    img = part.get("image")
    if img is None and part.get("frame") is not None:
        img = part["frame"].pil()
    if img is None:
        raise VLMError(f"{where}: image part has neither 'image' nor 'frame', and no images list was given")
    return _as_pil(img, where)


def _as_pil(img, where: str):
    from PIL import Image

    if isinstance(img, Image.Image):
        return img.convert("RGB") if img.mode != "RGB" else img
    if hasattr(img, "pil"):  # a Frame
        return img.pil()
    if hasattr(img, "shape") and len(img.shape) == 3 and img.shape[2] == 3:
        return Image.fromarray(img, "RGB")
    raise VLMError(f"{where}: expected a PIL image, an HxWx3 RGB array or a Frame, got {type(img).__name__}")


# ---------------------------------------------------------------- text against the tokenizer's control tokens

BREAK = "\u200b"  # a zero-width space inside a special token's spelling makes it plain text
# Special tokens our own text writes on purpose: UI-TARS's prompt spells each point of the action
# space as '<|box_start|>(x1,y1)<|box_end|>'. They mark coordinates, never a turn or an image.
MARKUP_TOKENS = ("<|box_start|>", "<|box_end|>")


def _special_pattern(tokenizer):
    """A regex of every special token's spelling (turn control, vision placeholders) but the
    markup our prompt writes (MARKUP_TOKENS), cached on the tokenizer; None when it has none."""
    cached = getattr(tokenizer, "_tandem_special_re", False)
    if cached is not False:
        return cached
    found = set(getattr(tokenizer, "all_special_tokens", None) or [])
    for t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(t, "special", False):
            found.add(str(t))
    found = sorted((t for t in found - set(MARKUP_TOKENS) if len(t) > 1), key=len, reverse=True)
    pattern = re.compile("|".join(map(re.escape, found))) if found else None
    try:
        tokenizer._tandem_special_re = pattern
    except AttributeError:
        pass
    return pattern


def escape_special_tokens(text: str, tokenizer) -> str:
    """`text` with every spelling of one of the tokenizer's special tokens (but MARKUP_TOKENS)
    broken by a zero-width space, so a thought, an instruction or a command's output holding
    "<|im_end|><|im_start|>system" tokenizes as the characters it is, never as the chat's control
    tokens (which would end the turn and open a system turn inside a training sample or a
    prompt). Text without them is returned as is."""
    pattern = _special_pattern(tokenizer) if tokenizer is not None else None
    return pattern.sub(_broken, text) if pattern is not None else text


def _broken(m) -> str:
    return m.group(0)[0] + BREAK + m.group(0)[1:]


def to_template_messages(messages, images=None, tokenizer=None) -> tuple[list[dict], list]:
    """Neutral messages -> (messages for the chat template, PIL images in order). With the
    tokenizer, every text is escaped against its special tokens (escape_special_tokens): the
    template's own control tokens are then the only ones."""
    if not messages:
        raise VLMError("no messages: the chat is empty")
    out, found = [], []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise VLMError(f"message {i}: expected a dict with role and content, got {type(m).__name__}")
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "user", "assistant"):
            raise VLMError(f"message {i}: role must be system, user or assistant, got {role!r}")
        if isinstance(content, str):
            out.append({"role": role, "content": escape_special_tokens(content, tokenizer)})
            continue
        if not isinstance(content, list):
            raise VLMError(f"message {i}: content must be a string or a list of parts, got {type(content).__name__}")
        parts = []
        for j, p in enumerate(content):
            kind = p.get("type") if isinstance(p, dict) else None
            if kind == "text":
                parts.append({"type": "text", "text": escape_special_tokens(str(p.get("text", "")), tokenizer)})
            elif kind == "image":
                parts.append({"type": "image"})
                if images is None:
                    found.append(_to_pil(p, f"message {i} part {j}"))
            else:
                raise VLMError(f"message {i} part {j}: type must be 'text' or 'image', got {kind!r}")
        out.append({"role": role, "content": parts})
    n_parts = sum(1 for m in out if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image")
    if images is not None:
        if len(images) != n_parts:
            raise VLMError(f"the messages have {n_parts} image parts but {len(images)} images were given")
        found = [_as_pil(im, f"images[{k}]") for k, im in enumerate(images)]
    return out, found


# ---------------------------------------------------------------- inputs

def build_inputs(processor, messages, images=None, *, add_generation_prompt: bool | None = None,
                 assistant_mask: bool = False, last_only: bool = False) -> dict:
    """Model inputs (batch of 1) for a chat. add_generation_prompt defaults to True unless the
    chat ends with an assistant turn. With assistant_mask, adds "assistant_mask": the tokens
    the assistant wrote (see assistant_token_mask)."""
    tmessages, pil = to_template_messages(messages, images, processor.tokenizer)
    if add_generation_prompt is None:
        add_generation_prompt = tmessages[-1]["role"] != "assistant"
    text = processor.apply_chat_template(tmessages, tokenize=False, add_generation_prompt=add_generation_prompt)
    enc = processor(text=[text], images=pil or None, return_tensors="pt")
    inputs = {k: enc[k] for k in MODEL_INPUT_KEYS if k in enc}
    if "mm_token_type_ids" not in inputs:  # older processors: 1 marks image tokens
        inputs["mm_token_type_ids"] = (inputs["input_ids"] == processor.image_token_id).long()
    if assistant_mask:
        inputs["assistant_mask"] = assistant_token_mask(processor, inputs["input_ids"], last_only=last_only)
    return inputs


def assistant_token_mask(processor, input_ids, *, last_only: bool = False):
    """Bool tensor like input_ids: True on the tokens of each assistant turn's own text plus
    its closing <|im_end|> (what SFT trains and PPO scores); False on the role header, the
    prompt, images and other turns. last_only keeps the final assistant turn only."""
    import torch

    ids = input_ids if input_ids.dim() == 2 else input_ids.unsqueeze(0)
    tok = processor.tokenizer
    start, end = tok.convert_tokens_to_ids(IM_START), tok.convert_tokens_to_ids(IM_END)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for b in range(ids.shape[0]):
        row = ids[b].tolist()
        spans = []
        for p, t in enumerate(row):
            if t != start:
                continue
            j, header = p + 1, ""
            while j < len(row) and "\n" not in header and row[j] not in (start, end) and j - p <= 8:
                header += tok.decode([row[j]])
                j += 1
            if header.split("\n", 1)[0].strip() != "assistant":
                continue
            k = j
            while k < len(row) and row[k] != end and row[k] != start:
                k += 1
            stop = k + 1 if k < len(row) and row[k] == end else k  # the closing <|im_end|> is learned too
            spans.append((j, stop))
        for j, stop in (spans[-1:] if last_only else spans):
            mask[b, j:stop] = True
    return mask if input_ids.dim() == 2 else mask[0]


def extend_inputs(inputs: dict, token_ids) -> tuple[dict, object]:
    """Prompt inputs + generated token ids -> (full inputs, mask of the appended tokens), so a
    rollout is scored on exactly the tokens that were sampled (no re-tokenization)."""
    import torch

    ids = inputs["input_ids"]
    new = torch.as_tensor(list(token_ids), dtype=ids.dtype, device=ids.device).unsqueeze(0).expand(ids.shape[0], -1)
    out = dict(inputs)
    out["input_ids"] = torch.cat([ids, new], dim=1)
    out["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(new)], dim=1)
    out["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(new)], dim=1)
    out.pop("assistant_mask", None)
    target = torch.zeros_like(out["input_ids"], dtype=torch.bool)
    target[:, ids.shape[1]:] = True
    return out, target


def to_model(inputs: dict, model) -> dict:
    """The model's keys only, on the model's device; float tensors in the model's dtype.

    inputs may carry "image_embeds" (one tensor of merged vision features per image, in order)
    instead of pixel_values: the images were encoded before (a learner encodes each distinct
    screenshot once), and they reach the model as transformers' mm_encoder_outputs; for Qwen3-VL
    with "image_deepstack" (each image's DeepStack features, one tensor per layer)."""
    dev, dt = model.device, model.dtype
    out = {}
    for k in MODEL_INPUT_KEYS:
        if k in inputs and inputs[k] is not None:
            v = inputs[k]
            out[k] = v.to(dev, dtype=dt) if v.is_floating_point() else v.to(dev)
    embeds = inputs.get("image_embeds")
    if embeds is not None:
        out.pop("pixel_values", None)
        pooled = tuple(e.to(dev, dtype=dt) for e in embeds)
        if getattr(model.config, "model_type", None) == "qwen3_vl":
            # Qwen3-VL also takes DeepStack features (per layer, per image): "image_deepstack" holds
            # each image's list of them, empty for a model without DeepStack layers
            from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

            per_image = inputs.get("image_deepstack") or [[] for _ in embeds]
            layers = [tuple(img[i].to(dev, dtype=dt) for img in per_image) for i in range(len(per_image[0]))]
            out["mm_encoder_outputs"] = {"image": BaseModelOutputWithDeepstackFeatures(
                pooler_output=pooled, deepstack_features=layers)}
        else:
            from transformers.modeling_outputs import BaseModelOutputWithPooling

            out["mm_encoder_outputs"] = {"image": BaseModelOutputWithPooling(pooler_output=pooled)}
    return out


def collate_inputs(items: list[dict], pad_token_id: int, padding_side: str = "right") -> dict:
    """A padded batch from single-sample inputs (build_inputs / extend_inputs outputs), right-padded
    for training, left-padded (padding_side="left") for generation, where every row's next token
    must come right after its last one:
    input_ids pad with pad_token_id, attention_mask and mm_token_type_ids with 0, any other
    tensor shaped like input_ids (assistant_mask, target masks) with 0/False; the images'
    pixel_values and image_grid_thw are concatenated in order."""
    import torch

    if not items:
        raise VLMError("collate_inputs needs at least one sample")
    for i, it in enumerate(items):
        if it["input_ids"].shape[0] != 1:
            raise VLMError(f"sample {i} has batch size {it['input_ids'].shape[0]}; collate single samples")
    if padding_side not in ("left", "right"):
        raise VLMError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    width = max(it["input_ids"].shape[1] for it in items)
    out: dict = {}
    for key in dict.fromkeys(k for it in items for k in it):
        vals = [it.get(key) for it in items]
        if key in ("pixel_values", "image_grid_thw"):  # text-only samples add no images
            out[key] = torch.cat([v for v in vals if v is not None], dim=0)
            continue
        if any(v is None for v in vals):
            raise VLMError(f"key {key!r} is missing from some samples")
        if any(v.shape != it["input_ids"].shape for v, it in zip(vals, items, strict=True)):
            raise VLMError(f"key {key!r} is neither per-token nor an image tensor; cannot collate it")
        fill = pad_token_id if key == "input_ids" else 0
        pads = [v.new_full((1, width - v.shape[1]), fill) for v in vals]
        padded = [torch.cat([p, v] if padding_side == "left" else [v, p], dim=1) for v, p in zip(vals, pads, strict=True)]
        out[key] = torch.cat(padded, dim=0)
    return out
