"""The launch configurations of the ``kda::causal_conv1d`` kernels (``_conv_kernels.py``): fixed
per shape class, no run-time autotuning (CUDA graphs, reproducible numbers), and the geometry
of a channel block (a source's heads, ``[BH, BD]`` channels a program).

The first sweep (``.ci/gpu tune-causal_conv1d``, ``benchmarks/tune_causal_conv1d.py``; H200,
triton 3.6, 2026-12-05, ``benchmarks/results/tune_causal_conv1d.md``) timed 15 prefill candidates
at 8192 / 12288 channels x T 4096 / 16384 and 8 update candidates at B 1 / 32 / 128: the register
window over 256 (T = 4096) or 128 channels (T = 16384) with one warp won the prefill (64.4 us at
8192 x 4096, against 99.9 before; the blocks of taps' best 66.0; FLA 52.3; the floor 31.7), and
those classes and every update class use what it chose. Classes it did not reach keep the
register-window guess and say so in their note.
"""

from __future__ import annotations

import math
from typing import NamedTuple

__all__ = ["PREFILL_CONFIGS", "QWEN3_NEXT_SOURCES", "UPDATE_CONFIGS", "UPDATE_MAX_T", "LaunchConfig", "Source",
           "UpdateConfig", "aot_geometry", "fit", "fit_update", "geometry", "head_block", "launch_config",
           "next_power_of_2", "read_sources", "update_config"]

MAX_SOURCES = 4  # the _cat ops' sources (``_conv_validate.MAX_SOURCES``)


class LaunchConfig(NamedTuple):
    """A prefill launch: ``block_t`` tokens x ``block_c`` channels per program, ``num_warps``
    warps, the program's loop over its tokens pipelined ``num_stages`` deep (``tl.range``), in
    steps of ``rows`` tokens (a power of two dividing ``block_t``). ``window``: the register
    window (``rows <= 8`` tokens loaded at a time, the ``K - 1`` previous ones carried in
    registers: each row read once); else blocks of taps (``rows`` x channels at once, each tap
    one shifted load, the overlap served by the cache). ``prefetch`` (with ``window``): the
    window with each step's ``rows`` tokens loaded a step ahead, in flight under the previous
    step's arithmetic (``num_stages`` unused); ``ptx`` (with ``prefetch``, on the GPU, a bfloat16 /
    float16 conv): the silu's division range-checked once per 4 values and the conv dtype's
    rounding packed, the same bits in fewer instructions (``_conv_stream.py``; where a thread
    holds a multiple of 4 of the tile's values, else the plain silu); ``unroll`` (with
    ``prefetch``): steps a loop iteration (Triton's ``loop_unroll_factor``: the window's carried
    rows renamed between them, not moved; 2 steps: 28.3 instructions a value against 32.0 at 8
    channels x 2 rows a thread)."""

    block_t: int
    block_c: int
    num_warps: int
    num_stages: int = 1
    rows: int = 8
    window: bool = False
    prefetch: bool = False
    ptx: bool = False
    unroll: int = 1


class UpdateConfig(NamedTuple):
    """An update launch: ``block_c`` channels of one row per program, every token, ``num_warps``.
    ``tile``: one token too runs the multi-token path (the state's ``[channels, taps]`` tile read once,
    its taps picked in registers, the shifted tile written once) instead of the decode path's
    loads of each tap's column and then the tile. The tune (H100, 2026-12-06) times both: the tile
    wins from 128 rows of 8192 channels (1.5-3.7 %), ties at 32 rows, loses by 2 % or wins by 4 %
    at one row (noise): on where the table says so."""

    block_c: int
    num_warps: int
    tile: bool = False
    vector: bool = False
    """One token through the decode path's vector form (``_conv_kernels._decode_rows``: each channel's
    state and weight rows read as one vector, the shifted row written as one) where the layout allows
    (``[C, K]`` rows, the state ``K`` wide); not yet timed on a GPU (2026-12-08: the sweep's candidates)."""


_RESULTS = "benchmarks/results/tune_causal_conv1d.md"
_T_CLASSES = (1, 64, 512, 4096, 16384)
"""Token classes (tokens per row, from), each measured at its first value."""
_C_CLASSES = ((1, 4096), (6144, 8192), (10240, 11520))
"""Channel classes (from, measured at): Kimi in vLLM / Lara 4096; Qwen3-Next 8192; OLMo-hybrid
11520 and Kimi / Bailing in transformers 12288 (the sweep times both; the class's best sums both)."""


def _guess(tokens: int) -> LaunchConfig:
    """The shapes of the kernel measured on the H200 (2026-12-03, d5304b8: 99.3 us at 8192 x 4096,
    ``benchmarks/results/causal_conv1d.md``): the register window, 256 channels a warp, 8 / 16 /
    32 / 64 tokens a program as T grows: the classes the sweep has not timed."""
    if tokens < 64:
        return LaunchConfig(8, 256, 1, 1, 8, True)
    if tokens < 512:
        return LaunchConfig(16, 256, 1, 1, 8, True)
    if tokens < 4096:
        return LaunchConfig(32, 512, 2, 1, 8, True)
    return LaunchConfig(64, 1024, 4, 1, 8, True)


_SWEPT = "NVIDIA H200, triton 3.6.0, 2026-12-05 16:40 UTC"
_SWEPT_SHORT = "NVIDIA H200, triton 3.6.0, 2026-12-05 19:07 UTC"
_SHORT = LaunchConfig(16, 128, 4, 1, 8, False)
_STREAMED = "NVIDIA H100 80GB HBM3, triton 3.6.0, 2026-12-05 21:29 UTC"
_STREAM_4K = LaunchConfig(32, 128, 1, 1, 2, True, True, True, 4)
_STREAM_16K = LaunchConfig(64, 128, 1, 1, 4, True, True, True, 2)
_TUNED_S11 = "NVIDIA H100 80GB HBM3, triton 3.6.0, 2026-12-06 10:41 UTC"
_MEASURED = {
    (64, 1): (_SHORT, f"2.88 us at C=4096 T=64 (the guess, 16 x 256 window: 10.38); {_SWEPT_SHORT}: {_RESULTS}"),
    (64, 6144): (_SHORT, f"3.13 us at C=8192 T=64 (16 x 256 window: 10.96); {_SWEPT_SHORT}: {_RESULTS}"),
    (64, 10240): (_SHORT, f"3.53 us at C=12288 T=64 (16 x 256 window: 12.50); {_TUNED_S11}: {_RESULTS}"),
    (512, 1): (_SHORT, f"5.92 us at C=4096 T=512 (32 x 512 window: 18.49); {_SWEPT_SHORT}: {_RESULTS}"),
    (512, 6144): (_SHORT, f"9.44 us at C=8192 T=512 (32 x 512 window: 20.26); {_SWEPT_SHORT}: {_RESULTS}"),
    (4096, 6144): (_STREAM_4K, f"61.78 us at C=8192 T=4096 (the config before, 64 x 256 window, same run: 67.17); "
                               f"{_STREAMED}: {_RESULTS}"),
    (4096, 10240): (_STREAM_4K, f"86.65 us at C=12288 T=4096 (64 x 128 window: 95.59); {_STREAMED}: {_RESULTS}"),
    (16384, 6144): (_STREAM_16K, f"203.49 us at C=8192 T=16384 (64 x 128 window: 247.24); {_STREAMED}: {_RESULTS}"),
    (16384, 10240): (_STREAM_16K, f"299.32 us at C=12288 T=16384 (64 x 128 window: 358.44); {_STREAMED}: "
                                  f"{_RESULTS}"),
}
"""The classes the sweep has timed (the sweep's best of the candidates it reached in its budget):
one warp a program over 128 channels, the streaming window (the next rows in flight, the silu's
division through PTX, 2-4 steps unrolled) from 4,096 tokens (the second sweep, H100: 8-18% faster
than the first sweep's plain window there, timed side by side; bit-exact on the sweep's inputs, and
its CUDA tests, every 16-bit value through the PTX division included, passed on that H100 on
2026-12-06 with these launches as the table's); below
4,096 tokens, 16 tokens x 128 channels a program over 4 warps without the register window (3-3.5x
faster than the window's guess there)."""

def _provisional(t: int, c: int, at: int) -> tuple[LaunchConfig, str]:
    """An untimed class's launch: the one the sweep chose for its token class at another width (a
    program's tile and its registers do not depend on the width; the widest such class), else
    :func:`_guess`. The guesses from 512 tokens spill as launched for sm_90 (Triton 3.6,
    ``tests/aot_sm90.py --as-launched --registers _conv_launch`` with launch values recorded by
    ``recorded_launch``, 2026-12-07): 64 x 1024 over 4
    warps 255 registers and 616 stack bytes (904 in Qwen3-Next's cat form), 32 x 512 over 2
    warps 255 and 184; the measured launches 72-96 registers, none spilled."""
    timed = [(cc, cfg) for (tt, cc), (cfg, _) in _MEASURED.items() if tt == t]
    where = f"measure: {_RESULTS}, row T={t} C={at}"
    if not timed:
        return _guess(t), f"provisional: T >= {t}, C >= {c}, the register window's guess; {where}"
    width, cfg = max(timed, key=lambda x: x[0])
    return cfg, (f"provisional: T >= {t}, C >= {c}, the launch timed for T >= {t} at C >= {width} (the "
                 f"register window's guess spills as launched); {where}")


PREFILL_CONFIGS = tuple((t, c, *(_MEASURED.get((t, c)) or _provisional(t, c, at)))
                        for t in _T_CLASSES for c, at in _C_CLASSES)
"""``(from tokens per row, from channels, config, note)``, ordered: a shape takes the last row
both of whose bounds it meets. Rows the sweep has not timed yet take :func:`_provisional`'s launch
and say so in their note."""

UPDATE_CONFIGS = (
    (1, UpdateConfig(64, 1), f"1.72 us at B 1 x 8192, 1.73 at B 1 x 12288 (128 channels a program: 1.99, "
                             f"2.07); {_SWEPT}: {_RESULTS}"),
    (1 << 16, UpdateConfig(256, 2), f"3.24 us at B 32 x 8192, 3.85 at B 32 x 12288 (256 over one warp: 3.49, "
                                    f"4.11); {_SWEPT}: {_RESULTS}"),
    (1 << 19, UpdateConfig(128, 1, True), f"7.21 us at B 128 x 8192, 9.72 at B 128 x 12288 (the same launch "
                                          f"without the tile, same run: 7.32, 10.09); {_TUNED_S11}: {_RESULTS}"),
)
"""Update configs by the channels of the whole batch (``B * C``), from the smallest they serve, as
the sweep chose them (FLA's ``causal_conv1d_update``: 3.83 / 11.23 us at B 32 / 128 x 8192 in the
same session, ``benchmarks/results/causal_conv1d.md``)."""
UPDATE_MAX_T = 64
"""Tokens per row up to which the update op runs one launch (each program every token of its
channels); above, the prefill launch and then the state shift (``CONV=False``)."""


def next_power_of_2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def fit(cfg: LaunchConfig, tokens: int, channels: int) -> LaunchConfig:
    """``cfg`` for ``tokens`` per row and ``channels``: tokens per program capped at the tokens,
    channel blocks at the channels (powers of two), warps at what the tile keeps busy (256
    channels a warp in the window; 256 values of a block of taps)."""
    block_t = min(cfg.block_t, next_power_of_2(max(int(tokens), 1)))
    rows = min(cfg.rows, block_t)
    block_c = min(cfg.block_c, max(8, next_power_of_2(int(channels))))
    per_warp = block_c if cfg.window or cfg.prefetch else rows * block_c
    return cfg._replace(block_t=block_t, rows=rows, block_c=block_c,
                        num_warps=max(1, min(cfg.num_warps, per_warp // 256)))


def launch_config(tokens: int, channels: int, batch: int = 1) -> LaunchConfig:
    """The prefill config of ``PREFILL_CONFIGS`` for ``tokens`` per row and ``channels``
    (:func:`fit`)."""
    cfg = [c for t, ch, c, _ in PREFILL_CONFIGS if int(tokens) >= t and int(channels) >= ch][-1]
    return fit(cfg, tokens, channels)


def update_config(tokens: int, channels: int, batch: int) -> UpdateConfig:
    """The update config of ``UPDATE_CONFIGS`` for ``batch * channels`` (:func:`fit_update`)."""
    return fit_update([c for start, c, _ in UPDATE_CONFIGS if int(batch) * int(channels) >= start][-1], channels)


def fit_update(cfg: UpdateConfig, channels: int) -> UpdateConfig:
    """``cfg`` for ``channels``: the channel block capped at the channels (a power of two), warps
    at one channel a thread (32 a warp) at most. (Until 2026-12-08 the cap was 128 channels a warp, so
    no sweep tried fewer than 2 channels a thread; FLA's update, 27 % faster at B 32 / 128 on the
    H100, runs about one. The shipped configs keep their warps under either cap.)"""
    block_c = min(cfg.block_c, max(8, next_power_of_2(int(channels))))
    return cfg._replace(block_c=block_c, num_warps=max(1, min(cfg.num_warps, block_c // 32)))


# --------------------------------------------------------------------------------------
# the channel blocks
# --------------------------------------------------------------------------------------
class Source(NamedTuple):
    """One source as the kernels read it: ``H`` heads of ``D`` channels, strides in elements."""

    t: object
    H: int
    D: int
    sb: int
    st: int
    sh: int
    sd: int


def read_sources(x) -> list[Source] | None:
    """The kernels' view of ``x`` (``[B, C, T]``: one source of one head) or of the ``_cat``
    ops' sources list; None where the sources do not share batch / token / channel strides
    (then the launcher reads their cat)."""
    if not isinstance(x, (list, tuple)):
        return [Source(x, 1, x.shape[1], x.stride(0), x.stride(2), 0, x.stride(1) if x.shape[1] > 1 else 1)]
    out = []
    for t in x:
        if t.dim() == 3:
            out.append(Source(t, 1, t.shape[2], t.stride(0), t.stride(1), 0, t.stride(2)))
        else:
            sd = t.stride(3) if t.shape[3] > 1 else 1
            out.append(Source(t, t.shape[2], t.shape[3], t.stride(0), t.stride(1), t.stride(2), sd))
    shared = {(s.sb if s.t.shape[0] > 1 else 0, s.st if s.t.shape[1] > 1 else 0, s.sd) for s in out}
    return out if len(shared) == 1 else None


def head_block(srcs: list[Source], block_c: int) -> tuple[int, int]:
    """``(BH, BD)``: ``BD`` channels of a head per tile row (the largest power of two up to 128
    dividing every source's head size; at least 8, masked, where none does), ``BH`` rows."""
    g = 0
    for s in srcs:
        g = math.gcd(g, s.D)
    bd = min(128, block_c, g & -g if g else 1)
    if bd < 8:
        bd = min(block_c, 128, next_power_of_2(min(s.D for s in srcs)))
    return max(1, block_c // bd), bd


def geometry(srcs: list[Source], bh: int, bd: int) -> tuple[dict, int]:
    """The kernels' per-source constexprs (heads, head size, head stride, first block, first
    output channel; unused sources repeat source 0) and the number of channel blocks."""
    geo, block, chan = {}, 0, 0
    for i in range(MAX_SOURCES):
        s = srcs[i] if i < len(srcs) else None
        if s is None:
            geo.update({f"H{i}": 0, f"D{i}": 1, f"SH{i}": 0} | ({f"JB{i}": 1 << 30, f"CO{i}": 0} if i else {}))
            continue
        geo.update({f"H{i}": s.H, f"D{i}": s.D, f"SH{i}": s.sh} | ({f"JB{i}": block, f"CO{i}": chan} if i else {}))
        block += -(-s.H * -(-s.D // bd) // bh)
        chan += s.H * s.D
    return geo, block


QWEN3_NEXT_SOURCES = ((16, 128, 768), (16, 128, 768), (16, 256, 768))
"""Qwen3-Next's ``cat(q, k, v)`` as the kernels read it: (heads, head size, head stride) of each
source, views of the ``[B, T, 16, 768]`` qkvz projection (TP1)."""


def aot_geometry(sources, block_c: int) -> dict:
    """:func:`geometry`'s constexprs for sources given as ``(H, D, SH)`` (no tensors)."""
    srcs = [Source(None, h, d, 0, 0, sh, 1) for h, d, sh in sources]
    bh, bd = head_block(srcs, block_c)
    geo, _ = geometry(srcs, bh, bd)
    return dict(geo, C=sum(h * d for h, d, _ in sources), NSRC=len(srcs), BH=bh, BD=bd)
