"""Fixtures for tests that need the tiny local Qwen2.5-VL (built once a session, nothing
downloaded). Import them into a test module: `from tests.vlm_fixtures import tiny_vlm_dir`."""
from __future__ import annotations

import time

import pytest

TIMINGS: dict[str, float] = {}  # measured here, reported by tests that print numbers


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory):
    """Path of a freshly built tiny Qwen2.5-VL directory (random weights, about 5 MB)."""
    import transformers  # noqa: F401  (imported first: its import takes seconds, the build does not)

    from trainer.learn.tiny_model import build_tiny_model

    t0 = time.perf_counter()
    out = build_tiny_model(tmp_path_factory.mktemp("tiny_vlm") / "model")
    TIMINGS["build_s"] = time.perf_counter() - t0
    return out


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory):
    """A tiny Qwen3-VL directory with one DeepStack layer (so its features are exercised)."""
    from trainer.learn.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen3") / "model", arch="qwen3_vl", deepstack=True)


@pytest.fixture(params=["qwen2_5_vl", "qwen3_vl"])
def tiny_any_dir(request):
    """Each tiny model class in turn: Qwen2.5-VL, then Qwen3-VL."""
    return request.getfixturevalue("tiny_vlm_dir" if request.param == "qwen2_5_vl" else "tiny_qwen3_dir")


@pytest.fixture
def one_thread():
    """torch on one intra-op thread for the duration of a test: ops this small lose to
    thread wake-ups, badly so on a busy 2-core machine (2.3 ms vs 17 us a Linear, measured)."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
