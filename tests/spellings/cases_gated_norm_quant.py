"""``gated_norm_quant`` spellings: a GDN layer's gated RMSNorm (with or without the spec /
non-spec merge in front) followed by the dynamic fp8 quantization vLLM traces for FP8
checkpoints (``vllm-project/vllm: vllm/model_executor/layers/quantization/input_quant_fp8.py``,
``QuantFP8.forward_native`` / ``_quantize_group_native``: read with the search tools, written
here in its style, not copied). Scales bit-exact, values within one fp8 step of eager."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.spellings._corpus import Spelling, gen, partition, randn

H, D = 2, 128
FP8_MAX, MIN_SCALE = 448.0, 1.0 / (448.0 * 512.0)
QUANT = {"gated_norm_quant": 1}


def _norm(x, z, w, eps=1e-6):  # vLLM RMSNormGated.forward_static
    dtype = x.dtype
    xf, zf = x.float(), z.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * w.float()
    return (out * F.silu(zf)).to(dtype)


def _group_quant(x, group=128, ue8m0=False):
    xg = x.view(-1, x.shape[-1] // group, group)
    s = xg.abs().max(dim=-1, keepdim=True)[0].float() / FP8_MAX
    if ue8m0:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    s = s.clamp(min=MIN_SCALE)
    return (xg / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(-1, x.shape[-1]), s.squeeze(-1)


def vllm_output_projection_fp8(x, z, w):
    """The GDN layer's ``_output_projection``: the norm on ``[T, H, D]``, flattened, then the
    fp8 linear's input quantization per group of 128, column-major scales (DeepGEMM)."""
    y = _norm(x, z, w).reshape(x.shape[0], -1)
    q, s = _group_quant(y)
    return q, s.t().contiguous().t()


def vllm_per_token_fp8(x, z, w):
    y = _norm(x, z, w).flatten(-2)
    x_max = y.abs().max(dim=-1)[0].unsqueeze(-1).to(torch.float32)
    s = (x_max / FP8_MAX).clamp(min=MIN_SCALE)
    return (y.to(torch.float32) * s.reciprocal()).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), s


def vllm_fp32_norm_weight_fp8(x, z, w):
    """Qwen3.5-FP8 as vLLM runs it: the gated norm's weight float32, its input bf16 (vLLM #45770,
    where vLLM's own RMSNorm + quant fusion skips the mixed dtypes); the same float32 math."""
    dtype = x.dtype
    xf, zf = x.float(), z.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + 1e-6) * w.float()
    q, s = _group_quant((out * F.silu(zf)).to(dtype).reshape(x.shape[0], -1))
    return q, s.t().contiguous().t()


def merged_then_quant_ue8m0(o_s, o_ns, s_idx, ns_idx, z, w):
    """Our hybrid example's layer tail in an FP8 build: merge, norm, ue8m0 group quant."""
    T = s_idx.shape[0] + ns_idx.shape[0]
    out = torch.empty(T, H, D, dtype=o_s.dtype)
    out.index_copy_(0, s_idx, o_s)
    out.index_copy_(0, ns_idx, o_ns)
    return _group_quant(_norm(out, z, w).view(T, -1), ue8m0=True)


def _plain_inputs(seed: int):
    g = gen(seed)
    T = 5
    proj = randn(g, T, 2 * H * D)
    return [randn(g, T, H, D), proj[:, H * D:].view(T, H, D), (1 + 0.1 * torch.randn(D, generator=g)).to(torch.bfloat16)]


def _fp32_weight_inputs(seed: int):
    x, z, w = _plain_inputs(seed)
    return [x, z, w.float() + 0.01 * torch.randn(D, generator=gen(seed + 1))]


def _merge_inputs(seed: int):
    g = gen(seed)
    s_idx, ns_idx = partition(g, 7, 3, dtype=torch.int64)
    return [randn(g, 3, H, D), randn(g, 4, H, D), s_idx, ns_idx, randn(g, 7, H, D),
            (1 + 0.1 * torch.randn(D, generator=g)).to(torch.bfloat16)]


def within_one_fp8_step(got, want) -> None:
    """Scales bit-exact (strides too); fp8 values within one step of eager's."""
    (q, s), (qe, se) = got.out, want.out
    assert torch.equal(s, se) and s.stride() == se.stride(), (s.stride(), se.stride())
    a, e = q.float(), qe.float()
    step = torch.pow(2.0, torch.floor(torch.log2(e.abs().clamp(min=2.0**-6))) - 3)
    assert q.shape == qe.shape and bool(((a - e).abs() <= step).all()), (a - e).abs().max()


SOURCE = "vllm-project/vllm: vllm/model_executor/layers/quantization/input_quant_fp8.py"
CASES = [
    Spelling("vllm_gdn_output_projection_fp8", SOURCE, vllm_output_projection_fp8, _plain_inputs, QUANT,
             within_one_fp8_step),
    Spelling("vllm_per_token_fp8", SOURCE, vllm_per_token_fp8, _plain_inputs, QUANT, within_one_fp8_step),
    Spelling("vllm_fp32_norm_weight_fp8", SOURCE + " (vLLM #45770: a float32 norm weight)", vllm_fp32_norm_weight_fp8,
             _fp32_weight_inputs, QUANT, within_one_fp8_step),
    Spelling("merged_then_quant_ue8m0", "this repo: examples/gdn_layers.py, with an FP8 output projection",
             merged_then_quant_ue8m0, _merge_inputs, QUANT, within_one_fp8_step),
]
