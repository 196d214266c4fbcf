"""Local Qwen-VL-class models: Qwen2-VL, Qwen2.5-VL (UI-TARS-1.5-7B) and Qwen3-VL, or the tiny
ones trainer.learn.tiny_model builds.

Loading, generation, and per-token log-probs for SFT/PPO; chat -> inputs lives in
agent.vlm.inputs and is re-exported here, so `from agent import vlm` is the whole API. torch and
transformers are imported inside the functions: importing this module stays cheap, and the
agent runs without them when it uses an endpoint.

Log-probs are of token t given the tokens before it, aligned with input_ids (position 0 has
none), at `temperature` (log_softmax(logits / T)): pass the temperature you sampled with.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.vlm import pointer, typed_copy
from agent.vlm.inputs import (  # noqa: F401  (re-exported: the public API)
    END_OF_TEXT,
    IM_END,
    IM_START,
    MODEL_INPUT_KEYS,
    VLMError,
    assistant_token_mask,
    build_inputs,
    collate_inputs,
    extend_inputs,
    image_token_count,
    resized_image_size,
    to_model,
    to_template_messages,
)

SUPPORTED_MODEL_TYPES = {
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",  # UI-TARS-1.5, Qwen2.5-VL
    "qwen2_vl": "Qwen2VLForConditionalGeneration",  # UI-TARS-1.0, Qwen2-VL
    "qwen3_vl": "Qwen3VLForConditionalGeneration",  # Qwen3-VL: learned absolute positions in its vision tower
}
# the stock processor class of each model type (what a checkpoint's processor_class names)
STOCK_PROCESSORS = {"qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen2_vl": "Qwen2_5_VLProcessor",
                    "qwen3_vl": "Qwen3VLProcessor"}
_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16", "half": "float16",
           "float32": "float32", "fp32": "float32", "float": "float32"}


_CLASSES: dict = {}


def processor_class(model_type: str = "qwen2_5_vl"):
    """The image-only processor class for a model type. The stock processors insist on a video
    processor, which needs torchvision, which does not load beside this torch build."""
    stock = STOCK_PROCESSORS.get(model_type)
    if stock is None:
        raise VLMError(f"model_type {model_type!r} is not supported here; expected one of {', '.join(SUPPORTED_MODEL_TYPES)}")
    if stock not in _CLASSES:
        import transformers

        base = getattr(transformers, stock)

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            base.__init__(self, image_processor=image_processor, tokenizer=tokenizer, video_processor=None,
                          chat_template=chat_template, **kwargs)

        name = "ImageOnlyQwenVLProcessor" if stock == "Qwen2_5_VLProcessor" else f"ImageOnly{stock}"
        _CLASSES[stock] = type(name, (base,), {"__init__": __init__, "__doc__": f"{stock} without the video half (no torchvision needed)."})
    return _CLASSES[stock]


def __getattr__(name):  # `from agent.vlm.model import ImageOnlyQwenVLProcessor` imports transformers only then
    if name == "ImageOnlyQwenVLProcessor":
        return processor_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------- loading

def check_model_dir(model_dir) -> dict:
    """The directory's config.json as a dict; raises VLMError listing everything missing."""
    d = Path(model_dir)
    if not d.is_dir():
        raise VLMError(f"model directory {d} does not exist or is not a directory")
    missing = []
    config = None
    if not (d / "config.json").is_file():
        missing.append("config.json")
    else:
        try:
            config = json.loads((d / "config.json").read_text(encoding="utf-8"))
        except (ValueError, OSError) as e:
            raise VLMError(f"model directory {d}: config.json is not readable JSON ({e})") from e
    weights = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
    if not any((d / w).is_file() for w in weights):
        missing.append("weights (model.safetensors or model.safetensors.index.json)")
    if not ((d / "tokenizer.json").is_file() or ((d / "vocab.json").is_file() and (d / "merges.txt").is_file())):
        missing.append("tokenizer (tokenizer.json, or vocab.json + merges.txt)")
    if not ((d / "preprocessor_config.json").is_file() or _has_key(d / "processor_config.json", "image_processor")):
        missing.append("image processor config (preprocessor_config.json)")
    if not ((d / "chat_template.jinja").is_file() or (d / "chat_template.json").is_file()
            or _has_key(d / "tokenizer_config.json", "chat_template")):
        missing.append("chat template (chat_template.jinja or chat_template.json)")
    if missing:
        raise VLMError(f"{d} is not a usable Qwen-VL model directory: missing {'; '.join(missing)}")
    mtype = config.get("model_type") if isinstance(config, dict) else None
    if mtype not in SUPPORTED_MODEL_TYPES:
        raise VLMError(f"{d}: model_type {mtype!r} is not supported here; expected one of {', '.join(SUPPORTED_MODEL_TYPES)}")
    return config


def _has_key(path: Path, key: str) -> bool:
    try:
        return key in json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


def load_processor(model_dir):
    """The image-only processor of a model directory (tokenizer, image processor, chat template)."""
    config = check_model_dir(model_dir)
    try:
        proc = processor_class(config["model_type"]).from_pretrained(str(model_dir))
    except Exception as e:  # a damaged tokenizer.json / preprocessor config, whatever type it raises
        raise VLMError(f"{model_dir}: the tokenizer or image processor did not load: {e}") from e
    if not proc.chat_template:
        raise VLMError(f"{model_dir}: the processor loaded without a chat template")
    return proc


# the stock video processor of each model type, which `AutoProcessor` and `transformers serve` build
STOCK_VIDEO_PROCESSORS = {"qwen2_5_vl": "Qwen2VLVideoProcessor", "qwen2_vl": "Qwen2VLVideoProcessor",
                          "qwen3_vl": "Qwen3VLVideoProcessor"}
_VIDEO_KEYS = ("do_convert_rgb", "do_normalize", "do_rescale", "do_resize", "image_mean", "image_std", "merge_size",
               "patch_size", "resample", "rescale_factor", "size", "temporal_patch_size")


def name_stock_processor(model_dir) -> None:
    """Name the stock processor class in a saved directory's configs, as UI-TARS's files do
    (our image-only subclass is a loading detail), and write the separate configs that stock
    tools read: preprocessor_config.json (the image processor, for AutoImageProcessor and older
    transformers) and video_preprocessor_config.json (the video processor the stock processor
    class builds, with the image processor's patching and sizes). The model type comes from the
    directory's config.json."""
    d = Path(model_dir)
    model_type = json.loads((d / "config.json").read_text(encoding="utf-8"))["model_type"]
    stock = STOCK_PROCESSORS[model_type]
    try:
        image = json.loads((d / "processor_config.json").read_text(encoding="utf-8")).get("image_processor")
    except (OSError, ValueError):
        image = None
    if image:
        (d / "preprocessor_config.json").write_text(json.dumps({**image, "processor_class": stock}, indent=2) + "\n",
                                                    encoding="utf-8")
        video = {k: image[k] for k in _VIDEO_KEYS if k in image}
        video.update(video_processor_type=STOCK_VIDEO_PROCESSORS[model_type], processor_class=stock)
        (d / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n", encoding="utf-8")
    for name in ("processor_config.json", "tokenizer_config.json", "preprocessor_config.json"):
        path = d / name
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            if "processor_class" in data:
                data["processor_class"] = stock
                path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def resolve_device_dtype(device=None, dtype=None):
    """(torch.device, torch.dtype): cuda + bf16 when there is a GPU, else cpu + float32."""
    import torch

    try:
        dev = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    except (RuntimeError, TypeError) as e:
        raise VLMError(f"unknown device {device!r} ({e})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise VLMError(f"device {device!r} was asked for, but torch sees no CUDA GPU")
    if dtype is None:
        if dev.type == "cuda":
            dt = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        else:
            dt = torch.float32  # bf16 matmuls on CPU are slow and lossy for training
    elif isinstance(dtype, str):
        name = _DTYPES.get(dtype.lower())
        if name is None:
            raise VLMError(f"unknown dtype {dtype!r}; expected one of {', '.join(sorted(_DTYPES))}")
        dt = getattr(torch, name)
    else:
        dt = dtype
    return dev, dt


def load_vlm(model_dir, device=None, dtype=None):
    """(model, processor) for a Qwen2-VL / Qwen2.5-VL / Qwen3-VL checkpoint directory, in eval mode.
    A peft LoRA adapter directory (adapter_config.json naming its base, no weights of its own)
    loads as its base with the adapter merged in (needs peft). Raises VLMError naming the
    directory and what is missing when it is not one."""
    base = lora_adapter_base(model_dir)
    if base is not None:
        return _load_adapter(model_dir, base, device, dtype)
    config = check_model_dir(model_dir)
    import transformers

    dev, dt = resolve_device_dtype(device, dtype)
    cls = getattr(transformers, SUPPORTED_MODEL_TYPES[config["model_type"]])
    processor = load_processor(model_dir)
    # device_map would need accelerate (not a dependency): load on the CPU, then move.
    try:
        model = cls.from_pretrained(str(model_dir), dtype=dt)
    except Exception as e:  # damaged or mismatched weights raise many types (SafetensorError, OSError, ...)
        raise VLMError(f"{model_dir}: the weights did not load: {e}") from e

    try:
        pointer.load_head(model, model_dir)  # the element-list pointer, when the checkpoint has one
    except Exception as e:  # a damaged side file names itself
        raise VLMError(f"{model_dir}: the pointer head did not load: {e}") from e
    model.to(dev).eval()
    from agent.vlm import fast_vision  # lazy: imports torch at its top; agent.vlm.model stays cheap to import
    fast_vision.install(model)  # exact vision-tower savings (TANDEM_FAST_VISION=0: the stock path)
    return model, processor


def lora_adapter_base(model_dir) -> Path | None:
    """The base directory a peft adapter directory names; None for a whole-model directory."""
    d = Path(model_dir)
    if not (d / "adapter_config.json").is_file() or any(
            (d / w).is_file() for w in ("model.safetensors", "model.safetensors.index.json")):
        return None
    try:
        base = json.loads((d / "adapter_config.json").read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, ValueError) as e:
        raise VLMError(f"{d}: adapter_config.json is not readable JSON ({e})") from e
    if not base:
        raise VLMError(f"{d}: adapter_config.json names no base_model_name_or_path")
    return Path(base)


def _load_adapter(adapter_dir, base, device, dtype):
    try:
        from peft import PeftModel
    except ImportError:
        raise VLMError(f"{adapter_dir} is a LoRA adapter; loading it needs peft (pip install peft)") from None
    model, processor = load_vlm(base, device=device, dtype=dtype)
    try:
        model = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    except Exception as e:  # a damaged or mismatched adapter raises many types
        raise VLMError(f"{adapter_dir}: the LoRA adapter did not load onto {base}: {e}") from e
    return model.eval(), processor  # the base's processor: training a LoRA adapter leaves it as it was


# ---------------------------------------------------------------- generation

@dataclass
class Generation:
    text: str  # decoded, special tokens dropped
    token_ids: list[int] = field(default_factory=list)  # generated tokens, <|im_end|> included when emitted
    logprobs: list[float] = field(default_factory=list)  # log p of each token at the sampling temperature
    prompt_tokens: int = 0
    seconds: float = 0.0
    inputs: dict | None = field(default=None, repr=False)  # the prompt inputs (for extend_inputs)
    pointer: list[int] | None = None  # per click site, the element-list entry chosen (agent.vlm.pointer)
    # the prompt as the model read it: its token ids and its images' content keys (agent.vlm.batch.image_key),
    # in order, so a learner rebuilds the forward without tokenizing again (None: not recorded)
    prompt_ids: list[int] | None = None
    image_keys: list[str] | None = None

    @property
    def tokens_per_second(self) -> float:
        return len(self.token_ids) / self.seconds if self.seconds > 0 else 0.0


def stop_token_ids(processor) -> list[int]:
    tok = processor.tokenizer
    unk = getattr(tok, "unk_token_id", None)
    ids = [tok.convert_tokens_to_ids(t) for t in (IM_END, END_OF_TEXT)]
    return [i for i in ids if i is not None and i != unk]


VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")


def vision_token_ids(processor) -> list[int]:
    """Ids of the vision placeholders the tokenizer has (none of them is ever a reply token)."""
    tok = processor.tokenizer
    unk = getattr(tok, "unk_token_id", None)
    ids = (tok.convert_tokens_to_ids(t) for t in VISION_TOKENS)
    return sorted({i for i in ids if i is not None and i != unk})


def generation_kwargs(processor, max_new_tokens: int, temperature: float, top_p: float = 1.0) -> dict:
    """`model.generate` keywords for a reply: stop at <|im_end|> / <|endoftext|>, never emit a
    vision placeholder, logits kept for log-probs; sampling at `temperature` (0: greedy) with
    top_k off, so the sampled distribution is exactly softmax(logits / T), what PPO scores."""
    if max_new_tokens < 1:
        raise VLMError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if temperature < 0:
        raise VLMError(f"temperature must be >= 0, got {temperature}")
    stops = stop_token_ids(processor)
    if not stops:
        raise VLMError("the tokenizer has neither <|im_end|> nor <|endoftext|>: generation would never stop")
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=temperature > 0, eos_token_id=stops, pad_token_id=stops[-1],
                  return_dict_in_generate=True, output_logits=True)
    banned = vision_token_ids(processor)
    if banned:
        kwargs["suppress_tokens"] = banned
    if temperature > 0:
        kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
    return kwargs


def generate(model, processor, messages, images=None, max_new_tokens: int = 256, temperature: float = 0.0,
             seed: int | None = None, *, top_p: float = 1.0, details: bool = False):
    """The assistant's reply to a chat: the text, or a Generation with token ids and per-token
    log-probs when details is set. temperature 0 is greedy; with a seed, sampling is
    reproducible and the global RNG state is left as it was.

    Vision placeholders (<|image_pad|> ...) are never generated: one in a reply would make the
    reply impossible to score again (the processor would look for an image behind it), and an
    untrained model emits them. The log-probs are still those of the model's own distribution
    (the raw logits), which is what action_logprobs computes when the reply is re-scored."""
    import torch

    kwargs = generation_kwargs(processor, max_new_tokens, temperature, top_p)
    inputs = build_inputs(processor, messages, images, add_generation_prompt=True)
    sample = temperature > 0
    model_inputs = to_model(inputs, model)
    devices = [model.device] if model.device.type == "cuda" else []
    t0 = time.perf_counter()

    with_pointer = pointer.head_of(model) is not None
    if with_pointer:  # the head reads the last hidden states of the list's entries and of each `_box='(`
        kwargs["output_hidden_states"] = True
    n_prompt = inputs["input_ids"].shape[1]
    choices = None
    with torch.random.fork_rng(devices=devices, enabled=seed is not None), torch.no_grad():
        if seed is not None:
            torch.manual_seed(seed)
        out = model.generate(**model_inputs, **kwargs)
        gen = out.sequences[0, n_prompt:]
        if len(out.logits) and gen.numel():
            logits = torch.stack([lg[0] for lg in out.logits[: gen.numel()]]).float()
            lp = torch.log_softmax(logits / (temperature if sample else 1.0), dim=-1)
            logprobs = lp.gather(1, gen.unsqueeze(1)).squeeze(1).tolist()
        else:
            logprobs = []
        ids = gen.tolist()  # a batch of one is never padded: every id here was sampled
        if with_pointer:
            got = pointer.apply_to_generation(model, processor.tokenizer, inputs["input_ids"][0].tolist(), ids,
                                              logprobs, pointer.generated_hidden(out, 0, n_prompt, n_prompt),
                                              temperature if sample else 0.0)
            if got is not None:
                ids, logprobs, choices = got
            copied = typed_copy.apply_to_generation(processor.tokenizer, inputs["input_ids"][0].tolist(), ids, logprobs)
            if copied is not None:
                ids, logprobs = copied
    seconds = time.perf_counter() - t0
    text = processor.tokenizer.decode(ids, skip_special_tokens=True)
    if not details:
        return text
    return Generation(text, ids, logprobs, n_prompt, seconds, inputs, choices, inputs["input_ids"][0].tolist())


# ---------------------------------------------------------------- log-probs and losses

def action_logprobs(model, inputs: dict, target_mask, *, temperature: float = 1.0, return_entropy: bool = False,
                    return_hidden: bool = False):
    """Per-token log-probs (with gradients) of the masked tokens, as a float32 tensor like
    input_ids, 0 off the mask. Logits are computed only where needed (the vocab is 152k for
    UI-TARS). With return_entropy, also the policy entropy at those tokens."""
    import torch

    ids = inputs["input_ids"]
    mask = target_mask.to(ids.device).bool()
    if mask.shape != ids.shape:
        raise VLMError(f"target_mask shape {tuple(mask.shape)} does not match input_ids {tuple(ids.shape)}")
    if mask[:, 0].any():
        raise VLMError("target_mask marks position 0, which has no preceding token to predict it from")
    if not mask.any():
        raise VLMError("target_mask marks no tokens")
    if temperature <= 0:
        raise VLMError(f"temperature must be > 0 to score tokens, got {temperature}")
    model_inputs = to_model(inputs, model)
    dev = model.device
    mask = mask.to(dev)
    predict_from = torch.zeros_like(mask)
    predict_from[:, :-1] = mask[:, 1:]  # logits at t-1 predict token t
    out = model(**model_inputs, logits_to_keep=predict_from, use_cache=False, output_hidden_states=return_hidden)
    logits = out.logits.reshape(-1, out.logits.shape[-1]).float() / temperature
    lp_all = torch.log_softmax(logits, dim=-1)
    targets = model_inputs["input_ids"][mask]  # row-major, same order as the kept positions
    chosen = lp_all.gather(1, targets.unsqueeze(1)).squeeze(1)
    result = torch.zeros(mask.shape, dtype=torch.float32, device=dev)
    result = result.masked_scatter(mask, chosen)
    extra = (out.hidden_states[-1],) if return_hidden else ()  # [B, T, H]: the last layer's states
    if not return_entropy:
        return (result, *extra) if extra else result
    ent = -(lp_all.exp() * lp_all).sum(-1)
    return (result, torch.zeros(mask.shape, dtype=torch.float32, device=dev).masked_scatter(mask, ent), *extra)


POINTER_DIGIT_WEIGHT = 0.1  # the digits the pointer writes keep this much of their cross-entropy


def sft_loss(model, inputs: dict, target_mask):
    """Mean cross-entropy over the masked (assistant) tokens. With a pointer head and a labelled
    layout in inputs["pointer"] (trainer.learn.sft.encode), the digits the pointer writes count
    POINTER_DIGIT_WEIGHT each and every click site adds the pointer's cross-entropy on the
    demonstrated entry, counted like one token."""
    lay = inputs.get("pointer")
    if lay is None or pointer.head_of(model) is None:
        lp = action_logprobs(model, inputs, target_mask)
        return -lp.sum() / target_mask.sum().clamp(min=1).to(lp.device)
    lp, hidden = action_logprobs(model, inputs, target_mask, return_hidden=True)
    weights = {p: w for p, w in pointer.digit_weights(lay, POINTER_DIGIT_WEIGHT).items()}
    if weights:
        import torch

        w = torch.ones_like(lp)
        cols = torch.tensor(list(weights), device=lp.device)
        w[0, cols] = torch.tensor(list(weights.values()), device=lp.device)
        lp = lp * w
    total = -lp.sum() + pointer.site_loss(model, lay, hidden[0])
    return total / target_mask.sum().clamp(min=1).to(lp.device)
