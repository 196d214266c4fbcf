"""One way for the benchmarks to print their result tables."""
from __future__ import annotations


def print_table(rows: list[dict], columns: list[tuple[str, object, str]]) -> None:
    """Print `rows` right-aligned under `columns`: (header, key or function of the row, format
    spec); each column is as wide as its header or its widest cell."""
    cells = [[format(col(r) if callable(col) else r[col], fmt) for _, col, fmt in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _, _) in enumerate(columns)]
    print(" ".join(h.rjust(w) for (h, _, _), w in zip(columns, widths, strict=True)))
    for c in cells:
        print(" ".join(v.rjust(w) for v, w in zip(c, widths, strict=True)))
