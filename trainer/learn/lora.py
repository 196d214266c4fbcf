"""LoRA through peft for real-sized models, and bf16 for the frozen base under it.

`apply_lora` puts rank-r adapters on every linear projection of the language model's decoder
layers (attention q/k/v/o and the MLP's gate/up/down, as the LoRA and QLoRA papers do for
LLaMA-class models); the vision tower, the embeddings and lm_head stay frozen. Trainable
adapters are float32 (their AdamW states too); with `base_dtype` bfloat16 the frozen base is
held in bf16, as the published Qwen2.5-VL weights are, which halves its memory.

A LoRA run saves one of two standard forms (`save_lora`):
  - "adapter": peft's adapter_config.json + adapter_model.safetensors beside the processor; its
    base_model_name_or_path is the absolute base directory. transformers loads it (with peft
    installed) and so does agent.vlm.model.load_vlm, which merges it into the base;
  - "merged": a whole transformers directory, the float32 base from disk plus the adapter
    merged in (exact even when training held the base in bf16), with the adapter itself in
    OUT/adapter.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from agent.vlm.model import load_vlm
from trainer.errors import TrainerError
from trainer.learn.checkpoints import save_checkpoint

# the linear layers LoRA adapts: the language model's decoder projections
LORA_TARGET = r".*language_model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"
SAVE_FORMS = ("adapter", "merged")


class LoRAError(TrainerError, ValueError):
    """LoRA settings that cannot work; the message names the value."""


def check_lora(r: int | None, alpha: float | None = None, save: str = "adapter") -> None:
    if r is not None and r < 1:
        raise LoRAError(f"--lora rank must be at least 1, got {r}")
    if alpha is not None and alpha <= 0:
        raise LoRAError(f"--lora-alpha must be > 0, got {alpha}")
    if save not in SAVE_FORMS:
        raise LoRAError(f"--lora-save must be one of {', '.join(SAVE_FORMS)}, got {save!r}")


def is_lora_target(name: str) -> bool:
    """Whether the module of this qualified name gets an adapter (the plan counts with this too)."""
    return re.fullmatch(LORA_TARGET, name) is not None


def apply_lora(model, r: int, alpha: float | None = None, base_dtype=None):
    """The peft model with rank-r adapters (alpha defaults to 2r) on LORA_TARGET; it shares the
    base model's modules. base_dtype (e.g. torch.bfloat16) recasts the frozen weights."""
    from peft import LoraConfig, get_peft_model

    check_lora(r, alpha)
    cfg = LoraConfig(r=r, lora_alpha=alpha or 2 * r, lora_dropout=0.0, target_modules=LORA_TARGET)
    peft_model = get_peft_model(model, cfg)
    if base_dtype is not None:
        for p in peft_model.parameters():
            if not p.requires_grad:
                p.data = p.data.to(base_dtype)
    return peft_model


def plain_state_dict(model, state: dict | None = None) -> dict:
    """The weights, on the CPU, that an adapter-free copy of `model` loads: its own state dict, or,
    where peft put LoRA layers into it, the base weights under the base's names with each active
    adapter's scaling x B @ A added, in float32 (a rollout worker's copy). state: the model's whole
    state dict when its own weights are FSDP2 shards (trainer.learn.distributed.full_state_dict). The
    model itself is not touched: merging into a bf16 base and unmerging again would drift the
    frozen weights a little every time."""
    import sys

    state = {k: v.detach() for k, v in (model.state_dict() if state is None else state).items()}
    layers = {}
    if "peft" in sys.modules:  # no adapters without peft
        from peft.tuners.lora import LoraLayer

        layers = {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}
    if not layers:
        return {k: v.contiguous().cpu() for k, v in state.items()}
    plain = {k.replace(".base_layer.", "."): (v.float() if v.is_floating_point() else v)
             for k, v in state.items() if ".lora_" not in k}
    for name, layer in layers.items():
        if layer.merged:
            continue  # the base weight already holds the delta
        w = plain[f"{name}.weight"]
        for adapter in layer.active_adapters:
            a, b = state[f"{name}.lora_A.{adapter}.weight"].float(), state[f"{name}.lora_B.{adapter}.weight"].float()
            w = w + (b @ a) * layer.scaling[adapter]
        plain[f"{name}.weight"] = w
    return {k: v.contiguous().cpu() for k, v in plain.items()}


def save_lora(peft_model, processor, out_dir, base_dir, form: str = "adapter", extra: dict | None = None,
              state_dict: dict | None = None) -> Path:
    """Save a trained LoRA model as its adapter or merged into the base (see the module doc).
    base_dir: the directory the base weights came from; state_dict: the peft model's whole
    weights when its own are FSDP2 shards (trainer.learn.distributed.full_state_dict)."""
    check_lora(None, None, form)
    out = Path(out_dir)
    adapter_dir = out if form == "adapter" else out / "adapter"
    adapter_dir.mkdir(parents=True, exist_ok=True)
    kw = {} if state_dict is None else {"state_dict": state_dict}
    peft_model.save_pretrained(str(adapter_dir), safe_serialization=True, **kw)
    cfg_path = adapter_dir / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["base_model_name_or_path"] = str(Path(base_dir).resolve())
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    if form == "adapter":
        processor.save_pretrained(str(out))
        if extra is not None:
            (out / "tandem_training.json").write_text(json.dumps(extra, indent=2) + "\n", encoding="utf-8")
        return out
    processor.save_pretrained(str(adapter_dir))  # an adapter directory load_vlm takes: base + adapter, merged
    merged, _ = load_vlm(adapter_dir, device="cpu", dtype="float32")
    return save_checkpoint(merged, processor, out, extra)

