"""The tiny model's positions: what lets it say *where* on a screenshot something is.

Two measured failures of the first default model, each pinned here as a property of the
checkpoint the trainer builds (tests/bench/bench_position.py measures the behaviour itself):
- its rotary positions could not tell image columns apart (Qwen2.5-VL's stock MRoPE split at
  head_dim 32 and theta 1e6 turns the width axis by ~1e-4 rad per column), so clicks could not
  depend on where a thing was;
- its tokenizer wrote numbers as whole tokens ("159", "30"+"1"), so every coordinate was a
  ~300-way choice among unrelated ids; Qwen2's own tokenizer writes one digit per token.
"""
from __future__ import annotations

import json

import pytest

from tests.vlm_fixtures import tiny_vlm_dir  # noqa: F401  (fixture)


def _column_spread(text_config: dict, columns: int = 12) -> float:
    """Largest change, over the rotary dimensions, of the angle transformers' own rotary
    embedding gives an image token as it moves from column 0 to the others (row and time fixed)."""
    import torch
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding

    config = Qwen2_5_VLConfig(text_config=text_config).text_config
    rope = Qwen2_5_VLRotaryEmbedding(config=config)
    pos = torch.zeros(3, 1, columns, dtype=torch.long)
    pos[0] = 100  # time
    pos[1] = 103  # row
    pos[2] = 100 + torch.arange(columns)  # width: the only axis that changes
    cos, sin = rope(torch.zeros(1, dtype=torch.float32), pos)
    angle = torch.atan2(sin[0], cos[0])  # [columns, head_dim]
    turn = (angle - angle[:1]).abs()
    return float(torch.minimum(turn, 2 * torch.pi - turn).max())


def test_mrope_layouts_share_out_the_rotary_half():
    from trainer.learn.tiny_model import mrope_section

    assert mrope_section(32, "blocks") == [4, 6, 6]  # Qwen2.5-VL's 1/4, 3/8, 3/8
    assert mrope_section(128, "blocks") == [16, 24, 24]  # exactly the 7B's
    assert mrope_section(32, "interleaved") == [1] * 16
    with pytest.raises(ValueError, match="mrope layout must be one of interleaved, blocks, got 'spiral'"):
        mrope_section(32, "spiral")


def test_the_built_model_tells_image_columns_apart(tiny_vlm_dir):  # noqa: F811
    text = json.loads((tiny_vlm_dir / "config.json").read_text())["text_config"]
    assert text["rope_parameters"]["mrope_section"] == [1] * 16 and text["rope_parameters"]["rope_theta"] == 1e4
    built = _column_spread(text)
    assert built > 1.0, f"12 columns turn the width axis by at most {built:.3g} rad"
    # Qwen2.5-VL's stock split at the same size: the columns are all but identical to attention
    stock = dict(text, rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]})
    assert _column_spread(stock) < 0.01


def test_numbers_are_written_one_digit_per_token(tiny_vlm_dir):  # noqa: F811
    from agent.vlm.model import load_processor

    tok = load_processor(tiny_vlm_dir).tokenizer
    text = "Thought: click 'Redo'.\nAction: click(start_box='(67,159)')"
    ids = tok(text)["input_ids"]
    pieces = [tok.decode([i]) for i in ids]
    assert pieces[pieces.index("6"):][:6] == ["6", "7", ",", "1", "5", "9"], pieces
    assert tok.decode(ids) == text
    for number in ("0", "1999", "336", "42"):  # no token holds two digits
        assert all(len(p.strip()) <= 1 for p in (tok.decode([i]) for i in tok(number)["input_ids"])), number


def test_build_tiny_model_refuses_an_unknown_layout_or_theta(tmp_path):
    from trainer.learn.tiny_model import build_tiny_model

    with pytest.raises(ValueError, match="got 'diagonal'"):
        build_tiny_model(tmp_path / "a", ["x y"], mrope="diagonal")
    with pytest.raises(ValueError, match="rope_theta must be > 1, got 0.0"):
        build_tiny_model(tmp_path / "b", ["x y"], rope_theta=0.0)
    with pytest.raises(ValueError, match="arch must be one of qwen2_5_vl, qwen3_vl, got 'llava'"):
        build_tiny_model(tmp_path / "c", ["x y"], arch="llava")
    with pytest.raises(ValueError, match="deepstack is a Qwen3-VL feature"):
        build_tiny_model(tmp_path / "d", ["x y"], deepstack=True)
    assert not any((tmp_path / n).exists() for n in "abcd")


def test_qwen3_mrope_section_scales_the_stock_split():
    from trainer.learn.tiny_model import qwen3_mrope_section

    assert qwen3_mrope_section(128) == [24, 20, 20]  # exactly Qwen3-VL's
    assert qwen3_mrope_section(32) == [6, 5, 5] and sum(qwen3_mrope_section(64)) == 32
