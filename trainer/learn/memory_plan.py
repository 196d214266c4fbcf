"""How much memory one learner process needs, before buying the GPU: `python main.py train plan`.

The model is built from its configuration on the meta device (no weights, no download), which
gives its exact parameter count and, for LoRA, the exact adapter size (the trainer's own target
rule, trainer.learn.lora.is_lora_target). Known published configurations are built in (KNOWN), so
`--model qwen2.5-vl-7b` needs nothing on disk; a checkpoint directory or a config.json works too.

Per process, for one sample per micro-step (how trainer.learn.sft accumulates a batch):
  - weights: float32 master weights, 4 B a parameter (FSDP: a 1/N shard); under LoRA the frozen
    base is 2 B (bf16) or 4 B and the adapters 4 B;
  - bf16 weight copies: autocast keeps the bf16 cast of every trained weight for backward, 2 B a
    trained parameter of the forward (full fine-tuning only; LoRA's base already is bf16);
  - gradients 4 B and AdamW states 8 B a trainable parameter (FSDP: 1/N);
  - activations: what autograd keeps for backward at the given sequence length: a per-token
    cost per decoder layer and per image patch per vision block, plus the logits of the target
    tokens. The coefficients were counted on a Qwen2.5-VL (sdpa attention, no L^2 score matrix)
    by `measure_step`, which this module also offers so the plan can be checked against a real
    step (tests/test_train_scale.py, tests/bench/bench_scale.py).
`plan_ppo` (`train plan --ppo`) counts PPO's learner the same way: the policy with its vision
tower frozen, the critic that copies its backbone, and with --kl the reference policy.
Not counted: the CUDA context and allocator fragmentation (the fit check keeps 10% of the GPU
for them), dataloader and tokenizer memory, and a 2x transient while an FSDP layer is gathered.
"""
from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agent.vlm.model import SUPPORTED_MODEL_TYPES, sft_loss
from trainer.errors import TrainerError
from trainer.learn.distributed import block_of
from trainer.learn.lora import is_lora_target
from trainer.learn.sft import autocast, encode, prepare_model

GIB = 1024 ** 3

_VISION_7B = {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16, "in_channels": 3,
              "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
              "fullatt_block_indexes": [7, 15, 23, 31], "hidden_act": "silu", "tokens_per_second": 2}


def _qwen25(hidden, inter, layers, heads, kv, vocab, tie, vision_inter=3420):
    return {"model_type": "qwen2_5_vl", "tie_word_embeddings": tie,
            "text_config": {"hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
                            "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
                            "max_position_embeddings": 128000, "rms_norm_eps": 1e-6, "tie_word_embeddings": tie,
                            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                                                "mrope_section": [16, 24, 24]}},
            "vision_config": {**_VISION_7B, "intermediate_size": vision_inter, "out_hidden_size": hidden}}


# the published configurations (Hugging Face Qwen/Qwen2.5-VL-*-Instruct config.json; UI-TARS-1.5-7B is
# Qwen2.5-VL-7B's shape)
KNOWN = {
    "qwen2.5-vl-3b": _qwen25(2048, 11008, 36, 16, 2, 151936, True),
    "qwen2.5-vl-7b": _qwen25(3584, 18944, 28, 28, 4, 152064, False),
    "qwen2.5-vl-32b": _qwen25(5120, 27648, 64, 40, 8, 152064, False, vision_inter=3456),
    "qwen2.5-vl-72b": _qwen25(8192, 29568, 80, 64, 8, 152064, False, vision_inter=3456),
}
ALIASES = {"ui-tars-1.5-7b": "qwen2.5-vl-7b", "ui-tars-7b": "qwen2.5-vl-7b"}
GPUS = {"h100": 80, "h200": 141, "a100-80": 80, "a100-40": 40, "l40s": 48, "a10": 24, "rtx4090": 24, "b200": 180}

# activation coefficients (elements kept for backward), counted per module on Qwen2.5-VL by measure_step's
# saved-tensor hook (assets/default_model, h = 128, I = 256: only their sum is pinned down, the split follows
# the layer's code: the MLP keeps 4 I-wide tensors)
LM_PER_TOKEN = (9.3, 4.0)  # per decoder layer: 9.3 h + 4 I per token
LORA_LM_SCALE = {False: 0.88, True: 0.79}  # under LoRA a frozen projection keeps no input for its weight's gradient
VISION_PER_PATCH = (13.3, 4.0)  # per vision block: 13.3 h + 4 I per patch (LoRA: the frozen tower keeps nothing)
PATCH_REST = 5.0  # patch embedding keeps the patch (3 * t * p^2 values), the merger 5 h a patch
EMBED_PER_TOKEN = {False: 2.5, True: 1.5}  # embeddings, rotary positions, final norm (full, LoRA), float32
LOGIT_BYTES = 12  # per target token and vocabulary entry (logits, log-softmax)
ACT_BYTES = {False: (4.0, 4.0, 4.0), True: (3.1, 2.45, 2.75)}  # bytes an element: LM layers, vision blocks, patches


class PlanError(TrainerError, ValueError):
    """A model or setting the plan cannot use; the message names the value."""


@dataclass
class Plan:
    model: str
    params: int
    vision_params: int
    trainable: int
    nproc: int = 1
    shard: str = "ddp"
    bf16: bool = False
    lora: int | None = None
    grad_checkpointing: bool = False
    seq_len: int = 4096
    image_tokens: int = 1024
    target_tokens: int = 256
    parts: dict = field(default_factory=dict)  # bytes per process
    gpu: str = "h100"
    gpu_gb: float = 80.0
    ppo: bool = False  # PPO's learner: the policy, its critic and (with kl) the reference
    kl: bool = False

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        return self.total <= 0.9 * self.gpu_gb * GIB

    def to_dict(self) -> dict:
        return {**asdict(self), "total": self.total, "fits": self.fits}


def model_config(model: str):
    """(name, transformers config) of a known name, a checkpoint directory or a config.json."""
    import transformers

    key = str(model).lower()
    key = ALIASES.get(key, key)
    if key in KNOWN:
        raw, name = KNOWN[key], key
    else:
        p = Path(model)
        path = p / "config.json" if p.is_dir() else p
        if not path.is_file():
            raise PlanError(f"--model {model!r} is not a known configuration ({', '.join([*KNOWN, *ALIASES])}), "
                            "a model directory or a config.json")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise PlanError(f"{path} is not readable JSON ({e})") from None
        name = str(model)

    mtype = raw.get("model_type") if isinstance(raw, dict) else None
    if mtype not in SUPPORTED_MODEL_TYPES:
        raise PlanError(f"{model}: model_type {mtype!r} is not supported; expected one of {', '.join(SUPPORTED_MODEL_TYPES)}")
    fields = {k: v for k, v in raw.items() if k != "model_type"}
    return name, transformers.AutoConfig.for_model(mtype, **fields)


def meta_model(config):
    """The model of a config on the meta device: its shapes, no memory."""
    import torch
    import transformers

    cls = getattr(transformers, SUPPORTED_MODEL_TYPES[config.model_type])
    with torch.device("meta"):
        return cls._from_config(config)


def count_params(model, lora: int | None = None) -> dict:
    """{"total", "vision" (the vision tower's), "trainable" (all, or the adapters rank `lora` puts
    on trainer.learn.lora's targets), "linear" (trained weights of linear layers: what autocast casts to
    bf16), "linear_outside" (those outside the decoder layers and vision blocks), "linear_block"
    (the largest block's), "targets" and "targets_block" (the frozen weights under LoRA's
    adapters, all and the largest block's: what autocast casts when that base is float32)}."""
    import torch

    total = sum(p.numel() for p in model.parameters())
    vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    per_block: dict = {}
    targets: dict = {}
    vision_linear = 0
    for n, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and ".visual." in f".{n}.":
            vision_linear += m.weight.numel()
        if isinstance(m, torch.nn.Linear) and (not lora or is_lora_target(n)):
            size = lora * (m.in_features + m.out_features) if lora else m.weight.numel()
            per_block[block_of(n)] = per_block.get(block_of(n), 0) + size
        if isinstance(m, torch.nn.Linear) and is_lora_target(n):
            targets[block_of(n)] = targets.get(block_of(n), 0) + m.weight.numel()
    linear = sum(per_block.values())
    outside = per_block.get(None, 0)
    return {"total": total, "vision": vision, "trainable": linear if lora else total, "linear": linear,
            "linear_outside": outside, "linear_block": max([v for k, v in per_block.items() if k] or [0]),
            "targets": sum(targets.values()), "targets_block": max(targets.values() or [0]),
            "vision_linear": vision_linear,
            # the lm_head's own weight (none of its own when tied to the embeddings)
            "lm_head": 0 if getattr(model.config, "tie_word_embeddings", False) else model.lm_head.weight.numel()}


@functools.lru_cache(maxsize=8)
def _model_counts(model: str, lora: int | None) -> tuple:
    """(name, config, count_params) of a model and LoRA rank: building a 7B model on the meta
    device takes seconds, and plan_ppo starts from plan_memory's plan."""
    name, config = model_config(model)
    return name, config, count_params(meta_model(config), lora)


def plan_memory(model: str, *, nproc: int = 1, shard: str = "ddp", bf16: bool = False, lora: int | None = None,
                grad_checkpointing: bool = False, seq_len: int = 4096, image_tokens: int = 1024,
                target_tokens: int = 256, gpu: str = "h100") -> Plan:
    """The per-process memory of training `model` with these settings (see the module doc)."""
    if nproc < 1 or seq_len < 1 or target_tokens < 1 or not 0 <= image_tokens <= seq_len:
        raise PlanError(f"need nproc >= 1, seq_len >= 1, target_tokens >= 1 and 0 <= image_tokens <= seq_len; got "
                        f"{nproc}, {seq_len}, {target_tokens}, {image_tokens}")
    if lora is not None and lora < 1:
        raise PlanError(f"--lora rank must be at least 1, got {lora}")
    gpu_gb = gpu_capacity(gpu)
    name, config, counts = _model_counts(model, lora)
    total, vision, trainable = counts["total"], counts["vision"], counts["trainable"]
    plan = Plan(name, total, vision, trainable, nproc, shard, bf16, lora, grad_checkpointing, seq_len, image_tokens,
                min(target_tokens, seq_len), gpu=gpu, gpu_gb=gpu_gb)
    split = nproc if shard == "fsdp" else 1
    # LoRA's frozen base is bf16 with --bf16, except under FSDP2, whose flat per-layer buffers need one
    # dtype: there it stays float32 (sharded) and autocast casts each gathered layer's weights instead
    bf16_base = bf16 and not (lora and split > 1)
    if lora:
        plan.parts["weights"] = (total * (2 if bf16_base else 4) + 4 * trainable) // split
    else:
        plan.parts["weights"] = 4 * total // split
    # a block under checkpointing casts its weights again in its recompute: only one block's copies at a time
    copies = counts["linear_outside"] + counts["linear_block"] if grad_checkpointing else counts["linear"]
    if lora and bf16 and not bf16_base:  # the float32 base under the adapters is cast too (not measured)
        copies += counts["targets_block"] if grad_checkpointing else counts["targets"]
    plan.parts["bf16 weight copies"] = 2 * copies if bf16 else 0
    plan.parts["gradients"] = 4 * trainable // split
    plan.parts["optimizer (AdamW)"] = 8 * trainable // split
    kept, recompute = activation_bytes(config, seq_len, image_tokens, plan.target_tokens, bf16=bf16,
                                       ckpt=grad_checkpointing, lora=bool(lora))
    plan.parts["activations"] = int(kept)
    plan.parts["recompute (one layer)"] = int(recompute)
    return plan


def plan_ppo(model: str, *, nproc: int = 1, shard: str = "ddp", bf16: bool = False, lora: int | None = None,
             grad_checkpointing: bool = False, seq_len: int = 4096, image_tokens: int = 1024,
             target_tokens: int = 256, gpu: str = "h100", kl: bool = False) -> Plan:
    """The per-process memory of `train ppo`'s learner (trainer.learn.ppo.Learner) with these settings:
    the policy as `plan_memory` counts it but with its vision tower frozen (PPO's default: each
    screenshot is encoded once, outside the graph), a critic that copies the backbone (no lm_head,
    a scalar head; LoRA: the base too, with its own adapters), both trained with AdamW, and with
    `kl` the frozen start policy. Under FSDP2 everything but the vision towers (kept whole) is split
    N ways, and LoRA's base stays float32. Activations are one micro-batch of seq_len tokens through
    the policy (the critic's pass comes after it, and is smaller: no logits)."""
    plan = plan_memory(model, nproc=nproc, shard=shard, bf16=bf16, lora=lora, grad_checkpointing=grad_checkpointing,
                       seq_len=seq_len, image_tokens=image_tokens, target_tokens=target_tokens, gpu=gpu)
    name, config, c = _model_counts(model, lora)
    total, vision, hidden = c["total"], c["vision"], config.get_text_config().hidden_size
    split = nproc if shard == "fsdp" else 1
    bf16_base = bf16 and lora and split == 1
    base_b = 2 if bf16_base else 4

    def whole(n_params: int, per: float) -> int:  # bytes of a model on a rank: vision whole, the rest 1/split
        return int(vision * per + (n_params - vision) * per / split)

    head = hidden + 1  # the critic's value head (float32, trained)
    backbone = total - c["lm_head"]  # what the critic copies
    if lora:
        policy_w = whole(total, base_b) + 4 * c["trainable"] // split
        critic_w = whole(backbone, base_b) + 4 * (c["trainable"] + head) // split
        trained = 2 * c["trainable"] + head
    else:
        policy_w, critic_w = whole(total, 4), whole(backbone, 4) + 4 * head // split
        trained = (total - vision) + (backbone - vision) + head
    copies = 0
    if bf16:  # autocast's casts of what is in the graph (not the frozen vision towers), kept for backward;
        # policy and critic passes do not overlap: one model's at a time; checkpointing: one block's
        if lora:
            copies = 2 * c["trainable"]
            if not bf16_base:  # a float32 base under the adapters is cast too
                copies += 2 * (c["targets_block"] if grad_checkpointing else c["targets"])
        else:
            copies = 2 * (c["linear_outside"] + c["linear_block"] if grad_checkpointing
                          else c["linear"] - c["vision_linear"])
    plan.ppo, plan.kl = True, kl
    plan.trainable = trained
    plan.parts = {"policy weights": policy_w, "critic weights": critic_w}
    if kl:
        plan.parts["reference weights"] = policy_w
    plan.parts["bf16 weight copies"] = copies
    plan.parts["gradients"] = 4 * trained // split
    plan.parts["optimizer (AdamW)"] = 8 * trained // split
    kept, recompute = activation_bytes(config, seq_len, image_tokens, plan.target_tokens, bf16=bf16,
                                       ckpt=grad_checkpointing, lora=bool(lora), vision_frozen=True)
    plan.parts["activations"] = int(kept)
    plan.parts["recompute (one layer)"] = int(recompute)
    return plan


def activation_bytes(config, seq_len: int, image_tokens: int, target_tokens: int, *, bf16: bool, ckpt: bool,
                     lora: bool, vision_frozen: bool = False) -> tuple[float, float]:
    """(bytes autograd keeps through one sample's forward, bytes one layer's recompute adds in
    backward under gradient checkpointing), from the coefficients above."""
    t, v = config.text_config, config.vision_config
    b_lm, b_vis, b_patch = ACT_BYTES[bf16]
    merge = getattr(v, "spatial_merge_size", 2)
    # LoRA (and PPO by default) leaves the vision tower frozen: no graph there
    patches = 0 if lora or vision_frozen else image_tokens * merge * merge
    v_hidden = getattr(v, "hidden_size", getattr(v, "embed_dim", 0))
    v_inter = getattr(v, "intermediate_size", 4 * v_hidden)
    lm_layer = seq_len * (LM_PER_TOKEN[0] * t.hidden_size + LM_PER_TOKEN[1] * t.intermediate_size) * b_lm
    lm_layer *= LORA_LM_SCALE[bf16] if lora else 1.0
    vis_block = patches * (VISION_PER_PATCH[0] * v_hidden + VISION_PER_PATCH[1] * v_inter) * b_vis
    if ckpt:  # each block keeps only its input (float32 hidden states); one block's whole set lives again in backward
        lm, vis = t.num_hidden_layers * seq_len * t.hidden_size * 4, v.depth * patches * v_hidden * 4
        recompute = max(lm_layer, vis_block)
    else:
        lm, vis, recompute = t.num_hidden_layers * lm_layer, v.depth * vis_block, 0
    patch_dim = 3 * getattr(v, "temporal_patch_size", 2) * v.patch_size ** 2
    rest = seq_len * EMBED_PER_TOKEN[lora] * t.hidden_size * 4 + patches * (patch_dim + PATCH_REST * v_hidden) * b_patch
    logits = target_tokens * t.vocab_size * LOGIT_BYTES
    return lm + vis + rest + logits, recompute


def gpu_capacity(gpu) -> float:
    """GiB of a GPU named in GPUS (its marketed GB, which is about its GiB), or a number."""
    key = str(gpu).lower()
    if key in GPUS:
        return float(GPUS[key])
    try:
        gb = float(key.removesuffix("gb"))
    except ValueError:
        gb = 0.0
    if gb <= 0:
        raise PlanError(f"--gpu {gpu!r} is neither a GPU name ({', '.join(GPUS)}) nor a number of GB")
    return gb


def format_plan(plan: Plan) -> str:
    """The per-process table `train plan` prints."""
    how = (["PPO learner (policy + critic" + (" + reference" if plan.kl else "") + ", vision frozen)"] if plan.ppo else [])
    how += [f"{plan.nproc} process{'es' if plan.nproc > 1 else ''}" + (f" ({plan.shard})" if plan.nproc > 1 else ""),
           "bf16 autocast" if plan.bf16 else "float32", f"LoRA r={plan.lora}" if plan.lora else "all weights trained"]
    if plan.grad_checkpointing:
        how.append("gradient checkpointing")
    unit, scale = ("GiB", GIB) if plan.total >= GIB else ("MiB", 1024 ** 2)
    trainable = f"{plan.trainable / 1e9:.3g}B" if plan.trainable >= 1e9 else f"{plan.trainable / 1e6:.4g}M"
    lines = [f"{plan.model}: {plan.params / 1e9:.3g}B parameters ({plan.vision_params / 1e9:.3g}B vision), "
             f"{trainable} trainable; " + ", ".join(how),
             f"one sample of {plan.seq_len} tokens ({plan.image_tokens} image tokens), {plan.target_tokens} target tokens",
             "", f"| per process | {unit} |", "| --- | ---: |"]
    lines += [f"| {k} | {v / scale:.2f} |" for k, v in plan.parts.items()]
    lines.append(f"| total | {plan.total / scale:.2f} |")
    verdict = "fits" if plan.fits else "does NOT fit"
    lines += ["", f"{plan.gpu} ({plan.gpu_gb:g} GiB): {verdict}: {plan.total / GIB:.2f} GiB of the "
                  f"{0.9 * plan.gpu_gb:.1f} GiB left after 10% for the CUDA context and fragmentation"]
    return "\n".join(lines)


# ---------------------------------------------------------------- measuring a real step


def measure_step(model, processor, sample, cfg) -> dict:
    """Bytes of one real training step of trainer.learn.sft's path (prepare_model, autocast, sft_loss,
    AdamW): the tensors of weights, gradients and optimizer states after it; what autograd saved
    for backward (activations, unique storages that are not parameters; bf16 casts of weights
    counted apart as "bf16 weight copies"); and the growth of the process's peak RSS during the
    step (Linux: VmHWM reset through /proc/self/clear_refs), which includes transients."""
    import torch

    trained = prepare_model(model, cfg)
    trained.train()
    b = encode(processor, sample)
    opt = torch.optim.AdamW([p for p in trained.parameters() if p.requires_grad], lr=1e-4)
    param_ptrs = {p.untyped_storage().data_ptr() for p in trained.parameters()}
    weight_shapes = {tuple(p.shape) for p in trained.parameters() if p.dim() == 2}
    saved: dict = {}

    def pack(t):
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in param_ptrs and ptr not in saved:
            copy = t.dtype == torch.bfloat16 and t.dim() == 2 and tuple(t.shape) in weight_shapes
            saved[ptr] = ("bf16 weight copies" if copy else "activations", st.nbytes())
        return t

    rss0 = _rss_reset()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with autocast(trained, cfg):
            loss = sft_loss(trained, b, b["assistant_mask"])
        loss.backward()
    opt.step()
    peak = _rss_peak()

    def nbytes(ts):
        return sum(t.numel() * t.element_size() for t in ts if t is not None)

    out = {"weights": nbytes(trained.parameters()),
           "bf16 weight copies": sum(n for kind, n in saved.values() if kind == "bf16 weight copies"),
           "gradients": nbytes(p.grad for p in trained.parameters()),
           "optimizer (AdamW)": nbytes(v for st in opt.state.values() for v in st.values() if torch.is_tensor(v) and v.dim()),
           "activations": sum(n for kind, n in saved.values() if kind == "activations"),
           "peak RSS growth": (peak - rss0) if rss0 and peak else None,
           "seq_len": int(b["input_ids"].shape[1]), "target_tokens": int(b["assistant_mask"].sum()),
           "image_tokens": int((b["input_ids"] == model.config.image_token_id).sum())}
    if cfg.lora_r:
        trained.merge_and_unload()
    return out


def _status_kb(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _rss_reset() -> int | None:
    """The RSS now, after resetting the peak (VmHWM) to it; None where /proc cannot do that."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    return _status_kb("VmRSS")


def _rss_peak() -> int | None:
    return _status_kb("VmHWM")
