"""Training metrics: one JSON line per update, TensorBoard scalars, and PNG curves.

`MetricsLog(dir)` appends `{"step": n, "phase": ..., key: value}` rows to `metrics.jsonl`, mirrors
them to TensorBoard (`tb/` in the same folder) and `plot(...)` draws every numeric key as a curve
(matplotlib, Agg backend: no display needed). Heavy imports happen on first use.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path


class MetricsLog:
    def __init__(self, out_dir, *, tensorboard: bool = True, filename: str = "metrics.jsonl"):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / filename
        self._tb_wanted = tensorboard
        self._tb = None

    def _writer(self):
        if self._tb is None and self._tb_wanted:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # TensorBoard is optional: the JSONL file is the record
                self._tb_wanted = False
                return None
            self._tb = SummaryWriter(str(self.dir / "tb"))
        return self._tb

    def log(self, step: int, phase: str, **values) -> dict:
        row = {"step": int(step), "phase": phase, "time": time.time()}
        for k, v in values.items():
            row[k] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        tb = self._writer()
        if tb is not None:
            for k, v in row.items():
                if k not in ("step", "time") and isinstance(v, float) and math.isfinite(v):
                    tb.add_scalar(f"{phase}/{k}", v, step)
            tb.flush()
        return row

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def read_metrics(path) -> list[dict]:
    rows = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON line ({e.msg})") from None
    return rows


def plot_metrics(path, out_png, *, phase: str | None = None, keys: list[str] | None = None, title: str = "",
                 since: float | None = None) -> Path:
    """Plot each numeric key of the rows (of `phase`, if given; logged at or after the wall-clock
    time `since`, if given: a resumed run appends to its log) against `step`, one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in read_metrics(path) if (phase is None or r.get("phase") == phase)
            and (since is None or r.get("time", 0.0) >= since)]
    if not rows:
        raise ValueError(f"{path}: no rows{' for phase ' + repr(phase) if phase else ''} to plot")
    if keys is None:
        keys = []
        for r in rows:
            for k, v in r.items():
                if k not in ("step", "time", "phase") and isinstance(v, (int, float)) and k not in keys:
                    keys.append(k)
    keys = [k for k in keys if any(isinstance(r.get(k), (int, float)) for r in rows)]
    cols = min(3, max(1, len(keys)))
    nrows = max(1, math.ceil(len(keys) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 2.8 * nrows), squeeze=False)
    for ax, k in zip(axes.flat, keys, strict=False):  # the grid's last row may have spare axes
        pts = [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 40 else None)
        ax.set_title(k, fontsize=10)
        ax.set_xlabel("update", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=90)
    plt.close(fig)
    return out_png
