"""SFT and CT: cross-entropy on the assistant's own tokens only (its thought and action).

A sample is (messages, target): the chat the model saw and the reply it should write. The loss
covers exactly the target's tokens and its closing <|im_end|> (agent.vlm.model.assistant_token_mask
with last_only): the system prompt, the instruction, the screenshots, the history and the role
header are context, never targets.

SFT and CT are the same objective on different data, as in the UI-TARS-2 flywheel: SFT reads the
high-quality pool (episodes routed "sft"), CT (continual pre-training) the larger, lower-quality
pool (routed "ct"), usually first and at a lower learning rate. The route picks the data; the
`--ct` flag only changes the defaults (see cli_train).

Samples come from three places, all giving the same message layout the agent prompts with:
  - `runtime_samples(episode, image_of)`: the agent's own prompt and hierarchical memory
    (agent.policies.memory), rebuilt step by step; what Tandem's policies see at run time (default);
  - `export_samples(...)`: agent.storage.export's UI-TARS chat samples (system prompt, <image> turns);
  - rollouts: `Trajectory.turns` (messages + text) from trainer.rollout.pool.
Checkpoints are standard transformers directories (safetensors + processor) that
agent.vlm.model.load_vlm reloads.
"""
from __future__ import annotations

import io
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

from agent import coords
from agent.executors.base import Frame
from agent.grammar import format_normalized
from agent.policies.base import build_prompt
from agent.policies.memory import Memory, MemoryStep
from agent.schema import Action
from agent.storage.export import IMAGE_TOKEN, episode_samples
from agent.vlm import pointer
from agent.vlm.model import build_inputs, load_vlm, resolve_device_dtype, sft_loss
from trainer.config_flags import check, check_choices, knob
from trainer.errors import TrainerError
from trainer.learn import distributed as D
from trainer.learn.checkpoints import save_checkpoint
from trainer.learn.lora import apply_lora, save_lora

IGNORE = -100


class SFTError(TrainerError, ValueError):
    """Unusable training data or settings; the message names what and where."""


@dataclass
class Sample:
    messages: list  # agent.policies.memory's neutral chat form, ending before the target reply
    target: str  # the assistant reply to learn: "Thought: ...\nAction: ..."
    source: str = ""  # where it came from (episode id and step), for error messages


# ---------------------------------------------------------------- the loss (pure)


def assistant_ce(logits, input_ids, mask):
    """Mean cross-entropy of the masked tokens. logits [B, T, V] at every position, input_ids
    and mask [B, T]; the logits at t-1 predict token t, so only positions with mask[t] count."""
    import torch.nn.functional as F

    pred = mask[:, 1:].bool()
    if not pred.any():
        raise SFTError("the mask selects no target tokens")
    return F.cross_entropy(logits[:, :-1][pred].float(), input_ids[:, 1:][pred])


def assistant_labels(input_ids, mask):
    """transformers-style labels: the token where the mask is set, IGNORE elsewhere."""
    labels = input_ids.clone()
    labels[~mask.bool()] = IGNORE
    return labels


# ---------------------------------------------------------------- samples


def runtime_samples(ep, image_of, *, memory_kw: dict | None = None, space: str | None = None,
                    platform: str | None = None) -> list[Sample]:
    """One sample per step of a schema Episode, prompted exactly as the agent would have been:
    agent.policies' prompt plus agent.policies.memory's messages built from the earlier steps.
    image_of(hash) -> PNG/JPEG bytes (e.g. store.get_blob)."""
    space = space or coords.SMART_RESIZE
    platform = platform or ("android" if ep.platform == "android" else ep.platform if ep.platform == "sandbox" else "desktop")
    prompt = build_prompt(ep.instruction, (platform,))
    memory = Memory(**(memory_kw or {}))
    out = []
    for step in ep.steps:
        if not step.observation.screenshot:
            raise SFTError(f"episode {ep.id} step {step.index}: no screenshot; runtime samples need one per step")
        obs = step.observation  # the frame carries the step's element list and tool output, as the live agent's did
        frame = Frame(geometry=obs.geometry, encoded=image_of(obs.screenshot), elements=obs.elements,
                      elements_source=obs.elements_source, tool_output=obs.tool_output)
        w, h = step.observation.width, step.observation.height
        messages = memory.build_messages(prompt, frame, space=space)
        actions = [step.action] + [_action(a) for a in (step.info.get("more_actions") or [])]
        out.append(Sample(messages, format_normalized(step.thought, actions, space, w, h), f"{ep.id}#{step.index}"))
        memory.add(MemoryStep(step.thought, actions, frame, source=step.provenance.source))
    return out


def _action(d):
    return Action.from_dict(d)


def export_samples(samples, image_of) -> list[Sample]:
    """agent.storage.export sample dicts -> Samples. Each user "<image>" turn takes the next entry of
    the sample's `images`; image_of(ref) -> bytes or a PIL image."""
    out = []
    for k, s in enumerate(samples):
        where = s.get("id", f"sample {k}") if isinstance(s, dict) else f"sample {k}"
        try:
            msgs, images = s["messages"], list(s.get("images") or [])
        except (TypeError, KeyError):
            raise SFTError(f"{where}: not an export sample (needs 'messages' and 'images')") from None
        if not msgs or msgs[-1].get("role") != "assistant":
            raise SFTError(f"{where}: the last message must be the assistant's target")
        conv, it = [], iter(images)
        for m in msgs[:-1]:
            if m["role"] == "user" and m["content"] == IMAGE_TOKEN:
                ref = next(it, None)
                if ref is None:
                    raise SFTError(f"{where}: more <image> turns than images")
                conv.append({"role": "user", "content": [{"type": "image", "image": _pil(image_of(ref))}]})
            else:
                conv.append({"role": m["role"], "content": m["content"]})
        out.append(Sample(conv, msgs[-1]["content"], where))
    return out


def _pil(x):
    from PIL import Image

    if isinstance(x, (bytes, bytearray)):
        return Image.open(io.BytesIO(x)).convert("RGB")
    return x


def store_samples(store, *, route: str | None = "sft", fmt: str = "runtime", episode_ids=None, memory_kw=None) -> list[Sample]:
    """Samples from the store's episodes of one route ("sft" for SFT, "ct" for CT)."""
    ids = list(episode_ids) if episode_ids else [e.id for e in store.list_episodes(route=route)]
    out: list[Sample] = []
    for eid in ids:
        ep = store.load_episode(eid)
        if fmt == "runtime":
            out += runtime_samples(ep, store.get_blob, memory_kw=memory_kw)
        elif fmt == "export":
            out += export_samples(list(episode_samples(ep)), store.get_blob)
        else:
            raise SFTError(f"unknown sample format {fmt!r}; expected runtime or export")
    return out


def jsonl_samples(path) -> list[Sample]:
    """Samples from an `export` JSONL file (images resolved beside it)."""
    path = Path(path)
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SFTError(f"{path}:{n}: not JSON ({e.msg})") from None
    return export_samples(rows, lambda ref: (path.parent / ref).read_bytes())


def encode(processor, sample: Sample) -> dict:
    """Model inputs of messages + target, with "assistant_mask" on the target's tokens only."""
    # with an element list in the prompt, a click inside an entry is taught at that entry's centre,
    # the point the pointer writes, and the entry is the pointer's target (agent.vlm.pointer)
    entries = pointer.prompt_entries(sample.messages)
    target = pointer.snap_reply(sample.target, entries) if entries else sample.target
    msgs = list(sample.messages) + [{"role": "assistant", "content": target}]
    inputs = build_inputs(processor, msgs, add_generation_prompt=False, assistant_mask=True, last_only=True)
    if not inputs["assistant_mask"].any():
        raise SFTError(f"{sample.source}: the target has no tokens")
    if entries:
        n_prompt = int(inputs["assistant_mask"][0].nonzero()[0])
        lay = pointer.layout(processor.tokenizer, inputs["input_ids"][0].tolist(), n_prompt)
        if lay is not None:
            pointer.label_choices(lay)
            inputs["pointer"] = lay
    return inputs


# ---------------------------------------------------------------- training


SCHEDULES = ("linear", "constant")


@dataclass
class ScaleConfig:
    """Memory and processes for real-sized models (README "Scaling out"), the same for `train sft|ct`
    and `train ppo`; all off: float32 everything, every parameter trained."""
    bf16: bool = knob(False, "bf16 autocast (float32 master weights, gradients and AdamW states); with --lora the "
                             "frozen base is bf16")
    grad_checkpointing: bool = knob(False, "recompute each decoder layer in backward instead of keeping its activations")
    lora_r: int | None = knob(None, "train rank-R LoRA adapters (peft, trainer.learn.lora) instead of every weight",
                              flag="lora", metavar="R")
    lora_alpha: float | None = knob(None, "LoRA alpha, the adapters' scale numerator (default 2R)")
    lora_save: str = knob("adapter", "a LoRA run saves its adapter or the weights with it merged in",
                          choices=("adapter", "merged"))
    # with several learner processes (trainer.learn.distributed, --nproc): whole replicas, gradients summed by
    # one all-reduce, or FSDP2 (fully_shard per decoder layer)
    shard: str = knob("ddp", "with --nproc > 1: ddp (a replica per process) or fsdp (FSDP2: weights, gradients and "
                             "optimizer states sharded across processes)", choices=("ddp", "fsdp"))

    NAME: ClassVar[str] = "scale"

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise config_flags.ConfigError naming the first setting that cannot work."""
        name = self.NAME
        check_choices(self)
        check(self.lora_r is None or self.lora_r >= 1, f"{name}.lora_r", "must be at least 1", self.lora_r)
        check(self.lora_alpha is None or self.lora_alpha > 0, f"{name}.lora_alpha", "must be > 0", self.lora_alpha)


@dataclass
class SFTConfig(ScaleConfig):
    """One SFT (or CT) run; the flags of `train sft|ct` are these fields (trainer.config_flags)."""
    NAME: ClassVar[str] = "sft"
    lr: float = knob(1e-3, "learning rate")
    weight_decay: float = knob(0.0, "AdamW weight decay")
    epochs: float = knob(1.0, "passes over the samples (max_steps, when set, decides instead)")
    batch_size: int = knob(8, "samples per optimizer step (gradient accumulation, one sample at a time)", flag="batch")
    max_steps: int | None = knob(None, "optimizer steps (none or 0: from epochs)")
    warmup_steps: int = knob(0, "steps of linear learning-rate warmup")
    # "linear" decays the rate to a tenth by the last step; "constant" holds it after warmup. On the tiny
    # model the decay (with clipping at 1.0) kept some seeds from ever learning where to click: bench_position
    # --task square, Qwen3-VL seed 0, 1,200 steps hit 27% decayed, 73% constant, 93% constant without clipping
    schedule: str = knob("linear", "linear: decay the rate to a tenth by the last step; constant: hold it after warmup",
                         choices=SCHEDULES)
    grad_clip: float | None = knob(1.0, "max gradient norm of a step (0 or none: no clipping)", flag="clip")
    seed: int = knob(0, "random seed")
    log_every: int = knob(1, "optimizer steps between metrics rows")
    save_every: int | None = knob(None, "optimizer steps between checkpoints (none: only at the end)")

    def validate(self) -> None:
        """Raise config_flags.ConfigError naming the first setting that cannot work."""
        super().validate()
        check(self.lr > 0, "sft.lr", "must be > 0", self.lr)
        check(self.weight_decay >= 0, "sft.weight_decay", "must be >= 0", self.weight_decay)
        check(self.epochs > 0, "sft.epochs", "must be > 0", self.epochs)
        check(self.batch_size >= 1, "sft.batch_size", "must be at least 1", self.batch_size)
        check(self.max_steps is None or self.max_steps >= 0, "sft.max_steps", "must be >= 0", self.max_steps)
        check(self.warmup_steps >= 0, "sft.warmup_steps", "must be >= 0", self.warmup_steps)
        check(self.grad_clip is None or self.grad_clip >= 0, "sft.grad_clip", "must be >= 0", self.grad_clip)
        check(self.log_every >= 1, "sft.log_every", "must be at least 1", self.log_every)
        check(self.save_every is None or self.save_every >= 1, "sft.save_every", "must be at least 1", self.save_every)


def lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    """The learning-rate multiplier at optimizer step `step` of `total`: a linear warmup over
    `warmup` steps, then 1.0 ("constant") or a linear decay to 0.1 at the last step ("linear")."""
    ramp = min(1.0, (step + 1) / max(1, warmup))
    return ramp if schedule == "constant" else ramp * (0.1 + 0.9 * max(0.0, 1 - step / total))


DEVICES_HELP = "auto (a CUDA GPU when torch sees one, else the CPU), cpu, cuda or cuda:N"


def train_device(device: str | None = "auto"):
    """The torch.device that `device` names ("auto" or None: the GPU when torch sees one, else the
    CPU); agent.vlm.model.VLMError names one that is not there."""
    return resolve_device_dtype(None if device in (None, "auto") else device, "float32")[0]


def load_for_training(model_dir, device: str | None = "auto"):
    """(model, processor) to train: float32 weights on `device` ("auto" or None: the GPU when
    torch sees one, else the CPU). Half-precision weights would lose AdamW's small updates, so
    training keeps float32 even on a GPU, where TF32 matmuls make that cheap. Raises
    agent.vlm.model.VLMError naming a device that is not there (cuda asked for, no GPU)."""
    import torch

    model, processor = load_vlm(model_dir, device=train_device(device), dtype="float32")
    if model.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return model, processor


def next_batch(order: list, n: int, size: int, rng) -> list[int]:
    """`size` indices of 0..n-1 (at most n), drawn from `order`, which is refilled with a fresh
    shuffle of all n whenever it runs out: every item once per epoch, epochs running on."""
    out = []
    for _ in range(min(size, n)):
        if not order:
            order.extend(range(n))
            rng.shuffle(order)
        out.append(order.pop())
    return out


def prepare_model(model, cfg, bf16_base: bool = True):
    """The model to train under cfg's memory settings (an SFTConfig or a PPOConfig: grad_checkpointing,
    lora_r, lora_alpha, bf16): gradient checkpointing switched on, LoRA adapters put on (a peft model
    sharing the base's modules; with cfg.bf16 and bf16_base its frozen base in bf16), or the model
    itself."""
    import torch

    if cfg.grad_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    if cfg.lora_r:
        model = apply_lora(model, cfg.lora_r, cfg.lora_alpha, base_dtype=torch.bfloat16 if cfg.bf16 and bf16_base else None)
    return model


def autocast(model, cfg: SFTConfig):
    """bf16 autocast on the model's device when cfg.bf16 (else a no-op context)."""
    import torch

    return torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=cfg.bf16)


def train_sft(model, processor, samples: list[Sample], cfg: SFTConfig, out_dir=None, *, log=None, phase: str = "sft",
              progress: bool = True) -> dict:
    """Train on samples; returns {"steps", "first_loss", "last_loss", "tokens", "seconds"}.
    log: a trainer.learn.metrics.MetricsLog (optional). Saves to out_dir when given.

    Inside a torch.distributed process group (trainer.learn.distributed.launch) every rank runs this
    with the same samples and seed: each takes its share of every global batch, gradients are
    synced by DDP or FSDP2 (cfg.shard), and rank 0 saves; the result does not depend on the
    number of processes. With LoRA (cfg.lora_r) `model` ends with the adapter merged in."""
    import torch
    from tqdm import tqdm

    if not samples:
        raise SFTError("no training samples")
    rank, world = D.rank_world()
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    encoded = [encode(processor, s) for s in samples]  # tokenize once; errors surface before training
    steps_per_epoch = math.ceil(len(encoded) / cfg.batch_size)
    total = cfg.max_steps or max(1, math.ceil(steps_per_epoch * cfg.epochs))
    base_dir = getattr(model, "name_or_path", None)  # where LoRA's adapter says its base is
    if cfg.lora_r and out_dir and not (base_dir and Path(base_dir).is_dir()):
        raise SFTError(f"LoRA needs the model loaded from its directory (an adapter names its base); got {base_dir!r}")
    # FSDP2 gathers each layer as one flat buffer, so its weights share one dtype: under it LoRA's
    # base stays float32 (sharded N ways, less than a bf16 replica from N = 2 on) and bf16 is autocast only
    trained = prepare_model(model, cfg, bf16_base=not (world > 1 and cfg.shard == "fsdp"))
    step_model = D.wrap(trained, cfg.shard) if world > 1 else trained  # what forward and backward run on
    opt = torch.optim.AdamW([p for p in trained.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, total, cfg.warmup_steps, cfg.schedule))
    step_model.train()
    order: list[int] = []
    first = last = None
    tokens = 0
    t0 = time.perf_counter()
    bar = tqdm(range(total), desc=phase, unit="step", disable=not progress or rank > 0 or None)
    for step in bar:
        # -- one global batch: a token-mean over its samples (each weighted by its target tokens);
        # this rank does its share, padded with zero-weight steps to the ranks' common count
        batch = [encoded[i] for i in next_batch(order, len(encoded), cfg.batch_size, rng)]
        n_tok = sum(int(b["assistant_mask"].sum()) for b in batch)
        mine = D.share(batch, rank, world)
        micro = math.ceil(len(batch) / world)
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for k in range(micro):
            b = mine[k] if k < len(mine) else batch[0]
            mask = b["assistant_mask"]
            weight = int(mask.sum()) / n_tok * world if k < len(mine) else 0.0  # DDP/FSDP average over ranks
            with D.sync_context(step_model, cfg.shard, world, last=k == micro - 1):
                with autocast(trained, cfg):
                    loss = sft_loss(step_model, b, mask) * weight
                loss.backward()
            loss_sum += float(loss.detach()) / world
        loss_sum = D.all_sum(loss_sum)
        gnorm = torch.nn.utils.clip_grad_norm_(trained.parameters(), cfg.grad_clip or float("inf"))
        gnorm = gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm  # FSDP2: a DTensor
        opt.step()
        sched.step()
        tokens += n_tok
        first = loss_sum if first is None else first
        last = loss_sum
        bar.set_postfix(loss=f"{loss_sum:.3f}")
        if log is not None and (step % cfg.log_every == 0 or step == total - 1):
            log.log(step, phase, loss=loss_sum, grad_norm=float(gnorm), lr=sched.get_last_lr()[0], tokens=tokens)
        if out_dir and cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < total:
            _save(trained, processor, out_dir, cfg, base_dir)
    bar.close()
    step_model.eval()
    result = {"phase": phase, "steps": total, "samples": len(samples), "first_loss": first, "last_loss": last,
              "tokens": tokens, "seconds": round(time.perf_counter() - t0, 2), "config": asdict(cfg), "processes": world}
    if out_dir:
        _save(trained, processor, out_dir, cfg, base_dir, {"last": result})
    if cfg.grad_checkpointing:
        model.activation_checkpointing_disable()
    if cfg.lora_r and not (world > 1 and cfg.shard == "fsdp"):  # the caller's model, adapter merged in, float32
        trained.merge_and_unload().float()  # (under FSDP2 its weights stay this rank's shards)
    return result


def _save(trained, processor, out_dir, cfg: SFTConfig, base_dir, extra: dict | None = None) -> None:
    """A checkpoint of the model being trained, written by rank 0 (FSDP2 gathers the whole
    state dict first, on every rank): a transformers directory, or LoRA's adapter / merged form."""
    state = D.full_state_dict(trained, cfg.shard)
    if D.rank_world()[0] == 0:
        if cfg.lora_r:
            save_lora(trained, processor, out_dir, base_dir, cfg.lora_save, extra, state_dict=state)
        else:
            save_checkpoint(trained, processor, out_dir, extra, state_dict=state)
    D.barrier()
