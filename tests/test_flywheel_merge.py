"""Merging by parameter interpolation over real safetensors checkpoints of the tiny VLM."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.vlm_fixtures import tiny_vlm_dir  # noqa: F401 - fixture
from trainer.flywheel import FlywheelError
from trainer.flywheel.merge import check_alphas, merge_models


def _state(d):
    from safetensors.torch import load_file

    return load_file(str(d / "model.safetensors"))


@pytest.fixture
def two_parents(tiny_vlm_dir, tmp_path):  # noqa: F811
    """The tiny model and a copy with different weights (same architecture)."""
    import torch
    from safetensors.torch import save_file

    b = tmp_path / "b"
    shutil.copytree(tiny_vlm_dir, b)
    st = _state(b)
    g = torch.Generator().manual_seed(1)
    save_file({k: v + torch.randn(v.shape, generator=g).to(v.dtype) if v.is_floating_point() else v for k, v in st.items()},
              str(b / "model.safetensors"), metadata={"format": "pt"})
    return tiny_vlm_dir, b


def test_alpha_one_zero_reproduces_the_first_parent_exactly(two_parents, tmp_path):
    import torch

    a, b = two_parents
    out = merge_models([a, b], [1, 0], tmp_path / "m10")
    sa, sm = _state(a), _state(out)
    assert set(sa) == set(sm)
    assert all(torch.equal(sa[k], sm[k]) and sa[k].dtype == sm[k].dtype for k in sa)
    out01 = merge_models([a, b], ["0", "1"], tmp_path / "m01")
    sb = _state(b)
    assert all(torch.equal(sb[k], v) for k, v in _state(out01).items())
    # the merge is a loadable transformers directory, with its recipe beside it
    from agent.vlm.model import load_vlm

    model, _ = load_vlm(out, device="cpu")
    assert sum(p.numel() for p in model.parameters()) > 0
    assert json.loads((out / "tandem_merge.json").read_text())["alphas"] == [1.0, 0.0]


def test_half_half_is_the_midpoint(two_parents, tmp_path):
    import torch

    a, b = two_parents
    sa, sb = _state(a), _state(b)
    sm = _state(merge_models([a, b], [0.5, 0.5], tmp_path / "mid"))
    k = next(k for k, v in sa.items() if v.is_floating_point() and v.numel() > 10)
    assert torch.allclose(sm[k].float(), (sa[k].float() + sb[k].float()) / 2, atol=1e-6)
    assert not torch.equal(sm[k], sa[k])


@pytest.mark.parametrize("alphas, message", [
    ([0.7, 0.7], "sum to 1.4"),
    ([1.5, -0.5], "alpha 2 is negative"),
    ([1.0], "1 alphas for 2 models"),
    (["x", 1], "alpha 1 is not a number: 'x'"),
    ([float("nan"), 1], "alpha 1 is not finite"),
])
def test_invalid_alphas_are_refused(alphas, message):
    with pytest.raises(FlywheelError, match=message):
        check_alphas(alphas, 2)


def test_refuses_different_architectures_and_overwrites(two_parents, tmp_path):
    a, b = two_parents
    cfg = json.loads((b / "config.json").read_text())
    cfg["text_config"]["num_hidden_layers"] = cfg["text_config"].get("num_hidden_layers", 2) + 1
    (b / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FlywheelError, match="different architecture"):
        merge_models([a, b], [0.5, 0.5], tmp_path / "x")
    with pytest.raises(FlywheelError, match="already exists"):
        merge_models([a, a], [0.5, 0.5], tmp_path)
    with pytest.raises(FlywheelError, match="does not exist"):
        merge_models([a, tmp_path / "nope"], [0.5, 0.5], tmp_path / "y")


def test_cli_merges_registry_versions_and_evaluates_against_each_parent(two_parents, tmp_path, capsys):
    from agent.storage.store import Store
    from main import main
    from trainer.flywheel.registry import Registry

    a, b = two_parents
    data = tmp_path / "data"
    with Store(data) as store:
        store.set_setting("flywheel.config", {"families": ["click_button"], "eval_episodes": 1, "width": 224, "height": 168,
                                              "max_steps": 1, "max_new_tokens": 8})
        reg = Registry(store)
        va, vb = reg.register(a).version, reg.register(b).version
    assert main(["flywheel", "merge", "--models", va, vb, "--alphas", "0.5", "0.5", "--data", str(data)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["parents"]) == {va, vb} and "click_button" in out["merged"]["families"]
    # the merge and both parents on one fresh block of held-out seeds, compared pair by pair
    assert out["merged"]["episodes"] == 1 and out["merged"]["seed_start"] == out["parents"][va]["seed_start"]
    assert out["parents"][vb]["merged_minus_parent"]["episodes"] == 1
    with Store(data) as store:
        mv = Registry(store).get(out["version"])
    assert mv.lineage["parents"] == [va, vb] and mv.status == "candidate" and mv.metrics["mean_success"] >= 0
    assert main(["flywheel", "merge", "--models", va, vb, "--alphas", "0.9", "0.3", "--data", str(data)]) == 2
    assert "sum to 1.2" in capsys.readouterr().err
