"""Message sizes of an allreduce sweep: powers of two written ``64MiB``, as a range or a list."""

from __future__ import annotations

import re

from fp4lab.core import params

_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_SIZE = re.compile(r"\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*")
SIZE_HELP = (
    "powers of two such as 1KiB or 64MiB (units B, KiB, MiB, GiB), as a range LO:HI or a comma list"
)


def parse_size(text: str) -> int:
    """``"64MiB"`` -> 67108864; the size must be a power of two."""
    match = _SIZE.fullmatch(str(text))
    if not match:
        raise ValueError(f"sizes contains {text!r}; allowed values: {SIZE_HELP}")
    value = int(match.group(1)) * _UNITS[match.group(2) or "B"]
    if value <= 0 or value & (value - 1):
        raise ValueError(
            f"sizes contains {text!r} = {value} bytes, not a power of two; allowed values: {SIZE_HELP}"
        )
    return value


def parse_sizes(spec: str) -> list[int]:
    """``"1KiB:64MiB"`` -> every power of two from 1 KiB to 64 MiB; ``"4KiB,1MiB"`` -> those two."""
    spec = str(spec)
    if ":" in spec:
        low_text, _, high_text = spec.partition(":")
        low, high = parse_size(low_text), parse_size(high_text)
        if low > high:
            raise ValueError(
                f"sizes={spec!r} runs from {low} down to {high} bytes; allowed values: {SIZE_HELP}, LO <= HI"
            )
        return [1 << k for k in range(low.bit_length() - 1, high.bit_length())]
    return sorted({parse_size(part) for part in params.items("sizes", spec, SIZE_HELP)})


def format_size(nbytes: int) -> str:
    """1048576 -> '1MiB'."""
    for unit in ("GiB", "MiB", "KiB"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return f"{nbytes}B"
