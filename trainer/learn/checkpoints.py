"""Saving a trained model as a standard transformers checkpoint (the pointer head in a file of
its own), shared by SFT, LoRA, PPO and the recipe."""
from __future__ import annotations

import json
from pathlib import Path

from agent.vlm import pointer
from agent.vlm.model import name_stock_processor


def save_checkpoint(model, processor, out_dir, extra: dict | None = None, *, state_dict=None) -> Path:
    """A standard transformers directory: config, safetensors weights, tokenizer, processor.
    state_dict: the weights to write instead of the model's own (e.g. gathered from FSDP2 shards)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # the pointer head goes to a file of its own: stock loaders read model.safetensors alone
    stock, head = pointer.split_state(state_dict if state_dict else model.state_dict())
    model.save_pretrained(str(out), safe_serialization=True, state_dict=stock)
    if head:
        pointer.save_head(head, out)
    elif (out / pointer.HEAD_FILE).exists():
        (out / pointer.HEAD_FILE).unlink()  # an older checkpoint's head does not belong to these weights
    processor.save_pretrained(str(out))

    name_stock_processor(out)
    if extra is not None:
        (out / "tandem_training.json").write_text(json.dumps(extra, indent=2) + "\n", encoding="utf-8")
    return out
