"""N learner processes with torch.distributed: launched by the training command itself
(torch.multiprocessing spawn), gloo on the CPU, NCCL on GPUs, the model wrapped by DDP or
sharded by FSDP2 (`torch.distributed.fsdp.fully_shard`).

What makes the result independent of N (trainer.learn.sft uses these): every rank draws the same
global batch from the same seeded RNG and takes its share, `share(batch, rank, world)`; each
sample's loss is weighted by its share of the global batch's target tokens times `world`
(DDP and FSDP average the gradients over ranks), so the synced gradient is exactly the
1-process gradient summed in another order. A rank whose share is short pads with a
zero-weight micro-step, because DDP and FSDP need every rank in every collective.

With one process nothing here starts a process group, wraps the model or syncs: the single
process path is the plain one.
"""
from __future__ import annotations

import contextlib
import os
import socket

from agent.threads import choose_threads
from trainer.errors import TrainerError

STRATEGIES = ("ddp", "fsdp")


class DistributedError(TrainerError, ValueError):
    """Settings a distributed run cannot use; the message names the value."""


def rank_world() -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) outside a process group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def share(items: list, rank: int, world: int) -> list:
    """This rank's part of a global batch: every world-th item from position rank."""
    return items[rank::world]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_nproc(nproc: int, device: str | None) -> None:
    """Raise DistributedError for a process count this machine cannot run."""
    import torch

    if nproc < 1:
        raise DistributedError(f"--nproc must be at least 1, got {nproc}")
    if nproc != 1 and under_torchrun():
        raise DistributedError(f"under torchrun each process is one rank: leave --nproc at 1 (got {nproc}) and "
                               "set the processes with torchrun's --nproc-per-node and --nnodes")
    if nproc > 1 and str(device).startswith("cuda:"):
        raise DistributedError(f"--device {device} names one GPU; with --nproc {nproc} each process takes cuda:RANK "
                               "(use --device cuda or auto)")
    gpus = torch.cuda.device_count() if device != "cpu" else 0
    if nproc > 1 and gpus and nproc > gpus:
        raise DistributedError(f"--nproc {nproc} needs {nproc} GPUs, torch sees {gpus}")


def under_torchrun() -> bool:
    """Whether this process was started by torchrun (or another launcher that sets its variables):
    it is then one rank of a job that may span machines, and joins that job's process group."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")) \
        and int(os.environ["WORLD_SIZE"]) > 1


def rank_world_of_launcher() -> tuple[int, int]:
    """(rank, world size) torchrun gave this process, or (0, 1) when it did not start it."""
    if not under_torchrun():
        return 0, 1
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def launch(fn, nproc: int, *args) -> None:
    """Run fn(rank, nproc, *args) in nproc spawned processes joined in one process group (gloo,
    or NCCL when the processes have GPUs); fn must be a module-level function. With nproc 1,
    fn(0, 1, *args) runs here, with no process group. Under torchrun (`torchrun --nnodes M
    --nproc-per-node N --rdzv-endpoint HOST:PORT main.py train ...`, nproc 1) this process is
    one rank of torchrun's job: it joins the group from torchrun's variables and runs fn itself."""
    if under_torchrun():
        check_nproc(nproc, None)
        _join(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), fn, args)
        return
    if nproc == 1:
        fn(0, 1, *args)
        return
    import torch.multiprocessing as mp

    mp.spawn(_entry, args=(nproc, free_port(), fn, args), nprocs=nproc, join=True)


def _entry(rank: int, world: int, port: int, fn, args) -> None:
    host = "127.0.0.1"
    os.environ.update(MASTER_ADDR=host, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    _join(rank, world, fn, args, store=rendezvous_store(host, port, rank, world))


def rendezvous_store(host: str, port: int, rank: int, world: int):
    """The job's c10d store, its server (rank 0) listening on `host` only. Given a host, TCPStore
    still listens on every interface, and it has no authentication: anyone who reaches the port
    could join or stall the job. So rank 0 binds the socket itself and hands it over."""
    import torch.distributed as dist
    from torch.distributed.constants import default_pg_timeout

    if rank != 0:
        return dist.TCPStore(host, port, world, False, timeout=default_pg_timeout)
    fd = socket.create_server((host, port)).detach()  # the store owns the listening socket from here
    return dist.TCPStore(host, port, world, True, timeout=default_pg_timeout, master_listen_fd=fd)


def _join(rank: int, world: int, fn, args, store=None) -> None:
    """Join the process group of `store`, or else the one the environment describes (env://, as
    torchrun sets it), run fn(rank, world, *args), leave."""
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", rank))
    per_machine = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    # the machine's cores split between its ranks (oversubscribed threads thrash); TANDEM_THREADS wins.
    # Not sampled for other work: the sibling ranks starting at this moment would count as such
    torch.set_num_threads(choose_threads(workers=per_machine, busy=0.0).threads)
    nccl = torch.cuda.is_available() and torch.cuda.device_count() >= per_machine
    if nccl:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if nccl else "gloo", rank=rank, world_size=world, store=store)
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def rank_device(device: str | None, rank: int, world: int) -> str | None:
    """The device a rank trains on: its own GPU (cuda:RANK) when the run is on GPUs."""
    import torch

    if world > 1 and device in (None, "auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{os.environ.get('LOCAL_RANK', rank)}"  # the GPU of this rank on its machine
    return device


def wrap(model, strategy: str = "ddp"):
    """The model prepared for a multi-process step: DDP (a replica per rank, gradients
    all-reduced) or FSDP2 (parameters, gradients and optimizer states sharded per decoder
    layer and at the root). Returns what to call forward on; with FSDP2 that is the model itself."""
    if strategy not in STRATEGIES:
        raise DistributedError(f"unknown --shard {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in _decoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    class VLMDDP(DistributedDataParallel):
        """DDP that answers .dtype like the transformers model it holds (DDP sets .device itself)."""
        dtype = property(lambda self: self.module.dtype)

    dev = next(model.parameters()).device
    return VLMDDP(model, device_ids=[dev.index] if dev.type == "cuda" else None, gradient_as_bucket_view=True)


def shard_keeping_whole(model, keep_whole=()) -> None:
    """FSDP2 in place for a PPO learner: `fully_shard` on each decoder layer and at the root
    (gradients are averaged over ranks, so a rank scales its loss by the world size). The modules
    in `keep_whole` (PPO's frozen vision tower, which encodes screenshots outside the model's
    forward, where FSDP could not gather it) stay whole on every rank."""
    from torch.distributed.fsdp import fully_shard

    names = {id(m): n for n, m in model.named_modules()}
    skip = tuple(names[id(m)] + "." for m in keep_whole)
    ignored = {p for m in keep_whole for p in m.parameters()}
    for layer in _decoder_layers(model):
        if not (names[id(layer)] + ".").startswith(skip):
            fully_shard(layer)
    fully_shard(model, ignored_params=ignored or None)


def even_share(items):
    """(item, real) for this rank's items of a list, every rank getting the same count: FSDP2
    gathers each layer in every forward, so a rank with a short share runs a zero-weight repeat
    (real False) of the first item while the others finish theirs."""
    import math

    items = list(items)
    rank, world = rank_world()
    mine = items[rank::world]
    for k in range(math.ceil(len(items) / world)):
        yield (mine[k], True) if k < len(mine) else (items[0], False)


def _decoder_layers(model):
    """The transformer blocks of a Qwen-VL model (language layers and vision blocks), the units
    FSDP2 gathers one at a time."""
    return [m for name, m in model.named_modules() if name and block_of(name) == name]


def block_of(name: str) -> str | None:
    """The qualified name of the decoder layer or vision block (`...layers.N`, `...blocks.N`) a
    module of this name is in, or None outside them."""
    parts = name.split(".")
    for k in range(len(parts) - 1, 0, -1):
        if parts[k].isdigit() and parts[k - 1] in ("layers", "blocks"):
            return ".".join(parts[: k + 1])
    return None


def sync_context(wrapped, strategy: str, world: int, last: bool):
    """Gradient sync only on the last micro-step of an accumulated batch."""
    if world == 1:
        return contextlib.nullcontext()
    if strategy == "fsdp":
        wrapped.set_requires_gradient_sync(last)
        return contextlib.nullcontext()
    return contextlib.nullcontext() if last else wrapped.no_sync()


def all_sum(value: float) -> float:
    """The sum over ranks of a float (the value itself with one process)."""
    rank, world = rank_world()
    if world == 1:
        return value
    import torch
    import torch.distributed as dist

    dev = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([value], dtype=torch.float64, device=dev)
    dist.all_reduce(t)
    return float(t.item())


def full_state_dict(model, strategy: str):
    """The whole model's state dict on rank 0 (a collective under FSDP2: every rank must call
    it); None means: use the model's own (DDP and one process keep whole replicas)."""
    if strategy != "fsdp" or rank_world()[1] == 1:
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def barrier() -> None:
    if rank_world()[1] > 1:
        import torch.distributed as dist

        dist.barrier()


def my_share(items):
    """This rank's items of an iterable (lazily: every world-th from position rank), e.g. the
    micro-batches of a minibatch; all of them with one process."""
    import itertools

    rank, world = rank_world()
    return items if world == 1 else itertools.islice(items, rank, None, world)


def all_reduce_grads(params, bucket: int = 1 << 25) -> None:
    """Sum the gradients of `params` over ranks, in flat all-reduces of about `bucket` elements
    (a missing gradient counts as zeros: a rank whose share of a minibatch was empty still takes
    part). Every rank must pass the same parameters in the same order."""
    rank, world = rank_world()
    if world == 1:
        return
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    # FSDP2's sharded parameters (DTensors) had their gradients reduced in backward already
    params = [p for p in params if p.requires_grad and not isinstance(p, DTensor)]
    start = 0
    while start < len(params):
        end, size = start, 0
        while end < len(params) and (end == start or size + params[end].numel() <= bucket):
            size += params[end].numel()
            end += 1
        group = params[start:end]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in group])
        dist.all_reduce(flat)
        offset = 0
        for p in group:
            p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        start = end


def all_sum_dict(sums: dict) -> dict:
    """Per key, the sum over ranks of a dict of floats (keys a rank lacks count as 0)."""
    rank, world = rank_world()
    if world == 1:
        return sums
    import torch.distributed as dist

    gathered = [None] * world
    dist.all_gather_object(gathered, sums)
    out: dict = {}
    for d in gathered:
        for k, v in d.items():
            out[k] = out.get(k, 0.0) + v
    return out


def broadcast_object(obj):
    """Rank 0's obj on every rank (pickled); obj itself with one process."""
    rank, world = rank_world()
    if world == 1:
        return obj
    import torch.distributed as dist

    box = [obj if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
