"""How sure an evaluation is: success rates with Wilson 95% intervals, and the paired interval of
the difference between two models played on the same seeds (Newcombe's method 10).

A rate from 30 episodes is +-15 points wide; these intervals go beside every rate the trainer,
the flywheel and `sandbox eval` print, so a difference is read against its noise.
"""
from __future__ import annotations

import math

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; (0, 1) when n is 0. Unlike the normal
    interval it stays inside [0, 1] and is not zero-width at 0 or n successes."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # at 0 (or n) successes the bound is exactly 0 (or 1); centre - half leaves a rounding crumb
    # (2.8e-17 for 0 of 12) that would put the interval above an observed rate of 0
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def rate(outcomes) -> dict:
    """{"episodes": n, "success": rate, "ci95": [lo, hi]} of a list of bools (or 0/1)."""
    outcomes = [bool(o) for o in outcomes]
    n, k = len(outcomes), sum(outcomes)
    lo, hi = wilson(k, n)
    return {"episodes": n, "success": k / n if n else 0.0, "ci95": [lo, hi]}


def paired_difference(first, second, z: float = Z95) -> dict:
    """The difference second - first of two success rates measured on the same tasks (the same
    seeds, episode i of each on the same task), with Newcombe's (1998) method-10 interval, which
    uses the pairing: two models that fail the same hard seeds differ by less noise than two
    independent samples would. Returns {"episodes", "first", "second", "diff", "ci95": [lo, hi],
    "discordant": [first only, second only]}."""
    first, second = [bool(x) for x in first], [bool(x) for x in second]
    if len(first) != len(second):
        raise ValueError(f"paired outcomes need the same episodes: {len(first)} vs {len(second)}")
    n = len(first)
    if n == 0:
        raise ValueError("paired_difference needs at least one episode")
    a = sum(f and s for f, s in zip(first, second, strict=True))
    b = sum(f and not s for f, s in zip(first, second, strict=True))  # first succeeded, second failed
    c = sum(s and not f for f, s in zip(first, second, strict=True))
    d = n - a - b - c
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson(a + b, n, z)
    l2, u2 = wilson(a + c, n, z)
    denom = math.sqrt((a + b) * (c + d) * (a + c) * (b + d))
    if denom == 0:
        phi = 0.0
    else:  # with the continuity correction Newcombe applies when ad > bc
        num = a * d - b * c
        phi = (max(num - n / 2, 0.0) if num > 0 else num) / denom
    theta = p1 - p2
    lo = theta - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    hi = theta + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return {"episodes": n, "first": p1, "second": p2, "diff": p2 - p1, "ci95": [-hi, -lo], "discordant": [b, c]}


def fmt_rate(r: dict) -> str:
    """'0.42 [0.35, 0.49] (n=200)' for a rate() dict."""
    lo, hi = r["ci95"]
    return f"{r['success']:.2f} [{lo:.2f}, {hi:.2f}] (n={r['episodes']})"


# Student's t 97.5% quantiles for 1..30 degrees of freedom (beyond: the Cornish-Fisher expansion around Z95)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: float) -> float:
    """Student's t distribution's 97.5% quantile for `df` degrees of freedom (a table to 30, then
    the first two Cornish-Fisher terms, good to 1e-3)."""
    if df < 1:
        raise ValueError(f"need at least 1 degree of freedom, got {df}")
    if df <= 30 and float(df).is_integer():
        return _T975[int(df) - 1]
    z = Z95
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df * df)


def mean_interval(values) -> dict:
    """{"n", "mean", "sd", "ci95": [lo, hi]}: the mean of a sample with its t 95% interval
    (the interval is the mean itself for a sample of one, which says nothing of the spread)."""
    xs = [float(v) for v in values]
    n = len(xs)
    if not n:
        raise ValueError("the mean of no values")
    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
    half = t975(n - 1) * sd / math.sqrt(n) if n > 1 else 0.0
    return {"n": n, "mean": mean, "sd": sd, "ci95": [mean - half, mean + half]}


def mean_of_means_interval(groups) -> dict:
    """The unweighted mean of several groups' means (each a list of values) with its 95% interval:
    the standard error from each group's variance (sum of s_g^2 / n_g over G^2) and Welch-Satterthwaite
    degrees of freedom."""
    groups = [[float(v) for v in g] for g in groups]
    if not groups or any(not g for g in groups):
        raise ValueError("every group needs at least one value")
    stats = [mean_interval(g) for g in groups]
    k = len(groups)
    mean = sum(s["mean"] for s in stats) / k
    parts = [s["sd"] ** 2 / s["n"] for s in stats]
    var = sum(parts) / k ** 2
    if var == 0:
        return {"groups": k, "mean": mean, "ci95": [mean, mean]}
    df_den = sum(p * p / (s["n"] - 1) for p, s in zip(parts, stats, strict=True) if s["n"] > 1)
    df = max(1.0, sum(parts) ** 2 / df_den) if df_den else 1.0
    half = t975(df) * math.sqrt(var)
    return {"groups": k, "mean": mean, "ci95": [mean - half, mean + half]}
