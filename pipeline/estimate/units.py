"""How the estimate prints bytes, milliseconds and FLOP/s (1 MB = 10^6 B, as the tables say)."""

from __future__ import annotations


def fmt_bytes(n: float | None) -> str:
    """``"n/a"``, ``"512 B"``, ``"46.1 kB"``, ``"227.4 MB"`` or ``"27.00 GB"`` (decimal units)."""
    if n is None:
        return "n/a"
    if n < 1e3:
        return f"{n:.0f} B"
    for unit, scale in (("kB", 1e3), ("MB", 1e6), ("GB", 1e9)):
        if n < scale * 1e3 or unit == "GB":
            return f"{n / scale:.{1 if unit != 'GB' else 2}f} {unit}"
    return f"{n:.0f} B"


def fmt_ms(x: float | None) -> str:
    """Three significant digits below 100 ms, whole milliseconds above; ``"–"`` for None."""
    if x is None:
        return "–"
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def fmt_flops(x: float) -> str:
    return f"{x / 1e12:.3g} TFLOP/s" if x >= 1e12 else f"{x / 1e9:.3g} GFLOP/s"
