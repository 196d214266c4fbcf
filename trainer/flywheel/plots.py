"""The flywheel at a glance, as data and as a PNG: held-out success of every version by
iteration (per family and mean), and the pools' growth per iteration. The Train view draws the
same series from `summary()`."""
from __future__ import annotations

from pathlib import Path

from trainer.flywheel.registry import Registry
from trainer.flywheel.routing import Router


def summary(store) -> dict:
    """{"versions": [...], "growth": [...], "pools": {...}, "current": version | None}."""
    reg, router = Registry(store), Router(store)
    cur = reg.current()
    return {"versions": reg.versions(), "growth": router.growth(), "pools": router.pools(),
            "current": cur.version if cur else None}


def plot_flywheel(store, out_png) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = summary(store)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    draw_success(ax1, s["versions"])
    draw_growth(ax2, s["growth"])
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def draw_success(ax, versions) -> None:
    """Held-out success by iteration: every evaluated version, the promoted line bold."""
    ev = [v for v in versions if v.metrics.get("families")]
    fams = sorted({f for v in ev for f in v.metrics["families"]})
    for f in fams:
        pts = [(v.iteration, v.metrics["families"][f]["success"]) for v in ev if f in v.metrics["families"]]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", lw=0.8, alpha=0.6, label=f)
    ax.plot([v.iteration for v in ev], [v.metrics["mean_success"] for v in ev], "k-o", lw=2, label="mean")
    for v in ev:
        if v.status == "rejected":
            ax.annotate("rejected", (v.iteration, v.metrics["mean_success"]), fontsize=7, color="#c92a2a")
    _integer_ticks(ax)
    ax.set_xlabel("iteration")
    ax.set_ylabel("held-out success")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    ax.set_title("model versions", fontsize=10)


def draw_growth(ax, growth) -> None:
    """Episodes routed per iteration, stacked by pool, with the cumulative SFT pool."""
    if not growth:
        ax.text(0.5, 0.5, "no routing yet", ha="center", va="center", transform=ax.transAxes)
        return
    its = [g["iteration"] for g in growth]
    bottom = [0] * len(its)
    for route, colour in (("sft", "#2f9e44"), ("ct", "#1971c2"), ("rejected", "#868e96")):
        vals = [g.get(route, 0) for g in growth]
        ax.bar(its, vals, bottom=bottom, color=colour, label=route)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    _integer_ticks(ax)
    if len(its) < 12:
        ax.set_xticks(its)  # whole iterations, also when there is only one
    ax.set_xlabel("iteration")
    ax.set_ylabel("episodes routed")
    ax.legend(fontsize=7)
    ax.set_title("data pools", fontsize=10)


def _integer_ticks(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
