"""The 128x4 swizzled scale layout FP4 GEMMs read (cuBLAS's "block scaling factors layout").

Scales [M, S] are padded to rows a multiple of 128 and columns a multiple of 4 (pads zero);
each 128x4 tile is 512 bytes in which scale (m, k) sits at
``(m%32)*16 + ((m%128)//32)*4 + k%4``; tiles are ordered [M/128, S/4], row tiles outermost.
"""

from __future__ import annotations

import torch


def _round_up(n: int, base: int) -> int:
    return (n + base - 1) // base * base


def swizzled_shape(m: int, scale_cols: int) -> tuple[int, int]:
    """The [rows, cols] of [m, scale_cols] scales in the 128x4 layout: rows padded to 128, columns to 4."""
    return _round_up(m, 128), _round_up(scale_cols, 4)


def swizzled_offset(
    m: torch.Tensor | int, k: torch.Tensor | int, scale_cols: int
) -> torch.Tensor | int:
    """Position of scale (m, k) in the 128x4 layout of [M, scale_cols] scales (cuBLAS formula)."""
    k_tiles = _round_up(scale_cols, 4) // 4
    return (m // 128 * k_tiles + k // 4) * 512 + (m % 32) * 16 + (m % 128) // 32 * 4 + k % 4


def swizzle_128x4(scales: torch.Tensor) -> torch.Tensor:
    """[M, S] scales -> 1-D swizzled order (rows padded to 128, columns to 4, pads zero)."""
    m, s = scales.shape
    mp, sp = swizzled_shape(m, s)
    raw = scales.view(torch.uint8) if scales.element_size() == 1 else scales
    padded = torch.zeros(mp, sp, dtype=raw.dtype, device=raw.device)
    padded[:m, :s] = raw
    tiled = padded.view(mp // 128, 4, 32, sp // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1)
    return tiled.view(scales.dtype) if raw is not scales else tiled


def unswizzle_128x4(swizzled: torch.Tensor, m: int, s: int) -> torch.Tensor:
    """Inverse of swizzle_128x4: the 1-D swizzled scales back to [m, s]."""
    mp, sp = swizzled_shape(m, s)
    if swizzled.numel() != mp * sp:
        raise ValueError(
            f"swizzled has {swizzled.numel()} scales; [{m}, {s}] padded to 128x4 needs {mp * sp}"
        )
    raw = swizzled.view(torch.uint8) if swizzled.element_size() == 1 else swizzled
    grid = raw.reshape(mp // 128, sp // 4, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(mp, sp)
    out = grid[:m, :s].contiguous()
    return out.view(swizzled.dtype) if raw is not swizzled else out


def check_against_peers(m: int = 300, s: int = 13, *, seed: int = 0) -> dict:
    """swizzle_128x4 of random [m, s] bytes against the offset formula, torch's ``to_blocked``, and
    unswizzle_128x4; with the number of pad bytes."""
    from torch.testing._internal.common_quantized import to_blocked

    generator = torch.Generator().manual_seed(seed)
    grid = torch.randint(0, 255, (m, s), generator=generator, dtype=torch.uint8)
    swizzled = swizzle_128x4(grid)
    m_idx, k_idx = torch.meshgrid(torch.arange(m), torch.arange(s), indexing="ij")
    return {
        "matches_formula": bool(torch.equal(swizzled[swizzled_offset(m_idx, k_idx, s)], grid)),
        "matches_torch_to_blocked": bool(torch.equal(swizzled, to_blocked(grid))),
        "round_trips": bool(torch.equal(unswizzle_128x4(swizzled, m, s), grid)),
        "padded_bytes": swizzled.numel() - grid.numel(),
    }
