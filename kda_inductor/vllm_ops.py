"""vLLM's DeepSeek-V3.2 indexer cache ops on our Triton kernels: the plugin door (opt-in).

vLLM runs the indexer's cache write and prefill gather inside its opaque custom op
``vllm::sparse_attn_indexer``, where no graph pass sees them; they call
``vllm._custom_ops.indexer_k_quant_and_cache`` and ``cp_gather_indexer_k_quant_cache`` (its
CUDA ops). With ``KDA_INDUCTOR_VLLM_OPS=1`` in the environment, our ``vllm.general_plugins``
entry point (:func:`kda_inductor.vllm_plugin`, which vLLM calls in every process at start-up)
replaces those two functions with :func:`indexer_k_quant_and_cache` and
:func:`cp_gather_indexer_k_quant_cache` below: vLLM's signatures, run on our kernels where the
arguments are in the domain we validated against vLLM's CUDA ops (bytes identical on the
H200, ``benchmarks/results/vllm_indexer_ops.md``), vLLM's own op for anything else. Without
the variable nothing is replaced. :func:`install` does the same from Python.

What vLLM's ops compute (read in vLLM's ``csrc/libtorch_stable/cache_kernels.cu``) and the
domain we take over:

* ``indexer_k_quant_and_cache(k, kv_cache, slot_mapping, quant_block_size, kv_cache_dtype)``:
  for token ``t`` of ``k`` (bf16) with slot ``s = slot_mapping[t] >= 0`` (``-1``: padding, skipped), per group
  of 128 values ``scale = max(amax, 1e-4) / 448`` (``kv_cache_dtype == "ue8m0"``: rounded up
  to a power of two; any other string: plain), ``fp8_e4m3(x / scale)`` saturated, values at
  ``block * block_size * stride + offset * head_dim``, float32 scales after the block's values
  (our blocked layout). Ours where: CUDA tensors on one device; ``k`` 2-D bf16, contiguous, ``head_dim`` a multiple of 128; ``quant_block_size == 128`` (vLLM's warp
  reduction spans 128 values); ``kv_cache`` uint8 ``[blocks, block_size, head_dim + 4 *
  head_dim / 128]`` contiguous; ``slot_mapping`` int64, 1-D, contiguous, one slot per token.
  A slot past the cache traps (a device-side assert) where vLLM's kernel writes out of bounds.
* ``cp_gather_indexer_k_quant_cache(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)``:
  ``dst_k.shape[0]`` rows; token ``t`` of request ``b`` (``cu_seq_lens[b] <= t <
  cu_seq_lens[b + 1]``, ``b < block_table.shape[0]``) is read from block
  ``block_table[b, pos // block_size]`` at ``pos % block_size``: its value bytes into row
  ``t`` of ``dst_k``, its scale bytes into row ``t`` of ``dst_scale`` (uint8 ``[N, 4 *
  head_dim / 128]``, the float32 scales' bytes). Ours where: CUDA, one device; ``kv_cache``
  uint8 3-D contiguous with rows of ``head_dim + 4 * head_dim / 128`` bytes; ``dst_k`` 2-D, 1
  byte per element (fp8 / uint8), contiguous, ``head_dim`` a multiple of 128; ``dst_scale``
  2-D uint8 / int8 contiguous ``[dst_k.shape[0], 4 * head_dim / 128]`` (vLLM derives its
  quant block from ``dst_scale.shape[1]``: any other shape is another layout, such as its
  MXFP4 cache, left to vLLM); ``block_table`` int32 2-D contiguous; ``cu_seq_lens`` int32
  contiguous ``[block_table.shape[0] + 1]``. Rows past the last request (vLLM's prefill
  workspace can be longer than the chunk's tokens) are undefined in vLLM's kernel (its
  request search leaves them unset); ours reads nothing for them. Our kernel runs without
  its device asserts here, as vLLM's has none.

Both run sync-free and capture in CUDA graphs (vLLM's breakable graphs included).
``torch._dynamo.utils.counters["kda_inductor_vllm_ops"]`` counts calls taken (``write``,
``gather``) and left to vLLM (``write_fallback``, ``gather_fallback``); the first fallback for
each reason is logged at INFO on the ``kda_inductor`` log.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

import torch

from kda_inductor.reference import QUANT_GROUP, CacheLayout

ENV = "KDA_INDUCTOR_VLLM_OPS"
COUNTER_KEY = "kda_inductor_vllm_ops"
DEVICE_TYPES: tuple[str, ...] = ("cuda",)
"""Devices whose tensors the door takes (the tests add "cpu" to run our kernels under Triton's
interpreter)."""
_K_DTYPES = (torch.bfloat16,)
"""vLLM's kernel reads ``k`` four 16-bit values at a time and takes their ``float()``: right
for bf16 (DeepSeek-V3.2's dtype); for fp16 its dispatch passes raw ``uint16_t`` bits to that
``float()``, and fp32 rows are read as 16-bit pairs: not a computation to reproduce."""
_log = logging.getLogger("kda_inductor")
_logged: set[str] = set()
_originals: dict[str, Callable[..., Any]] = {}


def requested() -> bool:
    """The user asked for the door: ``KDA_INDUCTOR_VLLM_OPS`` set to anything but ``""``/``0``."""
    return os.environ.get(ENV, "").strip() not in ("", "0")


def install(ops: Any = None) -> bool:
    """Replace vLLM's two indexer cache functions in ``vllm._custom_ops`` (or ``ops``) with
    ours. Idempotent; returns True when ours are in place."""
    if ops is None:
        import vllm._custom_ops as ops
    for name, door in (("indexer_k_quant_and_cache", indexer_k_quant_and_cache),
                       ("cp_gather_indexer_k_quant_cache", cp_gather_indexer_k_quant_cache)):
        current = getattr(ops, name)
        if current is not door:
            _originals[name] = current
            setattr(ops, name, door)
    return True


def uninstall(ops: Any = None) -> None:
    """Put vLLM's own functions back."""
    if ops is None:
        import vllm._custom_ops as ops
    for name, original in list(_originals.items()):
        setattr(ops, name, original)
        del _originals[name]


def _count(key: str) -> None:
    from torch._dynamo.utils import counters

    counters[COUNTER_KEY][key] += 1


def _fallback(name: str, why: str, *args: Any) -> None:
    _count(("write" if name == "indexer_k_quant_and_cache" else "gather") + "_fallback")
    if why not in _logged:
        _logged.add(why)
        _log.info("kda_inductor: vllm %s left to vLLM's own op: %s", name, why)
    original = _originals.get(name)
    if original is None:  # called directly, not installed: vLLM's op through its torch.ops name
        original = getattr(torch.ops._C_cache_ops, name)
    original(*args)


def _common(tensors: dict[str, torch.Tensor]) -> str | None:
    device = None
    for arg, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.device.type not in DEVICE_TYPES:
            return f"{arg} is not a CUDA tensor"
        if device is not None and t.device != device:
            return f"{arg} is on {t.device}, not {device}"
        device = t.device
        if not t.is_contiguous():
            return f"{arg} is not contiguous"
    return None


def write_unsupported(k, kv_cache, slot_mapping, quant_block_size, kv_cache_dtype) -> str | None:
    """Why our kernel does not take this ``indexer_k_quant_and_cache`` call (None: it does)."""
    why = _common({"k": k, "kv_cache": kv_cache, "slot_mapping": slot_mapping})
    if why:
        return why
    if k.dim() != 2 or k.dtype not in _K_DTYPES or k.shape[1] == 0 or k.shape[1] % QUANT_GROUP:
        return f"k is {k.dim()}-D {k.dtype} {tuple(k.shape)}, not bf16 [T, 128 * G]"
    if quant_block_size != QUANT_GROUP:
        return f"quant_block_size is {quant_block_size}, not {QUANT_GROUP}"
    if not isinstance(kv_cache_dtype, str):
        return f"kv_cache_dtype is {type(kv_cache_dtype).__name__}, not a str"
    row = CacheLayout(k.shape[1]).row_bytes
    if kv_cache.dtype != torch.uint8 or kv_cache.dim() != 3 or kv_cache.shape[2] != row:
        return f"kv_cache is {kv_cache.dim()}-D {kv_cache.dtype} {tuple(kv_cache.shape)}, not uint8 [blocks, bs, {row}]"
    if slot_mapping.dtype != torch.int64 or slot_mapping.dim() != 1 or slot_mapping.shape[0] != k.shape[0]:
        return f"slot_mapping is {slot_mapping.dim()}-D {slot_mapping.dtype} {tuple(slot_mapping.shape)}, " \
               f"not int64 [{k.shape[0]}]"
    return None


def gather_unsupported(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens) -> str | None:
    """Why our kernel does not take this ``cp_gather_indexer_k_quant_cache`` call (None: it does)."""
    why = _common({"kv_cache": kv_cache, "dst_k": dst_k, "dst_scale": dst_scale, "block_table": block_table,
                   "cu_seq_lens": cu_seq_lens})
    if why:
        return why
    if dst_k.dim() != 2 or dst_k.element_size() != 1 or dst_k.shape[1] == 0 or dst_k.shape[1] % QUANT_GROUP:
        return f"dst_k is {dst_k.dim()}-D {dst_k.dtype} {tuple(dst_k.shape)}, not 1-byte [N, 128 * G]"
    head_dim, n = dst_k.shape[1], dst_k.shape[0]
    layout = CacheLayout(head_dim)
    sb, row = layout.scale_bytes, layout.row_bytes
    if dst_scale.dtype not in (torch.uint8, torch.int8) or tuple(dst_scale.shape) != (n, sb):
        return f"dst_scale is {dst_scale.dtype} {tuple(dst_scale.shape)}, not uint8 [{n}, {sb}]"
    if kv_cache.dtype != torch.uint8 or kv_cache.dim() != 3 or kv_cache.shape[2] != row:
        return f"kv_cache is {kv_cache.dim()}-D {kv_cache.dtype} {tuple(kv_cache.shape)}, not uint8 [blocks, bs, {row}]"
    if block_table.dtype != torch.int32 or block_table.dim() != 2:
        return f"block_table is {block_table.dim()}-D {block_table.dtype}, not int32 2-D"
    if cu_seq_lens.dtype != torch.int32 or tuple(cu_seq_lens.shape) != (block_table.shape[0] + 1,):
        return f"cu_seq_lens is {cu_seq_lens.dtype} {tuple(cu_seq_lens.shape)}, not int32 [{block_table.shape[0] + 1}]"
    return None


def indexer_k_quant_and_cache(
    k: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    quant_block_size: int,
    kv_cache_dtype: str,
) -> None:
    """vLLM's ``indexer_k_quant_and_cache`` on ``kda::indexer_k_write``'s kernel (see the module)."""
    why = write_unsupported(k, kv_cache, slot_mapping, quant_block_size, kv_cache_dtype)
    if why:
        return _fallback("indexer_k_quant_and_cache", why, k, kv_cache, slot_mapping, quant_block_size,
                         kv_cache_dtype)
    from kda_inductor.lowerings.indexer_k_write import write_triton

    write_triton(kv_cache, k, slot_mapping, ue8m0=kv_cache_dtype == "ue8m0")
    _count("write")


def cp_gather_indexer_k_quant_cache(
    kv_cache: torch.Tensor,
    dst_k: torch.Tensor,
    dst_scale: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
) -> None:
    """vLLM's ``cp_gather_indexer_k_quant_cache`` on ``kda::indexer_k_gather``'s kernel (see the module)."""
    why = gather_unsupported(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)
    if why:
        return _fallback("cp_gather_indexer_k_quant_cache", why, kv_cache, dst_k, dst_scale, block_table,
                         cu_seq_lens)
    from kda_inductor.lowerings.indexer_k_gather import gather_triton

    gather_triton(kv_cache, block_table, cu_seq_lens, dst_k.view(torch.uint8), dst_scale.view(torch.uint8),
                  check=False)
    _count("gather")
