"""A tiny Qwen2.5-VL built locally, with nothing downloaded: for tests, benchmarks and CI.

A byte-level BPE tokenizer trained on UI-TARS grammar text (so prompts and actions take few
tokens), Qwen's special tokens and chat template, the Qwen2-VL image processor with small
min/max pixels, and a Qwen2.5-VL model of a few hundred thousand random weights. Saved as a
standard transformers directory that agent.vlm.model.load_vlm loads like UI-TARS-1.5-7B.

    python -m trainer.learn.tiny_model OUT_DIR [--hidden 128 --layers 2 --vision-depth 2 --image-size 224]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from agent.actions import NAMED_KEYS, REGISTRY, SCROLL_DIRECTIONS
from agent.grammar import format_response, system_prompt
from agent.schema import Action
from agent.vlm.model import SUPPORTED_MODEL_TYPES, name_stock_processor, processor_class

# Qwen2.5-VL's special tokens, in Qwen's order (ids 0..n-1 here)
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]

# Qwen2's pre-tokenizer split (tokenizer.json of Qwen2/Qwen2.5 and UI-TARS-1.5): \p{N} alone makes
# each digit a token, so coordinates are written digit by digit as the real model writes them
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")

# Qwen2-VL's chat template (the one UI-TARS-1.5 ships), videos included for completeness.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

UI_WORDS = """button click open close save cancel ok apply settings file edit view help window menu search
type text field input enter submit login password username email name address next back forward home
page tab tabs new delete remove add copy paste cut undo redo select all scroll up down left right top
bottom drag drop double right-click checkbox check uncheck radio option dropdown list item items row
column table cell sheet document folder desktop icon start terminal browser address bar url link image
dialog popup message error warning confirm yes no continue finish done task the a an to of in on at
for with and or is it this that then I need should now first will see screen shows visible want let me
go into from my is are be was has have can must find click on the target element go back wait loading
finished call user app application phone android mobile keyboard press long press enter key hotkey ctrl
alt shift escape space return calendar clock calculator notes mail contacts camera photos music video
""".split()

THOUGHTS = [
    "I need to click the {w} button to continue.",
    "The {w} field is visible; I will type the text into it.",
    "To finish the task I should open the {w} menu first.",
    "The page shows the {w} dialog, so I press the key to confirm.",
    "I scroll down to find the {w} item in the list.",
    "The task is complete, so I report that I am finished.",
    "I will wait for the {w} page to load.",
]

INSTRUCTIONS = [
    "Open the settings and turn on dark mode.", "Click the OK button.", "Type hello into the search box and press enter.",
    "Delete the file named notes.txt.", "Send an email to Alice with the subject Meeting.",
    "Scroll down and open the last item.", "Close the dialog without saving.", "Open the calculator app.",
]


def _example_args(spec, rnd: random.Random) -> dict:
    keys = sorted(NAMED_KEYS)
    args = {}
    for p in spec.params:
        if p.kind == "point":
            args[p.name] = (rnd.randint(0, 1920), rnd.randint(0, 1080))
        elif p.kind == "direction":
            args[p.name] = rnd.choice(SCROLL_DIRECTIONS)
        elif p.kind == "key":
            args[p.name] = " ".join(rnd.sample(keys, rnd.randint(1, 2)))
        elif p.kind == "app":
            args[p.name] = rnd.choice(["Settings", "Chrome", "Calculator", "Mail"])
        else:
            args[p.name] = " ".join(rnd.sample(UI_WORDS, rnd.randint(1, 4)))
    return args


def default_corpus(seed: int = 0, examples_per_action: int = 12) -> list[str]:
    """Text in the shape the model reads and writes: UI-TARS prompts for every platform,
    'Thought: ...\\nAction: ...' for every registered action, numbers and UI words."""
    rnd = random.Random(seed)
    texts = [system_prompt(ins, platform) for platform in ("desktop", "android") for ins in INSTRUCTIONS]
    for spec in REGISTRY.values():
        for _ in range(examples_per_action):
            thought = rnd.choice(THOUGHTS).format(w=rnd.choice(UI_WORDS))
            texts.append(format_response(thought, [Action(spec.name, _example_args(spec, rnd))]))
    texts.append(" ".join(str(i) for i in range(0, 2000)))
    texts.append(" ".join(UI_WORDS) + " " + " ".join(w.capitalize() for w in UI_WORDS))
    texts.append("You are a helpful assistant.")
    return texts


def train_tokenizer(corpus_texts, vocab_size: int = 3000):
    """A byte-level BPE tokenizer (any text encodes) with Qwen's special tokens and template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Qwen2's own pre-tokenizer: its split regex (every digit a token of its own), then bytes. With
    # whole numbers as tokens a coordinate was a ~300-way choice among unrelated ids ("159", "30"+"1")
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(corpus_texts), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE,
        model_max_length=32768, additional_special_tokens=SPECIAL_TOKENS[1:],
    )


MROPE_LAYOUTS = ("interleaved", "blocks")
ARCHS = ("qwen2_5_vl", "qwen3_vl")
# Qwen3-VL's table of learned vision positions (a square side of 32 patches): interpolated to any grid
QWEN3_POSITIONS = 32 * 32


def qwen3_mrope_section(head_dim: int) -> list[int]:
    """Qwen3-VL's (time, height, width) split of head_dim / 2 frequencies, its 128-dim heads'
    [24, 20, 20] scaled down; with mrope_interleaved the axes take every third frequency."""
    half = head_dim // 2
    h = w = (half * 5) // 16
    return [half - h - w, h, w]


def mrope_section(head_dim: int, layout: str = "interleaved") -> list[int]:
    """How the rotary frequencies are shared out between (time, height, width); the sections
    must sum to head_dim / 2, and transformers hands section i to axis i % 3.

    "blocks" is Qwen2.5-VL's split, 1/4, 3/8, 3/8 in order of falling frequency as in the 7B's
    [16, 24, 24]: width gets only the lowest frequencies, which at head_dim 32 and theta 1e6 turn
    by 1e-4 to 1e-6 rad per column, so a small model cannot tell columns apart (measured: trained
    to click a lone dark square, it gave 2 distinct answers in 60). "interleaved" gives the axes
    every third frequency (t h w t h w ...), high ones to each, as Qwen3-VL's interleaved MRoPE does;
    the same model then localised the square (25 distinct answers, median error 36 px after 300
    steps). Note: vLLM's and SGLang's Qwen2.5-VL kernels take exactly three sections."""
    half = head_dim // 2
    if layout == "interleaved":
        return [1] * half
    if layout != "blocks":
        raise ValueError(f"mrope layout must be one of {', '.join(MROPE_LAYOUTS)}, got {layout!r}")
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


def build_tiny_model(out_dir, corpus_texts=None, hidden: int = 128, layers: int = 2, vision_depth: int = 2,
                     image_size: int = 224, seed: int = 0, vocab_size: int = 3000, rope_theta: float = 10_000.0,
                     mrope: str = "interleaved", arch: str = "qwen2_5_vl", deepstack: bool = False) -> Path:
    """Build and save the tiny model directory; returns its path. image_size bounds the image
    area (max_pixels = image_size**2), so a screenshot gives at most (image_size/28)**2 tokens.

    arch "qwen2_5_vl" (Qwen2.5-VL: rotary positions only, windowed vision attention) or "qwen3_vl"
    (Qwen3-VL: learned absolute position embeddings in the vision tower, full attention, QK-norm;
    built here with 14-pixel patches, so it sees exactly the Qwen2.5-VL tokens, and without DeepStack
    unless `deepstack`, which feeds the first vision layer's features to the first language layers).
    `mrope` applies to Qwen2.5-VL; Qwen3-VL interleaves its axes natively."""
    import torch
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    if hidden < 32 or hidden % 32:
        raise ValueError(f"hidden must be a positive multiple of 32 (heads of 32 dims), got {hidden}")
    if layers < 1 or vision_depth < 1:
        raise ValueError(f"layers and vision_depth must be at least 1, got {layers} and {vision_depth}")
    if rope_theta <= 1:
        raise ValueError(f"rope_theta must be > 1, got {rope_theta}")
    if mrope not in MROPE_LAYOUTS:
        raise ValueError(f"mrope layout must be one of {', '.join(MROPE_LAYOUTS)}, got {mrope!r}")
    if deepstack and arch != "qwen3_vl":
        raise ValueError("deepstack is a Qwen3-VL feature: pass arch='qwen3_vl'")
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    if image_size < 56:
        raise ValueError(f"image_size must be at least 56 (two merged patches), got {image_size}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    texts = default_corpus(seed) if corpus_texts is None else list(corpus_texts)
    if not texts:
        raise ValueError("corpus_texts is empty: the tokenizer needs some text to learn from")
    tokenizer = train_tokenizer(texts, vocab_size)
    image_processor = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=image_size * image_size,
                                               patch_size=14, merge_size=2, temporal_patch_size=2)
    processor = processor_class(arch)(image_processor=image_processor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)

    tid = tokenizer.convert_tokens_to_ids
    heads = hidden // 32
    text_config = dict(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta,
                         "mrope_section": mrope_section(hidden // heads, mrope)},
        bos_token_id=tid("<|endoftext|>"), eos_token_id=tid("<|im_end|>"), pad_token_id=tid("<|endoftext|>"),
    )
    vision_config = dict(depth=vision_depth, hidden_size=hidden, intermediate_size=2 * hidden, num_heads=heads,
                         out_hidden_size=hidden, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
    if arch == "qwen3_vl":
        text_config.update(head_dim=hidden // heads, rope_parameters={
            "rope_type": "default", "rope_theta": rope_theta, "mrope_interleaved": True,
            "mrope_section": qwen3_mrope_section(hidden // heads)})
        vision_config.update(num_position_embeddings=QWEN3_POSITIONS, deepstack_visual_indexes=[0] if deepstack else [])
    else:
        vision_config.update(window_size=112, fullatt_block_indexes=[vision_depth - 1])
    config_cls = getattr(transformers, SUPPORTED_MODEL_TYPES[arch].replace("ForConditionalGeneration", "Config"))
    config = config_cls(
        text_config=text_config, vision_config=vision_config, image_token_id=tid("<|image_pad|>"),
        video_token_id=tid("<|video_pad|>"), vision_start_token_id=tid("<|vision_start|>"),
        vision_end_token_id=tid("<|vision_end|>"), tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = getattr(transformers, SUPPORTED_MODEL_TYPES[arch])(config)
    model.generation_config.eos_token_id = [tid("<|im_end|>"), tid("<|endoftext|>")]
    model.generation_config.pad_token_id = tid("<|endoftext|>")
    model.generation_config.bos_token_id = tid("<|endoftext|>")
    model.save_pretrained(str(out))
    processor.save_pretrained(str(out))
    name_stock_processor(out)
    params = sum(p.numel() for p in model.parameters())
    info = {"built_by": "trainer.learn.tiny_model", "random_weights": True, "seed": seed, "hidden": hidden,
            "arch": arch, "layers": layers, "vision_depth": vision_depth, "image_size": image_size, "rope_theta": rope_theta,
            "mrope": mrope, "vocab": len(tokenizer),
            "params": params, "corpus_texts": len(texts), "seconds": round(time.perf_counter() - t0, 3)}
    (out / "tiny_model.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.learn.tiny_model", description="Build a tiny random Qwen-VL directory.")
    ap.add_argument("out_dir")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vision-depth", type=int, default=2)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--vocab-size", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rope-theta", type=float, default=10_000.0)
    ap.add_argument("--mrope", choices=MROPE_LAYOUTS, default="interleaved",
                    help="rotary frequencies shared out between time/height/width (see mrope_section)")
    ap.add_argument("--arch", choices=ARCHS, default="qwen2_5_vl", help="the model class (see build_tiny_model)")
    ap.add_argument("--corpus", help="a UTF-8 text file, one training text per line (default: UI-TARS grammar text)")
    a = ap.parse_args(argv)
    corpus = None
    if a.corpus:
        try:
            corpus = [line for line in Path(a.corpus).read_text(encoding="utf-8").splitlines() if line.strip()]
        except OSError as e:
            print(f"error: cannot read corpus {a.corpus}: {e}", file=sys.stderr)
            return 2
    try:
        out = build_tiny_model(a.out_dir, corpus, hidden=a.hidden, layers=a.layers, vision_depth=a.vision_depth,
                               image_size=a.image_size, seed=a.seed, vocab_size=a.vocab_size,
                               rope_theta=a.rope_theta, mrope=a.mrope, arch=a.arch)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    info = json.loads((out / "tiny_model.json").read_text(encoding="utf-8"))
    print(f"built {out}: {info['params']:,} parameters, vocab {info['vocab']}, {info['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
