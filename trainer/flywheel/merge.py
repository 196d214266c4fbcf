"""Merging specialist models by parameter interpolation: theta = sum_k alpha_k * theta_k, with
alpha_k >= 0 and sum alpha_k = 1, over transformers directories of identical architecture
(same config, same tensor names, shapes and dtypes). The merged directory copies the first
parent's config, tokenizer and processor, so it loads and serves like any checkpoint.
"""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from trainer.flywheel import FlywheelError

ALPHA_TOLERANCE = 1e-6
# config keys that say nothing about the architecture (they differ between saves of one model)
_IGNORED_CONFIG = ("_name_or_path", "transformers_version", "torch_dtype", "dtype", "architectures")


def check_alphas(alphas, n_models: int) -> list[float]:
    """The alphas as floats, or a FlywheelError naming the bad value."""
    if n_models < 2:
        raise FlywheelError(f"merging needs at least two models, got {n_models}")
    if len(alphas) != n_models:
        raise FlywheelError(f"{len(alphas)} alphas for {n_models} models: give one alpha per model")
    out = []
    for k, a in enumerate(alphas):
        try:
            v = float(a)
        except (TypeError, ValueError):
            raise FlywheelError(f"alpha {k + 1} is not a number: {a!r}") from None
        if not math.isfinite(v):
            raise FlywheelError(f"alpha {k + 1} is not finite: {a!r}")
        if v < 0:
            raise FlywheelError(f"alpha {k + 1} is negative ({v}); every alpha must be >= 0")
        out.append(v)
    total = sum(out)
    if abs(total - 1.0) > ALPHA_TOLERANCE:
        raise FlywheelError(f"the alphas sum to {total:g}, not 1 ({', '.join(f'{a:g}' for a in out)})")
    return out


def _weights(model_dir: Path) -> list[Path]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FlywheelError(f"{model_dir}: no .safetensors weights (merging reads transformers safetensors directories)")
    return files


def _load(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    state = {}
    for f in _weights(model_dir):
        try:
            state.update(load_file(str(f)))
        except Exception as e:  # a damaged file raises SafetensorError, OSError, ...
            raise FlywheelError(f"{f}: the weights do not load: {e}") from None
    return state


def _arch(model_dir: Path) -> dict:
    p = model_dir / "config.json"
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise FlywheelError(f"{p}: not a readable config ({e})") from None

    def strip(d):
        return {k: strip(v) if isinstance(v, dict) else v for k, v in d.items() if k not in _IGNORED_CONFIG}

    return strip(cfg)


def merge_models(model_dirs, alphas, out_dir) -> Path:
    """Write the merged model to out_dir and return it. Tensors are combined in float32 and
    stored in each parent's dtype; with one alpha at 1 the result equals that parent exactly."""
    import torch
    from safetensors.torch import save_file

    dirs = [Path(d) for d in model_dirs]
    alphas = check_alphas(alphas, len(dirs))
    for d in dirs:
        if not d.is_dir():
            raise FlywheelError(f"model directory {d} does not exist")
    arch0 = _arch(dirs[0])
    for d in dirs[1:]:
        if _arch(d) != arch0:
            raise FlywheelError(f"{d} has a different architecture from {dirs[0]} (config.json differs); "
                                "only identical architectures can be merged")
    states = [_load(d) for d in dirs]
    names = set(states[0])
    for d, st in zip(dirs[1:], states[1:], strict=True):
        if set(st) != names:
            diff = sorted(names ^ set(st))[:3]
            raise FlywheelError(f"{d} has different tensors from {dirs[0]} (e.g. {', '.join(diff)})")
        for k, t in st.items():
            if t.shape != states[0][k].shape or t.dtype != states[0][k].dtype:
                raise FlywheelError(f"tensor {k}: {tuple(t.shape)} {t.dtype} in {d} vs "
                                    f"{tuple(states[0][k].shape)} {states[0][k].dtype} in {dirs[0]}")
    merged = {}
    for k in sorted(names):
        ref = states[0][k]
        if not ref.is_floating_point():  # integer buffers cannot be interpolated: keep the first
            merged[k] = ref.clone()
            continue
        acc = torch.zeros(ref.shape, dtype=torch.float32)
        for a, st in zip(alphas, states, strict=True):
            if a != 0.0:
                acc += a * st[k].float()
        merged[k] = acc.to(ref.dtype).contiguous()
    out = Path(out_dir)
    if out.exists():
        raise FlywheelError(f"{out} already exists; merging never overwrites a directory")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(dirs[0], tmp, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    save_file(merged, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "tandem_merge.json").write_text(json.dumps(
        {"parents": [str(d) for d in dirs], "alphas": alphas}, indent=2) + "\n", encoding="utf-8")
    tmp.rename(out)
    return out
