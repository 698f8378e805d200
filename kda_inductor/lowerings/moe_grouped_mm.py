"""``kda::moe_grouped_mm``: a MoE layer's grouped GEMM at decode sizes, each expert's weights streamed once.

``out[r] = x[r] @ w[e]`` for the rows ``r`` of group ``e`` (``offs[e - 1] <= r < offs[e]``, ``offs[-1]`` as
0), for ``x [S, K]`` (the (token, expert) pairs sorted by expert), ``w [E, K, N]`` (any strides: the
experts' ``[E, N, K]`` weights transposed is a view) and ``offs [E]`` int32, each group's end: what
``torch._grouped_mm(x, w, offs=offs)`` computes, as transformers' ``grouped_mm`` experts and the
``moe_grouped_experts`` rewrite call it. The output is ``[S, N]`` in ``x``'s dtype; rows at or past
``offs[-1]`` are left unwritten, as torch leaves them (transformers' expert-parallel sentinels).

The CPU implementation is ``torch._grouped_mm`` itself (bf16; other dtypes a loop over the groups,
float32 sums). The CUDA kernel (bf16 / fp16) is for few rows per expert (a decode step: 320 pairs over
16-512 experts): one program per expert and ``BLOCK_N`` output columns streams that expert's ``[K,
BLOCK_N]`` weight slab once per ``BLOCK_M`` rows of its group (most groups fit one block at decode),
``tl.dot`` of the rows against each ``[BLOCK_K, BLOCK_N]`` tile in float32, a group with no rows
reading nothing. Weight bytes dominate there (``E_used x K x N``), so the floor is reading them once;
torch's grouped GEMM (CUTLASS, tiled for large groups) took 225.8 us for the 8 calls of Qwen3-Next's
decode-32 step against ~133 us for the weights read once (H100, 19e7fc8, ``hf_models.json``'s kernel
table). Against it (H100, 2026-12-07, ``benchmarks/bench_moe_grouped_mm.py``, ``results/moe_grouped_mm.md``):
0.44-0.95x its time at 10 and 320 pairs, within 1.0-1.2x of the weights' floor there; slower where groups
are long (80 rows: 1.75x; a 4,096-token prefill: 1.1-4.0x), which the pattern's speed rule leaves to torch."""

from __future__ import annotations

import torch
from torch import Tensor

from kda_inductor.lowerings import arg_error as _err
from kda_inductor.lowerings import check_tensor, definitely
from kda_inductor.lowerings._gdn_tiles import sm_count
from kda_inductor.lowerings._triton import tl, triton

HALF = (torch.bfloat16, torch.float16)
DTYPES = (*HALF, torch.float32)


def validate(x: Tensor, w: Tensor, offs: Tensor) -> None:
    """Errors that name the argument: ``x [S, K]``, ``w [E, K, N]`` of ``x``'s dtype and device,
    ``offs [E]`` int32 on that device."""
    for name, t in (("x", x), ("w", w), ("offs", offs)):
        check_tensor(t, name)
        if t.device != x.device:
            raise _err(name, f"expected x's device {x.device}, got {t.device}")
    if x.dim() != 2:
        raise _err("x", f"expected a 2-D tensor [S, K] (the pairs' rows sorted by expert), got {tuple(x.shape)}")
    if x.dtype not in DTYPES:
        raise _err("x", f"expected bf16, fp16 or fp32, got {x.dtype}")
    if w.dim() != 3 or not definitely(w.shape[1] == x.shape[1]):
        raise _err("w", f"expected [E, K={x.shape[1]}, N] (one [K, N] matrix an expert), got {tuple(w.shape)}")
    if w.dtype != x.dtype:
        raise _err("w", f"expected x's dtype {x.dtype}, got {w.dtype}")
    if offs.dim() != 1 or offs.dtype != torch.int32 or not definitely(offs.shape[0] == w.shape[0]):
        raise _err("offs", f"expected [E={w.shape[0]}] int32 (each expert's end row), got "
                   f"{tuple(offs.shape)} {offs.dtype}")


@torch.library.custom_op("kda::moe_grouped_mm", mutates_args=(), device_types="cpu")
def moe_grouped_mm(x: Tensor, w: Tensor, offs: Tensor) -> Tensor:
    """``torch._grouped_mm(x, w, offs=offs)`` for ``x [S, K]``, ``w [E, K, N]``, ``offs [E]`` int32."""
    validate(x, w, offs)
    if x.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm"):
        return torch._grouped_mm(x, w, offs=offs)
    return reference(x, w, offs)


@moe_grouped_mm.register_fake
def _moe_grouped_mm_fake(x, w, offs):
    validate(x, w, offs)
    return x.new_empty((x.shape[0], w.shape[2]))


@moe_grouped_mm.register_kernel("cuda")
def _moe_grouped_mm_cuda(x, w, offs):
    validate(x, w, offs)
    if x.dtype not in HALF:
        return reference(x, w, offs)
    out = x.new_empty((x.shape[0], w.shape[2]))
    grouped_triton(x, w, offs, out)
    return out


def reference(x: Tensor, w: Tensor, offs: Tensor) -> Tensor:
    """The groups one by one in float32 (a host sync: the CPU's and the tests' reference); rows past
    ``offs[-1]`` zero."""
    out = torch.zeros((x.shape[0], w.shape[2]), dtype=x.dtype, device=x.device)
    start = 0
    for e, end in enumerate(offs.tolist()):
        end = min(max(end, start), x.shape[0])
        out[start:end] = (x[start:end].float() @ w[e].float()).to(x.dtype)
        start = end
    return out


def launch_for(S: int, E: int, K: int, N: int, sms: int) -> tuple[int, int, int, int, int]:
    """The launch for ``S`` rows over ``E`` groups: rows per block the average group's (16-64: one block
    for most groups at decode), ``BLOCK_N`` 64 where the experts x column blocks give each SM two
    programs, else 32; keys 128 at a time (64 where K is smaller); three or four tiles in flight. Blocks of
    32 rows over K <= 512 (Qwen3-Next's down projection at decode 32): 32 x 128 x 64, 8 warps, 3 stages
    (H100, 2026-12-07: 8.15 us against 12.26 for 32 x 64 x 128 / 4 / 4 and torch's 21.97;
    ``results/moe_grouped_mm.md``)."""
    avg = -(-max(S, 1) // max(E, 1))
    block_m = min(64, max(16, 1 << (avg - 1).bit_length()))
    if block_m == 32 and 64 <= K <= 512:
        return 32, 128, 64, 8, 3
    block_n = 64 if E * -(-N // 64) >= 2 * sms else 32
    block_k = 128 if K >= 128 else max(16, 1 << (K - 1).bit_length())
    return block_m, block_n, block_k, 4, 3 if block_m == 64 else 4


# --------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------
if triton is not None:

    @triton.jit
    def _rows_times_slab(x_ptr, w_ptr, rows, live, n, K, sx_m, sx_k, sw_k, sw_n, N,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """``[BLOCK_M, BLOCK_N]`` float32: the rows (``live``: in the group) times the expert's columns
        ``n``, over K in tiles of ``BLOCK_K``."""
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        kk = tl.arange(0, BLOCK_K)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + kk
            a = tl.load(x_ptr + rows[:, None] * sx_m + k[None, :] * sx_k, mask=live[:, None] & (k < K)[None, :],
                        other=0.0)
            b = tl.load(w_ptr + k[:, None] * sw_k + n[None, :] * sw_n, mask=(k < K)[:, None] & (n < N)[None, :],
                        other=0.0)
            acc = tl.dot(a, b, acc)
        return acc

    @triton.jit
    def grouped_kernel(x_ptr, w_ptr, offs_ptr, o_ptr, S, K, N, sx_m, sx_k, sw_e, sw_k, sw_n, so_m, so_n,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """Program ``(column block, expert e)``: the rows of group ``e`` (``[offs[e - 1], offs[e])``,
        clamped to ``[0, S)``) times its columns, ``BLOCK_M`` rows at a time; nothing for an empty group."""
        pn = tl.program_id(0)
        e = tl.program_id(1)
        end = tl.minimum(tl.load(offs_ptr + e), S)
        start = tl.load(offs_ptr + tl.maximum(e - 1, 0))
        start = tl.where(e > 0, start, 0)
        n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
        w_e = w_ptr + e.to(tl.int64) * sw_e
        for m0 in range(start, end, BLOCK_M):
            rows = m0 + tl.arange(0, BLOCK_M)
            live = rows < end
            acc = _rows_times_slab(x_ptr, w_e, rows, live, n, K, sx_m, sx_k, sw_k, sw_n, N, BLOCK_M, BLOCK_N, BLOCK_K)
            tl.store(o_ptr + rows[:, None].to(tl.int64) * so_m + n[None, :] * so_n, acc.to(o_ptr.dtype.element_ty),
                     mask=live[:, None] & (n < N)[None, :])


def grouped_triton(x: Tensor, w: Tensor, offs: Tensor, out: Tensor, launch: tuple | None = None,
                   sms: int | None = None) -> None:
    """Launch the kernel into ``out [S, N]`` (checked operands, bf16 / fp16)."""
    S, K = x.shape
    E, _, N = w.shape
    if S == 0 or E == 0 or N == 0:
        return
    block_m, block_n, block_k, warps, stages = launch or launch_for(
        S, E, K, N, sm_count(x.device) if sms is None else sms)
    grouped_kernel[(triton.cdiv(N, block_n), E)](
        x, w, offs, out, S, K, N, *x.stride(), *w.stride(), *out.stride(),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages)


def aot_variants():
    """The launches to compile ahead of time for sm_90: Qwen3-Next's decode-32 experts (320 pairs, 16
    experts: gate_up K 2,048 x N 1,024, down K 512 x N 2,048; the weights ``[E, N, K]`` transposed)."""
    from kda_inductor.lowerings import AotVariant

    ints = ("S", "K", "N", "sx_m", "sw_e", "sw_n", "so_m")
    types = {"x_ptr": "*bf16", "w_ptr": "*bf16", "offs_ptr": "*i32", "o_ptr": "*bf16",
             **{n: "i32" for n in ints}, "sx_k": "i32", "sw_k": "i32", "so_n": "i32"}
    for K, N in ((2048, 1024), (512, 2048)):
        block_m, block_n, block_k, warps, stages = launch_for(320, 16, K, N, 132)
        launch = {"S": 320, "K": K, "N": N, "sx_m": K, "sx_k": 1, "sw_e": K * N, "sw_k": 1, "sw_n": K,
                  "so_m": N, "so_n": 1}
        yield AotVariant(grouped_kernel, types, {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k},
                         {"num_warps": warps, "num_stages": stages}, launch)
