"""A local transformers vision-language model (the Qwen2.5-VL class of UI-TARS-1.5, or Qwen2-VL
or Qwen3-VL) from a directory, through agent.vlm.model (load_vlm, generate). The model loads on first use, not when the
policy is built; device and dtype default to cuda + bf16 with a GPU, else cpu + float32.

Each step's prompt usually extends the last one (working memory appends the reply and the next
screenshot), so the policy keeps the last step's keys and values and each screenshot's vision
features (agent.vlm.batch) and a step computes only its new tokens: the same reply, less waiting.

UI-TARS-1.5 writes coordinates in the image its processor actually made (smart_resize with the
processor's own min/max pixels). For UI-TARS-1.5-7B that equals agent.coords' defaults; for a
model with other limits (the tiny test model), points are normalized with the processor's size.
"""
from __future__ import annotations

from agent import coords
from agent.policies.base import Policy, PolicyError
from agent.vlm import model as vlm
from agent.vlm.batch import ImageCache, generate_batch
from agent.vlm.model import VLMError, load_vlm, resized_image_size


class LocalVLMPolicy(Policy):
    name = "local"

    def __init__(self, model_dir, *, device=None, dtype=None, max_new_tokens: int = 256, temperature: float = 0.0,
                 seed: int | None = None, keep_turns: bool = True, **kw):
        from pathlib import Path

        super().__init__(version=kw.pop("version", None) or f"local:{Path(model_dir).name}", **kw)
        self.model_dir = model_dir
        self.device, self.dtype = device, dtype
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.seed = seed
        self.model = None
        self.processor = None
        self.last_generation = None
        self.calls = 0
        self.keep_turns = keep_turns
        self.cache = None  # agent.vlm.batch.ImageCache: screenshots and the last step, while the weights stay

    def load(self) -> LocalVLMPolicy:
        if self.model is None:
            try:
                self.model, self.processor = load_vlm(self.model_dir, self.device, self.dtype)
            except VLMError as e:
                raise PolicyError(str(e)) from None
            # working memory holds a few screenshots: keep those (a 1080p one is ~13 MB of pixel rows)
            self.cache = ImageCache(max_images=16)
        return self

    def generate(self, messages) -> str:
        self.load()
        # a fixed seed would give a re-ask the very same sample: step it per call, reproducibly
        seed = None if self.seed is None else self.seed + self.calls
        self.calls += 1
        try:
            if self.keep_turns:
                g = generate_batch(self.model, self.processor, [messages], max_new_tokens=self.max_new_tokens,
                                   temperature=self.temperature, seed=seed, cache=self.cache, slots=[0])[0]
            else:
                g = vlm.generate(self.model, self.processor, messages, max_new_tokens=self.max_new_tokens,
                                 temperature=self.temperature, seed=seed, details=True)
        except vlm.VLMError as e:
            raise PolicyError(f"the local model could not take this input: {e}") from None
        self.last_generation = g
        return g.text

    def model_extent(self, width: int, height: int) -> tuple[int, int] | None:
        return processor_extent(self.processor, self.space, width, height)

    def close(self) -> None:
        self.model = self.processor = self.cache = None


def processor_extent(processor, space: str, width: int, height: int) -> tuple[int, int] | None:
    """The image (width, height) `processor` makes of a width x height screenshot, where a
    smart_resize model writes its coordinates, when that differs from agent.coords' smart_resize
    (a processor with other min/max pixels); None when it agrees or the space is not smart_resize."""
    if space != coords.SMART_RESIZE or processor is None:
        return None

    rw, rh = resized_image_size(processor, width, height)
    return None if (rh, rw) == coords.smart_resize(height, width) else (rw, rh)
