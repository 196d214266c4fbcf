"""The machine's own limit for bench_throughput: matmul peak in FLOPs per CPU-second, and the FLOPs
a piece of work does (torch.utils.flop_counter.FlopCounterMode).

CPU-seconds (time.process_time: every thread of this process) rather than wall seconds, so a
number measured while other processes share the cores is still the work's own rate: at one thread
a loaded machine stretches the wall clock, not the CPU time. Divided by the peak measured the same
way, a path's rate is its fraction of what these cores can do.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

aten = torch.ops.aten


def _sdpa_cpu(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_cpu_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


# torch's counter knows the GPU attention kernels only; on a CPU SDPA runs these (the same matmuls)
CPU_ATTENTION = {aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu,
                 aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward}


@contextmanager
def counting():
    """FlopCounterMode (CPU attention included); yields it: `.get_total_flops()` after the block."""
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as mode:
        yield mode


def matmul_peak(dtype: torch.dtype, threads: int, n: int = 1536, reps: int = 6) -> float:
    """FLOPs per CPU-second of `reps` n x n x n torch.mm calls in `dtype` with `threads` torch
    threads (after one warm-up call). The thread count is restored afterwards."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        torch.mm(a, b)
        t0 = time.process_time()
        for _ in range(reps):
            torch.mm(a, b)
        cpu = time.process_time() - t0
    finally:
        torch.set_num_threads(old)
    return 2.0 * n ** 3 * reps / max(cpu, 1e-9)


def peaks(threads: int, cores: int) -> list[dict]:
    """One row per dtype: GFLOP per CPU-second at 1 thread (per core) and at `threads`, and the
    machine's (the per-core rate times `cores`)."""
    rows = []
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        one = matmul_peak(dtype, 1) / 1e9
        many = matmul_peak(dtype, threads) / 1e9 if threads > 1 else one
        rows.append({"dtype": name, "per_core": one, "at_threads": many, "machine": one * cores})
    return rows
