"""The OCR engine: RapidOCR running PP-OCRv6 (small) text detection and recognition on
onnxruntime. Its models ship inside the `rapidocr` wheel, so nothing is downloaded at run time.

Measured on 2 CPU cores (tests/bench/bench_redaction.py): about 1.2 s per 1920x1080 frame of
dense UI text, and every line of 11 px text read. The engine is made on the first call, in the
calling thread (a worker, never the GUI or capture thread), and reused.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from agent.redaction import RedactionError

ENGINE_NAME = "rapidocr"


@dataclass(frozen=True)
class OcrLine:
    """One line of text and its box in pixels (x0, y0, x1, y1) of the image it was read from."""

    text: str
    box: tuple[float, float, float, float]
    score: float


class OcrEngine:
    """read(image) -> [OcrLine]. `image` is an H x W x 3 uint8 array in BGR order (OpenCV's)."""

    def __init__(self, threads: int = 0):
        self.threads = int(threads)  # 0: onnxruntime decides
        self._engine = None
        self._lock = threading.Lock()

    @staticmethod
    def version() -> str:
        try:
            from importlib.metadata import version

            return f"{ENGINE_NAME} {version('rapidocr')} (PP-OCRv6 small det+rec, onnxruntime {version('onnxruntime')})"
        except Exception:  # not installed: the caller hears about it from read()
            return f"{ENGINE_NAME} (not installed)"

    def _load(self):
        try:
            from rapidocr import RapidOCR
        except ImportError as e:
            raise RedactionError(
                f"the OCR engine is not installed ({e}); install Tandem's requirements "
                "(pip install -r requirements.txt) to find personal data in screenshots") from None
        params = {"Global.log_level": "error", "Global.use_cls": False}  # screen text is upright
        if self.threads > 0:
            params["EngineConfig.onnxruntime.intra_op_num_threads"] = self.threads
        try:
            return RapidOCR(params=params)
        except Exception as e:  # a broken install: say so instead of failing later per frame
            raise RedactionError(f"the OCR engine could not start: {type(e).__name__}: {e}") from None

    def read(self, image) -> list[OcrLine]:
        import numpy as np

        if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            shape = getattr(image, "shape", None)
            raise RedactionError(f"OCR needs an H x W x 3 uint8 image, got {type(image).__name__} {shape}")
        with self._lock:  # one inference at a time per engine; onnxruntime uses the cores itself
            if self._engine is None:
                self._engine = self._load()
            res = self._engine(image)
        if res is None or not getattr(res, "txts", None):
            return []
        out = []
        for quad, text, score in zip(res.boxes, res.txts, res.scores, strict=True):
            xs = [float(p[0]) for p in quad]
            ys = [float(p[1]) for p in quad]
            out.append(OcrLine(str(text), (min(xs), min(ys), max(xs), max(ys)), float(score)))
        return out


_shared: OcrEngine | None = None


def shared_engine() -> OcrEngine:
    """One engine per process (its models take about 100 MB once loaded)."""
    global _shared
    if _shared is None:
        _shared = OcrEngine()
    return _shared
