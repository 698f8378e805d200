"""Triton, optional: ``triton`` and ``tl`` are None on a CPU-only install without it (the ops'
CPU kernels need neither; torch's CUDA builds bring their own Triton). The lowerings import
both from here: ``from kda_inductor.lowerings._triton import tl, triton``."""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None

__all__ = ["tl", "triton"]
