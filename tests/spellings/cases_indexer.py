"""DeepSeek-V3.2 indexer spellings: the K quantization + paged-cache write (``indexer_k_write``)
and the prefill gather (``indexer_k_gather``), as the public serving code writes them.

Each function is written in the style of the file named in its ``source`` (read with the
search tools; not copied). vLLM's CUDA path calls custom ops for both, so Inductor sees
these shapes in torch ports (vLLM's XPU ops, SGLang's index buffer accessors, TensorRT-LLM's
Python references) and in user code. The blocked layout: one block (page) holds
``block_size * head_dim`` fp8 value bytes, token-major, then ``block_size`` float32 scales
per 128 values (see ``kda_inductor/reference.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kda_inductor.reference import random_indexer_cache
from tests.spellings._corpus import Spelling, blocked_cache, exact, gen, poison

FP8 = torch.float8_e4m3fn
WRITE = {"indexer_k_write": 1}
GATHER = {"indexer_k_gather": 1}
VLLM = "vllm-project/vllm: "
SGLANG = "sgl-project/sglang: python/sglang/srt/layers/attention/nsa/index_buf_accessor.py"


# --------------------------------------------------------------------------- write inputs


def _k(g, tokens, head_dim, dtype=torch.bfloat16):
    """Random k with a few exact zeros and one all-zero 128-group (the 1e-4 floor matters)."""
    k = (torch.randn(tokens, head_dim, generator=g) * 3).to(dtype)
    k[0, :5] = 0
    k[min(1, tokens - 1), :128] = 0
    return k


def _slots(g, tokens, num_blocks, block_size, *, padding=(), first_block=1, dtype=torch.int64):
    """Distinct random slots in blocks ``first_block..``; ``padding`` tokens get -1."""
    s = torch.randperm((num_blocks - first_block) * block_size, generator=g)[:tokens] + first_block * block_size
    for t in padding:
        s[t] = -1
    return s.to(dtype)


def _write_inputs(tokens=11, head_dim=128, block_size=16, num_blocks=6, *, padding=(), slot_dtype=torch.int64,
                  k_dtype=torch.bfloat16, cache_2d=False):
    def make(seed):
        g = gen(seed)
        row = head_dim + 4 * (head_dim // 128)
        cache = poison(g, num_blocks, block_size, row)
        if cache_2d:
            cache = cache.view(num_blocks, block_size * row)
        return (_k(g, tokens, head_dim, k_dtype), cache,
                _slots(g, tokens, num_blocks, block_size, padding=padding, dtype=slot_dtype))
    return make


def _slot_arg(i):
    return lambda args: args[i]


# --------------------------------------------------------------------------- writes


def sglang_set_k_and_s(k, buf, loc):
    """SGLang's NSA index buffer: uint8 ``[num_pages, page_size * (128 + 4)]``, written by
    ``SetK.torch_fast`` + ``SetS.torch_fast`` (``buf.flatten()``, int32 ``arange`` byte offsets,
    ``flat_buf[flat_indices] = bytes.flatten()``). The quantization before it in the style of
    DeepSeek-V3.2's ``act_quant`` torch fallbacks: one 128-group per token, ue8m0."""
    page_size, head_dim = 64, 128
    x = k.float()
    amax = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-4)
    scale = torch.pow(2, torch.ceil(torch.log2(amax / 448.0)))
    index_k = (x / scale).clamp(-448.0, 448.0).to(FP8)
    index_k_scale = scale
    (num_tokens_to_write,) = loc.shape
    buf_numel_per_page = buf.shape[1]
    loc_page_index = loc // page_size
    loc_token_offset_in_page = loc % page_size
    flat_buf = buf.flatten()
    flat_indices = ((loc_page_index * buf_numel_per_page)[:, None]
                    + (loc_token_offset_in_page * head_dim)[:, None]
                    + torch.arange(head_dim, dtype=torch.int32, device=buf.device)[None, :])
    flat_indices = flat_indices.flatten()[: num_tokens_to_write * head_dim]
    flat_buf[flat_indices] = index_k.view(torch.uint8).flatten()
    s_offset_in_page = page_size * head_dim
    flat_indices = ((loc_page_index * buf_numel_per_page)[:, None] + s_offset_in_page
                    + (loc_token_offset_in_page * 4)[:, None]
                    + torch.arange(4, dtype=torch.int32, device=buf.device)[None, :])
    flat_indices = flat_indices.flatten()[: num_tokens_to_write * 4]
    flat_buf[flat_indices] = index_k_scale.view(torch.uint8).flatten()


def _unravel_indices(flat_indices, shape):
    """TensorRT-LLM's ``_unravel_indices`` style: flat byte offsets to 4-D cache coordinates."""
    d3 = shape[3]
    i3 = flat_indices % d3
    flat_indices = flat_indices // d3
    d2 = shape[2]
    i2 = flat_indices % d2
    flat_indices = flat_indices // d2
    d1 = shape[1]
    i1 = flat_indices % d1
    flat_indices = flat_indices // d1
    return flat_indices, i1, i2, i3


def trtllm_indexer_k_scatter(k, k_cache, global_positions, req_indices, block_offsets):
    """TensorRT-LLM's DSA indexer K cache: flat byte offsets per token from
    ``_compute_slot_mappings`` (block ids from the block-offset table, ``.to(torch.int64)``),
    then the Python reference scatter: offsets + ``arange`` unravelled into the layer's 4-D
    pool view ``[num_blocks, 1, 1, block_bytes]`` and ``k_cache[idx] = bytes``. The 1x128
    quantization (a CUDA op there) in torch, plain scales."""
    head_dim, tokens_per_block, quant_block_size = 128, 16, 128
    scale_size = head_dim // quant_block_size * 4
    block_stride = tokens_per_block * (head_dim + scale_size)
    scale_base_offset = tokens_per_block * head_dim
    block_indices_in_seq = global_positions // tokens_per_block
    pos_in_blocks = global_positions % tokens_per_block
    block_ids = block_offsets[req_indices, block_indices_in_seq].to(torch.int64)
    fp8_indices = block_ids * block_stride + pos_in_blocks * head_dim
    scale_indices = block_ids * block_stride + scale_base_offset + pos_in_blocks * scale_size
    x = k.float()
    amax = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-4)
    scale = amax / 448.0
    k_fp8 = (x / scale).clamp(-448.0, 448.0).to(FP8)
    k_fp8_bytes = k_fp8.view(torch.uint8)
    k_scale_bytes = scale.view(torch.uint8).view(k.shape[0], scale_size)
    byte_offsets = torch.arange(head_dim, device=k_cache.device).unsqueeze(0)
    k_cache[_unravel_indices(fp8_indices.unsqueeze(1) + byte_offsets, k_cache.shape)] = k_fp8_bytes
    byte_offsets = torch.arange(scale_size, device=k_cache.device).unsqueeze(0)
    k_cache[_unravel_indices(scale_indices.unsqueeze(1) + byte_offsets, k_cache.shape)] = k_scale_bytes


def _trtllm_inputs(seed):
    g = gen(seed)
    bs, nb = 16, 8
    cached, new = [5, 0, 20], [3, 4, 4]
    table = torch.randint(0, nb, (3, 3), generator=g, dtype=torch.int32)
    table[0, 0], table[1, 0], table[2, 0], table[2, 1] = 4, 2, 6, 1  # distinct blocks per request
    pos = torch.cat([torch.arange(c, c + n) for c, n in zip(cached, new)])
    req = torch.cat([torch.full((n,), r) for r, n in enumerate(new)])
    cache = poison(g, nb, 1, 1, bs * 132)
    return (_k(g, int(sum(new)), 128), cache, pos, req, table)


def _trtllm_slots(args):
    pos, req, table = args[2], args[3], args[4]
    return table[req, pos // 16].long() * 16 + pos % 16


def _put_blocked(q_bytes, scale_bytes, cache, slots):
    """The reference store: index_put into the flat ``[num_blocks, block_bytes]`` view."""
    nb, bs, row = cache.shape
    t, d = q_bytes.shape
    blk, off = slots // bs, slots % bs
    flat = cache.view(nb, -1)
    flat[blk[:, None], off[:, None] * d + torch.arange(d, device=cache.device)] = q_bytes
    flat[blk[:, None], bs * d + off[:, None] * (row - d) + torch.arange(row - d, device=cache.device)] = scale_bytes


def xpu_group_quant_blocked(k, kv_cache, slot_mapping):
    """vLLM XPU ``group_quant_torch``'s spellings (amax ``keepdim=False``, ``torch.maximum(amax,
    torch.tensor(eps))``, ``torch.finfo(fp8).max``, ``scales.unsqueeze(-1)``, ``torch.empty_like``
    + ``copy_``, ue8m0 ``torch.pow(2.0, ceil(log2))``) on float32 values with the 1e-4 floor,
    stored in the blocked layout; head_dim 256 (two groups, ``[T, G, 128]`` view)."""
    x = k.float()
    x_q = torch.empty_like(x, dtype=FP8)
    group_shape = x.shape[:-1] + (x.shape[-1] // 128, 128)
    x_grouped = x.view(group_shape)
    abs_max = torch.amax(torch.abs(x_grouped), dim=-1, keepdim=False)
    abs_max = torch.maximum(abs_max, torch.tensor(1e-4, device=x.device, dtype=x.dtype))
    fp8_max, fp8_min = torch.finfo(FP8).max, torch.finfo(FP8).min
    scales = torch.pow(2.0, torch.ceil(torch.log2(abs_max / fp8_max)))
    x_quantized = torch.clamp(x_grouped / scales.unsqueeze(-1), fp8_min, fp8_max).to(FP8)
    x_q.copy_(x_quantized.view(x.shape))
    _put_blocked(x_q.view(torch.uint8), scales.contiguous().view(torch.uint8), kv_cache, slot_mapping)


def one_group_clamp_min_exp2(k, kv_cache, slot_mapping):
    """head_dim 128 as ONE group: amax over the whole row, no ``[T, G, 128]`` view;
    ``clamp_min``; ue8m0 via ``exp2``; stored with ``view[blk, off] = ...`` into the value
    region ``[nb, bs, 128]`` and the float32 scale region ``[nb, bs, 1]``."""
    nb, bs, row = kv_cache.shape
    x = k.float()
    amax = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-4)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
    q = torch.clamp(x / scale, -448.0, 448.0).to(FP8)
    flat = kv_cache.view(nb, -1)
    values = flat[:, : bs * 128].view(nb, bs, 128)
    scales = flat[:, bs * 128:].view(torch.float32).view(nb, bs, 1)
    blk, off = slot_mapping // bs, slot_mapping % bs
    values[blk, off] = q.view(torch.uint8)
    scales[blk, off] = scale


def float32_k_index_copy(k, kv_cache, slot_mapping):
    """float32 ``k`` (no bf16 round trip before the quantization), plain scales, the store as
    two ``index_copy_`` of flattened bytes into ``kv_cache.view(-1)``."""
    nb, bs, row = kv_cache.shape
    t, d = k.shape
    x = k.view(t, -1, 128)
    scale = torch.clamp(x.abs().amax(-1, keepdim=True), min=1e-4) / 448.0
    q = torch.clamp(x / scale, -448.0, 448.0).to(FP8).view(t, d)
    base = (slot_mapping // bs) * (bs * row)
    off = slot_mapping % bs
    vidx = (base + off * d)[:, None] + torch.arange(d, device=k.device)
    sidx = (base + bs * d + off * (row - d))[:, None] + torch.arange(row - d, device=k.device)
    flat = kv_cache.view(-1)
    flat.index_copy_(0, vidx.reshape(-1), q.view(torch.uint8).reshape(-1))
    flat.index_copy_(0, sidx.reshape(-1), scale.view(t, -1).view(torch.uint8).reshape(-1))


class VllmLayerNormThenWrite(nn.Module):
    """vLLM's DeepSeek-V3.2 ``Indexer``: ``k_norm`` is vLLM's ``LayerNorm`` (float32 weight and
    bias, ``F.layer_norm(x.float(), ...).type_as(x)``), then the quant + cache write (a custom
    op there; here the reference masked form, padding slots -1). ue8m0."""

    def __init__(self):
        super().__init__()
        g = gen(50)
        self.weight = nn.Parameter(torch.rand(128, generator=g) + 0.5)
        self.bias = nn.Parameter(torch.randn(128, generator=g) * 0.1)

    def forward(self, k, kv_cache, slot_mapping):
        k = F.layer_norm(k.float(), (128,), self.weight, self.bias, 1e-6).type_as(k)
        nb, bs, row = kv_cache.shape
        x = k.float().view(k.shape[0], 1, 128)
        scale = torch.pow(2.0, torch.ceil(torch.log2(x.abs().amax(-1, keepdim=True).clamp(min=1e-4) / 448.0)))
        q = (x / scale).clamp(-448.0, 448.0).to(FP8).view(k.shape[0], 128)
        valid = (slot_mapping >= 0)[:, None]
        slot = slot_mapping.clamp(min=0)
        blk, off = (slot // bs)[:, None], slot % bs
        flat = kv_cache.view(nb, -1)
        cols = off[:, None] * 128 + torch.arange(128, device=k.device)
        flat[blk, cols] = torch.where(valid, q.view(torch.uint8), flat[blk, cols])
        scols = bs * 128 + off[:, None] * 4 + torch.arange(4, device=k.device)
        flat[blk, scols] = torch.where(valid, scale.view(k.shape[0], 1).view(torch.uint8), flat[blk, scols])


def aiter_rows_torch_max(k, kv_cache, slot_mapping):
    """AMD aiter's ``indexer_k_quant_and_cache`` test reference spellings: groups as rows
    (``k.view(-1, quant_block_size)``), ``torch.max(..., dim=-1, keepdim=True)`` (values,
    indices), ``/ torch.finfo(fp8).max``, with the 1e-4 floor; head_dim 256."""
    t, d = k.shape
    x = k.float().view(-1, 128)
    amax, _ = torch.max(torch.abs(x), dim=-1, keepdim=True)
    scale = amax.clamp(min=1e-4) / torch.finfo(FP8).max
    q = (x / scale).clamp(-448.0, 448.0).to(FP8).view(t, d)
    _put_blocked(q.view(torch.uint8), scale.view(t, -1).view(torch.uint8), kv_cache, slot_mapping)


def _quant_ref(k, ue8m0=True):
    x = k.float().view(k.shape[0], -1, 128)
    scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-4) / 448.0
    if ue8m0:
        scale = torch.pow(2.0, torch.ceil(torch.log2(scale)))
    q = (x / scale).clamp(-448.0, 448.0).to(FP8).view(k.shape)
    return q.view(torch.uint8), scale.view(k.shape[0], -1).view(torch.uint8)


def unmasked_negative_slot(k, kv_cache, slot_mapping):
    """The store with padding slots (-1) NOT masked: Python indexing writes slot -1 into the
    last block's last row (``-1 // bs == -1``, ``-1 % bs == bs - 1``); the fused op must too
    (do exactly what the matched code does)."""
    q, s = _quant_ref(k)
    _put_blocked(q, s, kv_cache, slot_mapping)


def _wrapped_slots(args):
    cache, s = args[1], args[2]
    return torch.where(s < 0, s + cache.shape[0] * cache.shape[1], s)


def vllm_truncated_k_masked(k, kv_cache, slot_mapping):
    """vLLM ``sparse_attn_indexer``: ``k`` padded to the CUDA-graph batch, cut to
    ``slot_mapping.shape[0]`` tokens first; padding slots -1 masked with ``torch.where``."""
    num_tokens = slot_mapping.shape[0]
    k = k[:num_tokens]
    q, s = _quant_ref(k)
    nb, bs, row = kv_cache.shape
    valid = (slot_mapping >= 0)[:, None]
    slot = slot_mapping.clamp(min=0)
    blk, off = (slot // bs)[:, None], slot % bs
    flat = kv_cache.view(nb, -1)
    cols = off[:, None] * 128 + torch.arange(128, device=k.device)
    flat[blk, cols] = torch.where(valid, q, flat[blk, cols])
    scols = bs * 128 + off[:, None] * 4 + torch.arange(4, device=k.device)
    flat[blk, scols] = torch.where(valid, s, flat[blk, scols])


def _truncated_inputs(seed):
    g = gen(seed)
    k = _k(g, 16, 128)  # padded to 16 rows, 12 real tokens
    return (k, poison(g, 6, 16, 132), _slots(g, 12, 6, 16, padding=(3, 9)))


def ue8m0_bit_trick(k, kv_cache, slot_mapping):
    """ue8m0 as a bit trick on the float32 scale (``(bits + 0x7FFFFF) & 0x7F800000``): the
    exact power-of-two ceiling. For bf16 ``k`` it equals ``2 ** ceil(log2(s))`` on every input
    (checked over all bf16 values), so it must match."""
    x = k.float().view(k.shape[0], -1, 128)
    s = x.abs().amax(-1, keepdim=True).clamp(min=1e-4) / 448.0
    bits = s.view(torch.int32)
    scale = ((bits + 0x7FFFFF) & 0x7F800000).view(torch.float32)
    q = (x / scale).clamp(-448.0, 448.0).to(FP8).view(k.shape)
    _put_blocked(q.view(torch.uint8), scale.view(k.shape[0], -1).view(torch.uint8), kv_cache, slot_mapping)


def _edge_k_inputs(seed):
    """float32 k whose first token's amax is the float just above 448 * 2**-7: there the
    exact ceiling (2**-6) and ``2 ** ceil(log2(.))`` (2**-7, float32 log2 rounds to -7) differ."""
    g = gen(seed)
    k = _k(g, 9, 128, torch.float32)
    edge = torch.nextafter(torch.tensor(448.0 * 2.0**-7), torch.tensor(1.0e9))
    k[2] = k[2].clamp(-3.0, 3.0)
    k[2, 7] = -edge
    return (k, poison(g, 6, 16, 132), _slots(g, 9, 6, 16))


def xpu_interleaved_port(k, kv_cache, slot_mapping):
    """Near-miss, vLLM ``_xpu_ops.indexer_k_quant_and_cache`` as is: the group quantization in
    the input dtype (bf16: no float32 upcast), floor 1e-10, then ``torch.cat([fp8 bytes, scale
    bytes], -1)`` per token and ``index_copy_`` into ``kv_cache.view(-1, head_dim + 4)``:
    per-token INTERLEAVED rows, another layout than the blocked one."""
    head_dim = k.shape[-1]
    x = k.view(-1, head_dim)
    x_grouped = x.view(x.shape[0], -1, 128)
    abs_max = torch.amax(torch.abs(x_grouped), dim=-1, keepdim=False)
    abs_max = torch.maximum(abs_max, torch.tensor(1e-10, device=x.device, dtype=x.dtype))
    scales = torch.pow(2.0, torch.ceil(torch.log2(abs_max / torch.finfo(FP8).max)))
    x_q = torch.clamp(x_grouped / scales.unsqueeze(-1), torch.finfo(FP8).min, torch.finfo(FP8).max).to(FP8)
    k_fp8_bytes = x_q.view(-1, head_dim).view(torch.uint8)
    scale_bytes = scales.contiguous().float().view(torch.uint8).view(-1, 4)
    rows = torch.cat([k_fp8_bytes, scale_bytes], dim=-1)
    kv_cache.view(-1, kv_cache.shape[-1]).index_copy_(0, slot_mapping.flatten(), rows)


def _interleaved_compare(got, want):
    """Rows of written slots: dequantized within one fp8 step of eager's (Inductor keeps bf16
    intermediates in float32); every other byte identical."""
    from kda_inductor.reference import fp8_step

    g, w, s = got.args[1].cpu(), want.args[1].cpu(), want.args[2].cpu().long()
    g2, w2 = g.view(-1, 132), w.view(-1, 132)
    others = torch.ones(g2.shape[0], dtype=torch.bool)
    others[s] = False
    assert torch.equal(g2[others], w2[others]), "bytes of unwritten slots differ"
    gv = g2[s, :128].view(FP8).float() * g2[s, 128:].contiguous().view(torch.float32)
    wv = w2[s, :128].view(FP8).float() * w2[s, 128:].contiguous().view(torch.float32)
    sc = torch.maximum(g2[s, 128:].contiguous().view(torch.float32), w2[s, 128:].contiguous().view(torch.float32))
    tol = 2 * fp8_step((wv.abs() / sc).clamp(min=1e-30)) * sc + wv.abs() * 2.0**-7
    bad = int(((gv - wv).abs() > tol).sum())
    assert bad == 0, f"{bad} written values differ by more than two fp8 steps"


def block_size_32_on_16(k, kv_cache, slot_mapping):
    """Near-miss: block arithmetic with 32 tokens per block on a cache of 16-token blocks
    (``flat = kv_cache.view(nb, -1)``; the scale region from the cache's 16): token s lands at
    16-layout slot ``(s // 32) * 16 + s % 32`` only because these slots keep ``s % 32 < 16``;
    the code's own block size is not the cache's."""
    nb, bs, row = kv_cache.shape
    q, s = _quant_ref(k)
    blk, off = slot_mapping // 32, slot_mapping % 32
    flat = kv_cache.view(nb, -1)
    flat[blk[:, None], off[:, None] * 128 + torch.arange(128, device=k.device)] = q
    flat[blk[:, None], bs * 128 + off[:, None] * 4 + torch.arange(4, device=k.device)] = s


def _bs32_inputs(seed):
    g = gen(seed)
    cand = torch.tensor([b * 32 + o for b in range(1, 6) for o in range(16)])
    s = cand[torch.randperm(cand.numel(), generator=g)[:10]]
    return (_k(g, 10, 128), poison(g, 6, 16, 132), s)


def _bs32_slots(args):
    s = args[2]
    return (s // 32) * 16 + s % 32


def deepseek_act_quant_ue8m0(k, kv_cache, slot_mapping):
    """DeepSeek-V3.2's ``act_quant`` kernel (``inference/kernel.py``, tilelang) as its torch
    ports write it: ``max(amax, 1e-4) * fp8_max_inv`` (a multiply by 1/448, not a division)
    and ue8m0 by ``fast_log2_ceil`` (exponent bits + (mantissa != 0)) and ``fast_pow2``
    (``(e + 127) << 23``). For bf16 ``k`` the power-of-two scale equals the division's on
    every input (checked over all bf16 values), so it must match."""
    x = k.float().unflatten(-1, (-1, 128))
    amax = x.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    bits = (amax * (1.0 / 448.0)).view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    scale = ((e + 127) << 23).view(torch.float32)
    q = (x / scale).clamp(-448.0, 448.0).to(FP8).flatten(-2)
    _put_blocked(q.view(torch.uint8), scale.flatten(-2).view(torch.uint8), kv_cache, slot_mapping)


def amax_times_reciprocal(k, kv_cache, slot_mapping):
    """Near-miss: DeepSeek's ``amax * (1.0 / FP8_MAX)`` with plain (not ue8m0) scales: not
    bit-identical to ``amax / 448`` (1/448 is inexact in float32; 10036 of the 32639 positive
    bf16 amax values give another scale)."""
    x = k.float().unflatten(-1, (-1, 128))
    amax = x.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    scale = amax * (1.0 / 448.0)
    q = (x / scale).clamp(-448.0, 448.0).to(FP8).flatten(-2)
    _put_blocked(q.view(torch.uint8), scale.flatten(-2).view(torch.uint8), kv_cache, slot_mapping)


WRITE_CASES = [
    Spelling("sglang_set_k_and_s_2d", SGLANG + " (SetK/SetS.torch_fast)",
             sglang_set_k_and_s, _write_inputs(9, 128, 64, 4, cache_2d=True), WRITE,
             blocked_cache(1, _slot_arg(2), 128, block_size=64), mutated_args=(1,),
             why="the 2-D page buffer [num_pages, 64 * 132], int32 arange byte offsets, flatten"),
    Spelling("trtllm_unravel_scatter", "NVIDIA/TensorRT-LLM: tensorrt_llm/_torch/attention_backend/sparse/dsa.py",
             trtllm_indexer_k_scatter, _trtllm_inputs, {}, blocked_cache(1, _trtllm_slots, 128, block_size=16),
             mutated_args=(1,),
             why="not matched (a known limit): the byte offsets come from three tensors (positions, request ids, "
                 "the block table) rather than one slot_mapping, which kda.indexer_k_write takes; the pattern "
                 "would have to build the slot tensor in the graph. The [nb, 1, 1, block_bytes] pool view and the "
                 "unravelled indices themselves are read (the miss names the slot tensors)"),
    Spelling("xpu_group_quant_blocked", VLLM + "vllm/_xpu_ops.py (group_quant_torch spellings, blocked store)",
             xpu_group_quant_blocked, _write_inputs(8, 256, 16, 5, slot_dtype=torch.int32), WRITE,
             blocked_cache(1, _slot_arg(2), 256), mutated_args=(1,),
             why="keepdim=False + unsqueeze, torch.maximum(amax, torch.tensor(1e-4)), "
                 "finfo max, empty_like + copy_"),
    Spelling("one_group_clamp_min_exp2",
             "DeepSeek-V3.2 indexer quantization in vLLM's view-assign store",
             one_group_clamp_min_exp2, _write_inputs(10, 128, 16, 6), WRITE, blocked_cache(1, _slot_arg(2), 128),
             mutated_args=(1,), why="one group without a [T, G, 128] view, clamp_min, exp2"),
    Spelling("float32_k_index_copy", "float32 k in " + VLLM + "vllm/_xpu_ops.py's index_copy_ store",
             float32_k_index_copy, _write_inputs(7, 128, 16, 5, k_dtype=torch.float32), WRITE,
             blocked_cache(1, _slot_arg(2), 128), mutated_args=(1,),
             why="float32 k straight into the quantization, plain scales"),
    Spelling("vllm_layernorm_type_as_write", VLLM + "vllm/model_executor/models/deepseek_v2.py (Indexer.k_norm)",
             VllmLayerNormThenWrite(), _write_inputs(9, 128, 16, 5, padding=(4,)), WRITE,
             blocked_cache(1, _slot_arg(2), 128, exact_scales=False), mutated_args=(1,),
             why="LayerNorm(x.float()).type_as(x) right before the quantization (fusable: nothing in between)"),
    Spelling("aiter_rows_torch_max", "ROCm/aiter: op_tests/test_indexer_k_quant_and_cache.py (run_torch spellings)",
             aiter_rows_torch_max, _write_inputs(6, 256, 16, 4), WRITE, blocked_cache(1, _slot_arg(2), 256),
             mutated_args=(1,), why="groups as rows k.view(-1, 128), torch.max(dim, keepdim) values"),
    Spelling("unmasked_negative_slot_wraps", "indexer_k_write must reproduce Python's wrap of slot -1",
             unmasked_negative_slot, _write_inputs(8, 128, 16, 6, padding=(5,)), WRITE,
             blocked_cache(1, _wrapped_slots, 128), mutated_args=(1,),
             why="slot -1 not masked: eager writes the last block's last row; the fused op must write it too"),
    Spelling("vllm_truncated_k_masked", VLLM + "vllm/v1/attention/ops/... sparse_attn_indexer (k = k[:num_tokens])",
             vllm_truncated_k_masked, _truncated_inputs, WRITE, blocked_cache(1, _slot_arg(2), 128),
             mutated_args=(1,), why="k padded to the CUDA-graph batch, cut to the slot count, padding masked"),
    Spelling("ue8m0_bit_trick_bf16", "ue8m0 bit trick (DeepSeek V4 CPU fallbacks' exact pow2 ceil)",
             ue8m0_bit_trick, _write_inputs(9, 128, 16, 5), WRITE, blocked_cache(1, _slot_arg(2), 128),
             mutated_args=(1,), why="equal to pow(2, ceil(log2)) for every bf16 k"),
    Spelling("deepseek_act_quant_ue8m0", "DeepSeek-V3.2 inference/kernel.py act_quant (amax * fp8_max_inv, "
             "fast_log2_ceil / fast_pow2) as torch ports write it",
             deepseek_act_quant_ue8m0, _write_inputs(9, 128, 16, 5), WRITE, blocked_cache(1, _slot_arg(2), 128),
             mutated_args=(1,), why="the multiply by 1/448 and the exponent-bit ceiling give the op's scales for "
                                    "bf16 k"),
    # ----- near-misses
    Spelling("ue8m0_bit_trick_float32_edge", "ue8m0 bit trick on float32 k (near-miss)",
             ue8m0_bit_trick, _edge_k_inputs, {}, blocked_cache(1, _slot_arg(2), 128), mutated_args=(1,),
             why="near-miss: for float32 k the exact ceiling and 2**ceil(log2) differ (one token here sits on "
                 "the edge): the fused op computes the latter"),
    Spelling("xpu_interleaved_port", VLLM + "vllm/_xpu_ops.py (indexer_k_quant_and_cache as is)",
             xpu_interleaved_port, _write_inputs(8, 128, 16, 5), {}, _interleaved_compare, mutated_args=(1,),
             why="near-miss: per-token interleaved rows, bf16 quantization math, floor 1e-10"),
    Spelling("block_size_32_on_16", "near-miss: another block size in the index math than the cache has",
             block_size_32_on_16, _bs32_inputs, {}, blocked_cache(1, _bs32_slots, 128), mutated_args=(1,),
             why="near-miss: // 32 and % 32 on a 16-token-block cache"),
    Spelling("amax_times_reciprocal", "DeepSeek-V3.2 inference/kernel.py act_quant torch ports, plain scales",
             amax_times_reciprocal, _write_inputs(8, 128, 16, 5), {}, blocked_cache(1, _slot_arg(2), 128),
             mutated_args=(1,), why="near-miss: another scale formula (not bit-identical)"),
]


# --------------------------------------------------------------------------- gathers

SEQS = [5, 0, 37, 1, 20]


def _gather_inputs(*, block_size=16, cache_2d=False, extra_col=False, dst=False, seqs=SEQS, index_dtype=torch.int32):
    def make(seed):
        g = gen(seed)
        cache, table, cu, n = random_indexer_cache(seqs, block_size, 128, index_dtype=index_dtype, generator=g)
        if extra_col:  # one more valid block id per row (for index math that reads one column further)
            table = torch.cat([table, torch.randint(0, cache.shape[0], (table.shape[0], 1), generator=g,
                                                    dtype=table.dtype)], 1)
        if cache_2d:
            cache = cache.view(cache.shape[0], -1)
        args = [cache, table, cu]
        if dst:
            args += [poison(g, n, 128), poison(g, n, 4)]
        else:
            args += [torch.empty(n, 0)]  # num_tokens from a tensor's size, as serving code does
        return tuple(args)
    return make


def xpu_gather_fixed(kv_cache, block_table, cu_seq_lens, dst_k, dst_scale):
    """vLLM XPU ``cp_gather_indexer_k_quant_cache``'s spellings with the arithmetic right:
    ``searchsorted(cu, token + 1) - 1`` (left side), ``torch.clamp(batch, 0, B - 1)``,
    ``kv_cache.stride(0)`` block stride, ``kv_cache.view(-1)`` flat byte indices,
    ``dst_k[:] = ...`` / ``dst_scale[:] = ...`` into preallocated outputs."""
    batch_size = block_table.size(0)
    num_tokens = dst_k.size(0)
    head_dim = dst_k.size(1)
    cache_block_size = kv_cache.size(1)
    token_indices = torch.arange(num_tokens, device=dst_k.device) + 1
    batch_indices = torch.searchsorted(cu_seq_lens, token_indices) - 1
    batch_indices = torch.clamp(batch_indices, 0, batch_size - 1)
    inbatch_seq_indices = token_indices - 1 - cu_seq_lens[batch_indices]
    physical_block_indices = block_table[batch_indices, inbatch_seq_indices // cache_block_size]
    inblock_offsets = inbatch_seq_indices % cache_block_size
    block_stride = kv_cache.stride(0)
    kv_cache_flat = kv_cache.view(-1)
    src_block_offsets = physical_block_indices * block_stride
    k_indices = ((src_block_offsets + inblock_offsets * head_dim).unsqueeze(1)
                 + torch.arange(head_dim, device=dst_k.device))
    dst_k[:] = kv_cache_flat[k_indices]
    scale_size = 4
    src_scale = src_block_offsets + cache_block_size * head_dim + inblock_offsets * scale_size
    dst_scale[:] = kv_cache_flat[src_scale.unsqueeze(1) + torch.arange(scale_size, device=dst_k.device)]


def xpu_gather_port(kv_cache, block_table, cu_seq_lens, dst_k, dst_scale):
    """Near-miss, the vLLM XPU port as is: block ``(pos + 1) // block_size`` (one too far at a
    block's last token) and scales at ``block + head_dim + off * 4`` (not ``block_size *
    head_dim``): not the blocked layout's gather."""
    batch_size = block_table.size(0)
    num_tokens, head_dim = dst_k.shape
    cache_block_size = kv_cache.size(1)
    token_indices = torch.arange(num_tokens, device=dst_k.device) + 1
    batch_indices = torch.clamp(torch.searchsorted(cu_seq_lens, token_indices) - 1, 0, batch_size - 1)
    inbatch_seq_indices = token_indices - cu_seq_lens[batch_indices]
    physical_block_indices = block_table[batch_indices, inbatch_seq_indices // cache_block_size]
    inblock_offsets = (inbatch_seq_indices - 1) % cache_block_size
    kv_cache_flat = kv_cache.view(-1)
    src_block_offsets = physical_block_indices * kv_cache.stride(0)
    dev = dst_k.device
    k_indices = (src_block_offsets + inblock_offsets * head_dim).unsqueeze(1) + torch.arange(head_dim, device=dev)
    dst_k[:] = kv_cache_flat[k_indices]
    src_scale = src_block_offsets + head_dim + inblock_offsets * 4
    dst_scale[:] = kv_cache_flat[src_scale.unsqueeze(1) + torch.arange(4, device=dev)]


def sglang_get_k_and_s(buf, page_indices, seq_len_like):
    """SGLang ``GetK.torch_fast`` + ``GetS.torch_fast`` on the 2-D page buffer for one request:
    whole pages' bytes as ``(page * page_bytes)[:, None] + arange(...)``, flattened, cut to the
    sequence, ``flat_buf[idx].view(-1, 128)`` / ``.view(-1, 4)``."""
    page_size, head_dim = 64, 128
    seq_len = seq_len_like.shape[0]
    buf_numel_per_page = buf.shape[1]
    flat_buf = buf.flatten()
    flat_indices = (page_indices * buf_numel_per_page)[:, None] + torch.arange(
        page_size * head_dim, dtype=torch.int32, device=buf.device)[None, :]
    flat_indices = flat_indices.flatten()[: seq_len * head_dim]
    k = flat_buf[flat_indices].view(-1, 128)
    num_s_bytes_per_page = buf.shape[1] - page_size * head_dim
    flat_indices = ((page_indices * buf_numel_per_page)[:, None]
                    + torch.arange(num_s_bytes_per_page, dtype=torch.int32, device=buf.device)[None, :]
                    + page_size * head_dim)
    flat_indices = flat_indices.flatten()[: seq_len * 4]
    s = flat_buf[flat_indices].view(-1, 4)
    return k, s


def _sglang_get_inputs(seed):
    g = gen(seed)
    cache, table, cu, n = random_indexer_cache([150], 64, 128, generator=g)
    return (cache.view(cache.shape[0], -1), table[0].clone(), torch.empty(150, 0))


def sglang_get_k_two_requests(buf, pages_a, pages_b, len_a, len_b):
    """Near-miss: SGLang ``GetK.torch_fast`` for two requests: two 1-D byte gathers of the same
    flattened uint8 buffer with two index tensors (values only). Not a GDN split."""
    flat_buf = buf.flatten()
    outs = []
    for pages, like in ((pages_a, len_a), (pages_b, len_b)):
        idx = (pages * buf.shape[1])[:, None] + torch.arange(64 * 128, dtype=torch.int32, device=buf.device)[None, :]
        outs.append(flat_buf[idx.flatten()[: like.shape[0] * 128]].view(-1, 128))
    return outs


def _sglang_two_inputs(seed):
    g = gen(seed)
    cache, table, cu, n = random_indexer_cache([70, 100], 64, 128, generator=g)
    return (cache.view(cache.shape[0], -1), table[0, :2].clone(), table[1, :2].clone(),
            torch.empty(70, 0), torch.empty(100, 0))


def flat_indices_then_view_2d(cache2d, block_table, cu_seq_lens, like):
    """The multi-request gather on the 2-D page buffer with 1-D flattened byte indices then
    ``.view(N, D)`` (SGLang's flat style): values and float32 scales."""
    num_tokens = like.shape[0]
    nb, page_bytes = cache2d.shape
    bs = page_bytes // 132
    token = torch.arange(num_tokens, device=cu_seq_lens.device)
    req = torch.searchsorted(cu_seq_lens, token, right=True) - 1
    pos = token - cu_seq_lens[req]
    page = block_table[req, pos // bs].long()
    off = pos % bs
    flat = cache2d.flatten()
    vidx = ((page * page_bytes + off * 128)[:, None] + torch.arange(128, device=token.device)).reshape(-1)
    sidx = ((page * page_bytes + bs * 128 + off * 4)[:, None] + torch.arange(4, device=token.device)).reshape(-1)
    return flat[vidx].view(num_tokens, 128).view(FP8), flat[sidx].view(num_tokens, 4).view(torch.float32)


def as_strided_regions(kv_cache, block_table, cu_seq_lens, like):
    """The gather through ``torch.as_strided`` views of the value and scale regions,
    ``bucketize`` on ``cu_seq_lens[1:]`` for the request."""
    num_tokens = like.shape[0]
    nb, bs, row = kv_cache.shape
    token = torch.arange(num_tokens, device=cu_seq_lens.device)
    req = torch.bucketize(token, cu_seq_lens[1:], right=True)
    pos = token - cu_seq_lens[req]
    blk = block_table[req, pos // bs]
    off = pos % bs
    values = torch.as_strided(kv_cache, (nb, bs, 128), (bs * row, 128, 1))
    scales = torch.as_strided(kv_cache, (nb, bs, 4), (bs * row, 4, 1), bs * 128)
    return values[blk, off].view(FP8), scales[blk, off].view(torch.float32)


def interleaved_gather(kv_cache, block_table, cu_seq_lens, like):
    """Near-miss: the gather of the per-token interleaved layout (the XPU port's write): row
    ``slot`` of ``kv_cache.view(-1, 132)``, values then scale."""
    num_tokens = like.shape[0]
    nb, bs, row = kv_cache.shape
    token = torch.arange(num_tokens, device=cu_seq_lens.device)
    req = torch.searchsorted(cu_seq_lens, token, right=True) - 1
    pos = token - cu_seq_lens[req]
    slot = block_table[req, pos // bs].long() * bs + pos % bs
    rows = kv_cache.view(-1, row)[slot]
    return rows[:, :128], rows[:, 128:]


def block_size_32_gather(cache2d, block_table, cu_seq_lens, like):
    """Near-miss: token arithmetic with 32-token blocks on a 16-token-block page buffer (flat
    byte offsets: in bounds, but not the cache's layout)."""
    num_tokens = like.shape[0]
    nb, page_bytes = cache2d.shape
    token = torch.arange(num_tokens, device=cu_seq_lens.device)
    req = torch.searchsorted(cu_seq_lens, token, right=True) - 1
    pos = token - cu_seq_lens[req]
    page = block_table[req, pos // 32].long()
    off = pos % 32
    flat = cache2d.view(-1)
    values = flat[(page * page_bytes + off * 128)[:, None] + torch.arange(128, device=token.device)]
    scales = flat[(page * page_bytes + 16 * 128 + off * 4)[:, None] + torch.arange(4, device=token.device)]
    return values, scales


def _bs32_gather_inputs(seed):
    g = gen(seed)
    cache, table, cu, n = random_indexer_cache([20, 0, 45, 3], 16, 128, extra_blocks=4, generator=g)
    table = table.clamp(max=cache.shape[0] - 2)  # the block after each stays in the buffer
    return (cache.view(cache.shape[0], -1), table, cu, torch.empty(n, 0))


class SglangWriteThenGather(nn.Module):
    """SGLang's order on the 2-D page buffer: LayerNorm'd k quantized and stored with
    ``SetK``/``SetS`` (flat byte offsets), then ``GetK``/``GetS`` read one request's pages."""

    def __init__(self):
        super().__init__()
        g = gen(60)
        self.weight = nn.Parameter(torch.rand(128, generator=g) + 0.5)
        self.bias = nn.Parameter(torch.randn(128, generator=g) * 0.1)

    def forward(self, k, buf, loc, page_indices, seq_len_like):
        k = F.layer_norm(k.float(), (128,), self.weight, self.bias, 1e-6).type_as(k)
        sglang_set_k_and_s(k, buf, loc)
        return sglang_get_k_and_s(buf, page_indices, seq_len_like)


def _write_gather_inputs(seed):
    g = gen(seed)
    cache, table, cu, n = random_indexer_cache([100], 64, 128, extra_blocks=2, generator=g)
    pages = table[0].clone()
    new = 6  # the request's last six tokens are written this step
    loc = pages[(torch.arange(100 - new, 100) // 64)].long() * 64 + torch.arange(100 - new, 100) % 64
    return (_k(g, new, 128), cache.view(cache.shape[0], -1), loc, pages, torch.empty(100, 0))


def _write_gather_compare(got, want):
    """The buffer as eager writes it (LayerNorm: within one fp8 step), and the gathered bytes
    exactly what the buffer the compiled code wrote holds."""
    blocked_cache(1, _slot_arg(2), 128, block_size=64, exact_scales=False)(got, want)
    again = sglang_get_k_and_s(got.args[1], got.args[3], got.args[4])
    exact(type(got)(got.out, []), type(got)(again, []))


GATHER_CASES = [
    Spelling("xpu_gather_searchsorted_left_clamp", VLLM + "vllm/_xpu_ops.py (cp_gather_indexer_k_quant_cache, fixed)",
             xpu_gather_fixed, _gather_inputs(dst=True), GATHER, exact, mutated_args=(3, 4),
             why="clamp(req, 0, B - 1), searchsorted(cu, t + 1) - 1, stride(0), dst[:] = ..."),
    Spelling("sglang_get_k_and_s", SGLANG + " (GetK/GetS.torch_fast)",
             sglang_get_k_and_s, _sglang_get_inputs, {}, exact,
             why="not matched (a known limit): one request's pages, with no cu_seq_lens or block table for "
                 "kda.indexer_k_gather to take; its whole pages' byte indices are flattened and cut to the sequence, "
                 "then viewed as rows of another shape. Multi-request batches on the same 2-D page buffer match "
                 "(flat_indices_then_view_2d)"),
    Spelling("flat_indices_then_view_2d", SGLANG + " (flat style) for a multi-request batch",
             flat_indices_then_view_2d, _gather_inputs(cache_2d=True), GATHER, exact,
             why="2-D page buffer, 1-D flattened byte indices then .view(N, D)"),
    Spelling("as_strided_regions", "as_strided flat views seen in forks",
             as_strided_regions, _gather_inputs(index_dtype=torch.int64), GATHER, exact,
             why="as_strided value / scale regions indexed [blk, off], bucketize(cu[1:], right=True)"),
    # ----- near-misses
    Spelling("xpu_gather_port_as_is", VLLM + "vllm/_xpu_ops.py (cp_gather_indexer_k_quant_cache as is)",
             xpu_gather_port, _gather_inputs(dst=True, extra_col=True), {}, exact, mutated_args=(3, 4),
             why="near-miss: (pos + 1) // block_size and scales at +head_dim: not the blocked layout"),
    Spelling("sglang_get_k_two_requests", SGLANG + " (GetK.torch_fast twice)",
             sglang_get_k_two_requests, _sglang_two_inputs, {}, exact,
             why="near-miss: values only; two byte gathers of one flat buffer are no GDN split"),
    Spelling("interleaved_gather", "near-miss: the per-token interleaved layout",
             interleaved_gather, _gather_inputs(), {}, exact, why="near-miss: another cache layout"),
    Spelling("block_size_32_gather", "near-miss: another block size in the index math than the cache has",
             block_size_32_gather, _bs32_gather_inputs, {}, exact, why="near-miss: // 32 on 16-token blocks"),
]

BOTH_CASES = [
    Spelling("sglang_write_then_gather", SGLANG + " (SetK/SetS then GetK/GetS) with vLLM's LayerNorm",
             SglangWriteThenGather(), _write_gather_inputs, {"indexer_k_write": 1},
             _write_gather_compare, mutated_args=(1,),
             why="the write on the 2-D page buffer is rewritten; the single-request GetK/GetS gather that reads it "
                 "is not (see sglang_get_k_and_s)"),
]

CASES = WRITE_CASES + GATHER_CASES + BOTH_CASES
