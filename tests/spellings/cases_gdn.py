"""GDN / KDA spellings: the spec / non-spec token split (``gdn_spec_split``) and the merge +
gated RMSNorm (``gated_norm_merge``), as the public serving and modeling code writes them.

Each function is written in the style of the file named in its ``source`` (read with the
search tools; not copied). In vLLM the split and the merge sit inside the layer's core
custom op (``torch.ops.vllm.*_attention_core``), so Inductor sees them only in plain-torch
ports (vLLM's CPU path, forks, user code); here the core's recurrence is a graph input
(``core_spec``, ``core_non_spec``) and the split's consumers are the outputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tests.spellings._corpus import (
    Spelling,
    close,
    copy_fused,
    exact,
    gen,
    merge_fused,
    partition,
    randn,
    within_ulps,
)

H, K, D = 2, 8, 16  # value heads, key head dim, value head dim (tiny; real: 32, 128, 128)
CONV = 2 * H * K + H * D  # mixed_qkv width

GATHER = {"gdn_spec_split": 1}
NORM = {"gated_norm_merge": 1}


# --------------------------------------------------------------------------- norm modules


class VllmRMSNormGated(nn.Module):
    """vLLM's ``RMSNormGated.forward_static`` style: everything in float32 (weight too),
    ``x.pow(2).mean`` + ``rsqrt``, optional groups via unflatten, ``norm_before_gate``."""

    def __init__(self, hidden: int, eps: float = 1e-6, group_size: int | None = None,
                 norm_before_gate: bool = True, activation: str = "swish", dtype=torch.bfloat16, seed: int = 0):
        super().__init__()
        g = gen(1000 + seed)
        self.weight = nn.Parameter((1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype))
        self.eps, self.group_size, self.norm_before_gate = eps, group_size, norm_before_gate
        self.act = F.sigmoid if activation == "sigmoid" else F.silu

    def forward(self, x, z):
        orig_dtype = x.dtype
        x, weight, z = x.float(), self.weight.float(), z.float()
        if not self.norm_before_gate:
            x = x * self.act(z)
        if self.group_size is None:
            variance = x.pow(2).mean(dim=-1, keepdim=True)
            out = x * torch.rsqrt(variance + self.eps) * weight
        else:
            xg = x.unflatten(-1, (-1, self.group_size))
            variance = xg.pow(2).mean(dim=-1, keepdim=True)
            out = (xg * torch.rsqrt(variance + self.eps)).flatten(-2) * weight
        if self.norm_before_gate:
            out = out * self.act(z)
        return out.to(orig_dtype)


class HFRMSNormGated(nn.Module):
    """transformers' ``Qwen3NextRMSNormGated`` style: weight applied after the cast back
    (``self.weight * h.to(input_dtype)``), the gate in float32 (``ACT2FN`` silu / sigmoid)."""

    def __init__(self, hidden: int, eps: float = 1e-6, activation: str = "silu", dtype=torch.bfloat16, seed: int = 0):
        super().__init__()
        g = gen(2000 + seed)
        self.weight = nn.Parameter((1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype))
        self.variance_epsilon = eps
        self.act = nn.SiLU() if activation == "silu" else nn.Sigmoid()

    def forward(self, hidden_states, gate):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        hidden_states = self.weight * hidden_states.to(input_dtype)
        hidden_states = hidden_states * self.act(gate.to(torch.float32))
        return hidden_states.to(input_dtype)


class FlaRefRMSNormGated(nn.Module):
    """flash-linear-attention's ``rms_norm_ref`` style (``fla/modules/layernorm_gated.py``):
    ``1 / torch.sqrt(x.square().mean(...) + eps)``, weight in float32, ``out *= act(z)``;
    ``upcast=False`` keeps the whole norm in the input dtype."""

    def __init__(self, hidden: int, eps: float = 1e-6, activation: str = "silu", norm_before_gate: bool = True,
                 upcast: bool = True, dtype=torch.bfloat16, seed: int = 0):
        super().__init__()
        g = gen(3000 + seed)
        self.weight = nn.Parameter((1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype))
        self.eps, self.norm_before_gate, self.upcast = eps, norm_before_gate, upcast
        self.act = F.sigmoid if activation == "sigmoid" else F.silu

    def forward(self, x, z):
        dtype = x.dtype
        weight = self.weight.float()
        if self.upcast:
            x, z = x.float(), z.float()
        else:
            weight = self.weight
        if not self.norm_before_gate:
            x = x * self.act(z)
        rstd = 1 / torch.sqrt(x.square().mean(dim=-1, keepdim=True) + self.eps)
        out = x * rstd * weight
        if self.norm_before_gate:
            out *= self.act(z)
        return out.to(dtype)


# --------------------------------------------------------------------------- the split


def qwen_gdn_split(mixed_qkv, b, a, spec_idx, non_spec_idx, num_actual_tokens: int):
    """vLLM Qwen3-Next ``_forward_core``: inputs cut to the actual tokens, ``mixed_qkv`` split
    both ways, ``a``/``b`` ``[T, H]`` gathered for the non-spec (prefill) part only."""
    mixed_qkv = mixed_qkv[:num_actual_tokens]
    b = b[:num_actual_tokens]
    a = a[:num_actual_tokens]
    mixed_qkv_spec = mixed_qkv.index_select(0, spec_idx)
    mixed_qkv_non_spec = mixed_qkv.index_select(0, non_spec_idx)
    a_non_spec = a.index_select(0, non_spec_idx)
    b_non_spec = b.index_select(0, non_spec_idx)
    return mixed_qkv_spec, mixed_qkv_non_spec, a_non_spec, b_non_spec


def _qwen_split_inputs(seed):
    g = gen(seed)
    T_pad, n = 14, 12
    s, ns = partition(g, n, 7)
    return (randn(g, T_pad, CONV), randn(g, T_pad, H), randn(g, T_pad, H), s, ns, n)


def olmo_gdn_split(mixed_qkv, g, beta, spec_idx, non_spec_idx, num_actual_tokens: int):
    """vLLM OLMo-hybrid ``_forward_core``: six gathers, ``g``/``beta`` float32 ``[1, T, H]``
    from the fused gating, dim 1."""
    mixed_qkv = mixed_qkv[:num_actual_tokens]
    mixed_qkv_spec = mixed_qkv.index_select(0, spec_idx)
    mixed_qkv_non_spec = mixed_qkv.index_select(0, non_spec_idx)
    g_spec = g.index_select(1, spec_idx)
    beta_spec = beta.index_select(1, spec_idx)
    g_non_spec = g.index_select(1, non_spec_idx)
    beta_non_spec = beta.index_select(1, non_spec_idx)
    return mixed_qkv_spec, mixed_qkv_non_spec, g_spec, beta_spec, g_non_spec, beta_non_spec


def _olmo_split_inputs(seed):
    g = gen(seed)
    n = 13
    s, ns = partition(g, n, 8)
    return (randn(g, 15, CONV), randn(g, 1, n, H, dtype=torch.float32), torch.rand(1, n, H, generator=g), s, ns, n)


def bailing_kda_split(q, k, v, g1, beta, spec_idx, non_spec_idx, num_actual_tokens: int):
    """vLLM BailingMoeV3 KDA ``_forward``: q/k/v ``[T, P]`` dim 0, the per-channel decay
    ``g1`` ``[1, T, H, K]`` float32 and ``beta`` ``[1, T, H]`` float32 dim 1: ten gathers."""
    q, k, v = q[:num_actual_tokens], k[:num_actual_tokens], v[:num_actual_tokens]
    g1 = g1[:, :num_actual_tokens]
    beta = beta[:, :num_actual_tokens]
    outs = []
    for idx in (spec_idx, non_spec_idx):
        outs += [q.index_select(0, idx), k.index_select(0, idx), v.index_select(0, idx),
                 g1.index_select(1, idx), beta.index_select(1, idx)]
    return outs


def _bailing_split_inputs(seed):
    g = gen(seed)
    T_pad, n = 12, 11
    s, ns = partition(g, n, 6)
    return (randn(g, T_pad, H * K), randn(g, T_pad, H * K), randn(g, T_pad, H * D),
            randn(g, 1, T_pad, H, K, dtype=torch.float32), torch.rand(1, T_pad, H, generator=g), s, ns, n)


def cpu_gdn_split(mixed_qkv, ba, spec_idx, non_spec_idx):
    """vLLM's CPU GDN path (``_cpu_gdn_attention_spec_aware``): ``b, a = ba.chunk(2, -1)``,
    made contiguous, then ``mixed_qkv``/``b``/``a`` each gathered both ways, all dim 0."""
    b, a = ba.chunk(2, dim=-1)
    mixed_qkv, a, b = mixed_qkv.contiguous(), a.contiguous(), b.contiguous()
    mixed_qkv_spec = mixed_qkv.index_select(0, spec_idx)
    b_spec = b.index_select(0, spec_idx)
    a_spec = a.index_select(0, spec_idx)
    mixed_qkv_ns = mixed_qkv.index_select(0, non_spec_idx)
    b_ns = b.index_select(0, non_spec_idx)
    a_ns = a.index_select(0, non_spec_idx)
    return mixed_qkv_spec, b_spec, a_spec, mixed_qkv_ns, b_ns, a_ns


def _cpu_split_inputs(seed):
    g = gen(seed)
    s, ns = partition(g, 13, 5, dtype=torch.int64)
    return (randn(g, 13, CONV), randn(g, 13, 2 * H), s, ns)


def mask_split(mixed_qkv, g, spec_mask):
    """Near-miss: the split by a boolean token mask (``x[mask]``, ``x[~mask]``), a spelling
    seen in forks: data-dependent sizes, token order kept."""
    return mixed_qkv[spec_mask], mixed_qkv[~spec_mask], g[:, spec_mask], g[:, ~spec_mask]


def _mask_split_inputs(seed):
    g = gen(seed)
    mask = torch.zeros(12, dtype=torch.bool)
    mask[torch.randperm(12, generator=g)[:5]] = True
    return (randn(g, 12, CONV), randn(g, 1, 12, H, dtype=torch.float32), mask)


# --------------------------------------------------------------------------- merge + norm


class QwenGDNTail(nn.Module):
    """vLLM Qwen3-Next: merge into a ``torch.empty`` temporary with two ``index_copy_``, then
    ``core_attn_out[:num_actual_tokens] = merged_out.squeeze(0)`` into the zeros-initialized
    output (padded to the batch size), then ``_output_projection``'s norm on rows."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = norm

    def forward(self, core_spec, core_non_spec, spec_idx, non_spec_idx, z):
        num_tokens = z.shape[0]
        num_actual_tokens = spec_idx.shape[0] + non_spec_idx.shape[0]
        core_attn_out = torch.zeros((num_tokens, H, D), dtype=core_spec.dtype, device=core_spec.device)
        merged_out = torch.empty((1, num_actual_tokens, *core_spec.shape[2:]),
                                 dtype=core_non_spec.dtype, device=core_non_spec.device)
        merged_out.index_copy_(1, spec_idx, core_spec)
        merged_out.index_copy_(1, non_spec_idx, core_non_spec)
        core_attn_out[:num_actual_tokens] = merged_out.squeeze(0)
        z_shape_og = z.shape
        x = core_attn_out.reshape(-1, core_attn_out.shape[-1])
        y = self.norm(x, z.reshape(-1, z.shape[-1]))
        return y.reshape(z_shape_og).flatten(-2)


def _merge_inputs(num_tokens, num_actual, num_spec, *, dtype=torch.int64):
    def make(seed):
        g = gen(seed)
        s, ns = partition(g, num_actual, num_spec, dtype=dtype)
        z = randn(g, num_tokens, H, D)
        return (randn(g, 1, num_spec, H, D), randn(g, 1, num_actual - num_spec, H, D), s, ns, z)
    return make


class OlmoGDNTail(nn.Module):
    """vLLM OLMo-hybrid: the same merge, no padding here, the norm ``eps=1e-5`` with a bf16
    weight (``dtype=config.torch_dtype``) on rows, ``.view(num_tokens, H, D)`` after."""

    def __init__(self):
        super().__init__()
        self.o_norm = VllmRMSNormGated(D, eps=1e-5, seed=2)

    def forward(self, core_spec, core_non_spec, spec_idx, non_spec_idx, gate):
        num_tokens = gate.shape[0]
        n = spec_idx.shape[0] + non_spec_idx.shape[0]
        core_attn_out = torch.zeros((num_tokens, H, D), dtype=core_spec.dtype, device=core_spec.device)
        merged_out = torch.empty((1, n, *core_spec.shape[2:]), dtype=core_non_spec.dtype, device=core_spec.device)
        merged_out.index_copy_(1, spec_idx, core_spec)
        merged_out.index_copy_(1, non_spec_idx, core_non_spec)
        core_attn_out[:n] = merged_out.squeeze(0)
        gate = gate.view(num_tokens, H, D)
        out = self.o_norm(core_attn_out.reshape(-1, D), gate.reshape(-1, D))
        return out.view(num_tokens, H, D).reshape(num_tokens, H * D)


class BailingKDATail(nn.Module):
    """vLLM BailingMoeV3 KDA: merge into ``torch.empty((1, n, H, D))``, then
    ``core_attn_out[0, :n] = merged_out[0, :n]`` into a zeros ``[1, T, H, D]`` output, then
    ``o_norm(core_attn_out, g2)`` (sigmoid) on the 4-D tensor with a 3-D gate ``[T, H, D]``."""

    def __init__(self):
        super().__init__()
        self.o_norm = FlaRefRMSNormGated(D, eps=1e-5, activation="sigmoid", seed=3)

    def forward(self, core_spec, core_non_spec, spec_idx, non_spec_idx, g2):
        num_tokens = g2.shape[0]
        n = spec_idx.shape[0] + non_spec_idx.shape[0]
        core_attn_out = torch.zeros((1, num_tokens, H, D), dtype=core_spec.dtype, device=core_spec.device)
        merged_out = torch.empty((1, n, *core_spec.shape[2:]), dtype=core_spec.dtype, device=core_spec.device)
        merged_out.index_copy_(1, spec_idx, core_spec)
        merged_out.index_copy_(1, non_spec_idx, core_non_spec)
        core_attn_out[0, :n] = merged_out[0, :n]
        out = self.o_norm(core_attn_out, g2)
        return out.reshape(num_tokens, H * D)  # rearrange "1 n h d -> n (h d)"


class CpuGDNTail(nn.Module):
    """vLLM's CPU GDN path: ``core_attn_out.index_copy_(0, idx, out)`` straight into the
    zeros-initialized ``[T, H, D]`` output (no temporary), then ``forward_cpu``'s norm."""

    def __init__(self, return_merged: bool = False):
        super().__init__()
        self.norm = VllmRMSNormGated(D, eps=1e-6, seed=4)
        self.return_merged = return_merged

    def forward(self, spec_out, non_spec_out, spec_idx, non_spec_idx, z):
        num_tokens = z.shape[0]
        core_attn_out = torch.zeros((num_tokens, H, D), dtype=spec_out.dtype, device=spec_out.device)
        core_attn_out.index_copy_(0, spec_idx, spec_out)
        core_attn_out.index_copy_(0, non_spec_idx, non_spec_out)
        z_shape_og = z.shape
        x = self.norm(core_attn_out.reshape(-1, core_attn_out.shape[-1]), z.reshape(-1, z.shape[-1]))
        x = x.reshape(z_shape_og).flatten(-2)
        return (x, core_attn_out) if self.return_merged else x


def _cpu_tail_inputs(seed):
    g = gen(seed)
    s, ns = partition(g, 11, 4, dtype=torch.int64)
    return (randn(g, 4, H, D), randn(g, 7, H, D), s, ns, randn(g, 11, H, D))


class HFQwen3NextTail(nn.Module):
    """transformers Qwen3-Next ``Qwen3NextGatedDeltaNet.forward``'s end: the chunk kernel's
    ``[B, T, H, D]`` output reshaped to rows with ``z``, the HF gated norm, back to ``[B, T, -1]``."""

    def __init__(self):
        super().__init__()
        self.norm = HFRMSNormGated(D, eps=1e-6, seed=5)

    def forward(self, core_attn_out, z):
        batch_size, seq_len = core_attn_out.shape[:2]
        core_attn_out = core_attn_out.reshape(-1, D)
        z = z.reshape(-1, D)
        core_attn_out = self.norm(core_attn_out, z)
        return core_attn_out.reshape(batch_size, seq_len, -1)


class HFKimiTail(nn.Module):
    """transformers Kimi Linear ``KimiLinearDeltaAttention.forward``'s end: ``o_norm`` (the
    Qwen3-Next gated norm, sigmoid) applied to the ``[B, T, H, D]`` output and gate directly."""

    def __init__(self):
        super().__init__()
        self.o_norm = HFRMSNormGated(D, eps=1e-5, activation="sigmoid", seed=6)

    def forward(self, core_attn_out, output_gate):
        batch_size, seq_len = core_attn_out.shape[:2]
        output_gate = output_gate.reshape(batch_size, seq_len, H, D)
        normed = self.o_norm(core_attn_out, output_gate)
        return normed.reshape(batch_size, seq_len, -1)


def _hf_tail_inputs(gate_flat: bool):
    def make(seed):
        g = gen(seed)
        gate = randn(g, 2, 5, H * D) if gate_flat else randn(g, 2, 5, H, D)
        return (randn(g, 2, 5, H, D), gate)
    return make


class VllmKimiTail(nn.Module):
    """vLLM Kimi Linear ``forward`` + ``_forward``: ``core_attn_out`` zeros ``[1, T, H, D]``,
    the core writes ``core_attn_out[0, :n] = out[0, :n]`` (padding rows keep their zeros),
    ``o_norm(core_attn_out, g2)`` sigmoid on 4-D with a 3-D gate, ``"1 n h d -> n (h d)"``."""

    def __init__(self):
        super().__init__()
        self.o_norm = FlaRefRMSNormGated(D, eps=1e-5, activation="sigmoid", seed=7)

    def forward(self, core_out, g2):
        num_tokens = g2.shape[0]
        n = core_out.shape[1]
        core_attn_out = torch.zeros((1, num_tokens, H, D), dtype=core_out.dtype, device=core_out.device)
        core_attn_out[0, :n] = core_out[0, :n]
        core_attn_out = self.o_norm(core_attn_out, g2)
        return core_attn_out.reshape(num_tokens, H * D)


def _vllm_kimi_inputs(seed):
    g = gen(seed)
    return (randn(g, 1, 10, H, D), randn(g, 13, H, D))


class FlaRefNorm3D(nn.Module):
    """flash-linear-attention's ``rms_norm_ref`` applied to a ``[T, H, D]`` tensor as is."""

    def __init__(self, **kw):
        super().__init__()
        self.norm = FlaRefRMSNormGated(D, **kw)

    def forward(self, x, z):
        return self.norm(x, z)


def _norm3d_inputs(seed):
    g = gen(seed)
    return (randn(g, 9, H, D), randn(g, 9, H, D))


class FlaTestReference(nn.Module):
    """flash-linear-attention's ``tests/modules/test_layernorm_gated.py`` reference:
    ``nn.RMSNorm(D)(x) * F.silu(g)`` on ``[B, H, T, D]`` (norm before gate, the product in
    the input dtype)."""

    def __init__(self):
        super().__init__()
        self.ref = nn.RMSNorm(D, eps=1e-6)
        with torch.no_grad():
            self.ref.weight.copy_(1 + 0.1 * torch.randn(D, generator=gen(8)))

    def forward(self, x, g):
        return self.ref(x) * F.silu(g)


def _fla_test_inputs(seed):
    g = gen(seed)
    return (randn(g, 2, H, 5, D), randn(g, 2, H, 5, D))


class RowsNorm(nn.Module):
    """A norm module applied to ``[T * H, D]`` rows (merge-free), ``norm(x, z)``."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = norm

    def forward(self, x, z):
        return self.norm(x.reshape(-1, D), z.reshape(-1, D))


def _rows_inputs(seed):
    g = gen(seed)
    return (randn(g, 10, H, D), randn(g, 10, H, D))


class DolomiteGatedRMSNorm(nn.Module):
    """IBM dolomite-engine ``GatedRMSNorm`` (Mamba2 style): the gate multiplied in BEFORE the
    norm, weight after the cast back: a different function (near-miss)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter((1 + 0.1 * torch.randn(D, generator=gen(9))).to(torch.bfloat16))
        self.eps = 1e-6

    def forward(self, hidden_states, gate):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        hidden_states = hidden_states * F.silu(gate.to(torch.float32))
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.eps)
        hidden_states = hidden_states.to(input_dtype)
        return self.weight * hidden_states


class MaskMergeTail(nn.Module):
    """Near-miss: the merge written with boolean token masks (``out[mask] = ...``)."""

    def __init__(self):
        super().__init__()
        self.norm = VllmRMSNormGated(D, seed=10)

    def forward(self, spec_out, non_spec_out, spec_mask, z):
        out = torch.empty((z.shape[0], H, D), dtype=spec_out.dtype, device=spec_out.device)
        out[spec_mask] = spec_out
        out[~spec_mask] = non_spec_out
        return self.norm(out.reshape(-1, D), z.reshape(-1, D))


def _mask_merge_inputs(seed):
    g = gen(seed)
    mask = torch.zeros(11, dtype=torch.bool)
    mask[torch.randperm(11, generator=g)[:4]] = True
    return (randn(g, 4, H, D), randn(g, 7, H, D), mask, randn(g, 11, H, D))


# --------------------------------------------------------------------------- the corpus

VLLM = "vllm-project/vllm: "
SPLIT_CASES = [
    Spelling("qwen_gdn_split", VLLM + "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py",
             qwen_gdn_split, _qwen_split_inputs, GATHER, exact,
             why="qkv both ways + a/b [T, H] non-spec only: four gathers, two shared indices, sources cut "
                 "to num_actual_tokens first"),
    Spelling("olmo_gdn_split", VLLM + "vllm/model_executor/layers/mamba/gdn/olmo_gdn_linear_attn.py",
             olmo_gdn_split, _olmo_split_inputs, GATHER, exact,
             why="the six gathers, g/beta float32 [1, T, H] along dim 1"),
    Spelling("bailing_kda_split", VLLM + "vllm/model_executor/models/bailing_moe_v3.py",
             bailing_kda_split, _bailing_split_inputs, GATHER, exact,
             why="ten gathers: q/k/v dim 0, a 4-D float32 decay [1, T, H, K] and beta along dim 1"),
    Spelling("cpu_gdn_split", VLLM + "vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py",
             cpu_gdn_split, _cpu_split_inputs, GATHER, exact,
             why="six dim-0 gathers of 2-D sources, b/a contiguous copies of ba.chunk(2, -1), int64 indices"),
    Spelling("mask_split", "near-miss of " + VLLM + "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py",
             mask_split, _mask_split_inputs, {}, exact,
             why="boolean-mask indexing: data-dependent sizes (a graph break), not index tensors"),
]

MERGE_CASES = [
    Spelling("qwen_gdn_merge_padded", VLLM + "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py",
             QwenGDNTail(VllmRMSNormGated(D, seed=1)), _merge_inputs(16, 13, 5), NORM, within_ulps(2),
             why="merge into torch.empty, core_attn_out[:n] = merged.squeeze(0) into a zeros "
                 "output padded to 16 rows (3 padding rows keep their zeros), the norm on all 16 rows",
             graph_check=merge_fused),
    Spelling("olmo_gdn_merge", VLLM + "vllm/model_executor/layers/mamba/gdn/olmo_gdn_linear_attn.py",
             OlmoGDNTail(), _merge_inputs(12, 12, 7), NORM, within_ulps(2),
             why="the same merge and copy, no padding, eps 1e-5, bf16 weight, view(T, H, D) after",
             graph_check=merge_fused),
    Spelling("bailing_kda_merge_4d", VLLM + "vllm/model_executor/models/bailing_moe_v3.py",
             BailingKDATail(), _merge_inputs(15, 12, 4), NORM, within_ulps(2),
             why="core_attn_out[0, :n] = merged_out[0, :n] into zeros [1, T, H, D], sigmoid norm on the 4-D "
                 "tensor with a 3-D gate (broadcast)",
             graph_check=merge_fused),
    Spelling("cpu_gdn_index_copy_into_zeros", VLLM + "vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py",
             CpuGDNTail(), _cpu_tail_inputs, NORM, within_ulps(2),
             why="judgement: index_copy_(0, ...) straight into the zeros output; the indices cover every row "
                 "here, and rows they miss keep their zeros, which the fused op can read like the padding of "
                 "qwen_gdn_merge_padded (tests/test_gated_norm_merge.py::test_merge_into_zeros_does_not_match "
                 "says 0 for the old op)",
             graph_check=merge_fused),
    Spelling("hf_qwen3_next_norm_rows",
             "huggingface/transformers: src/transformers/models/qwen3_next/modeling_qwen3_next.py",
             HFQwen3NextTail(), _hf_tail_inputs(False), NORM, within_ulps(2),
             why="merge-free: the HF gated norm on reshape(-1, D) rows, bf16 weight after the cast back"),
    Spelling("hf_kimi_linear_norm_4d",
             "huggingface/transformers: src/transformers/models/kimi_linear/modular_kimi_linear.py",
             HFKimiTail(), _hf_tail_inputs(True), NORM, within_ulps(2),
             why="merge-free sigmoid norm on [B=2, T, H, D] as is (gate reshaped to 4-D)"),
    Spelling("vllm_kimi_norm_4d_padded", VLLM + "vllm/model_executor/layers/mamba/gdn/kimi_gdn_linear_attn.py",
             VllmKimiTail(), _vllm_kimi_inputs, NORM, within_ulps(2),
             why="core_attn_out[0, :n] = out[0, :n] into zeros [1, T, H, D], then the 4-D "
                 "sigmoid norm with a 3-D gate",
             graph_check=copy_fused),
    Spelling("fla_rms_norm_ref_3d", "fla-org/flash-linear-attention: fla/modules/layernorm_gated.py",
             FlaRefNorm3D(eps=1e-6, seed=11), _norm3d_inputs, NORM, within_ulps(2),
             why="merge-free fla reference on [T, H, D]: 1/sqrt, square, float32 weight, out *= silu(z)"),
    Spelling("fla_test_nn_rmsnorm_times_gate", "fla-org/flash-linear-attention: tests/modules/test_layernorm_gated.py",
             FlaTestReference(), _fla_test_inputs, {}, within_ulps(2),
             why="near-miss: nn.RMSNorm then * silu(g) on [B, H, T, D] rounds the norm and the gate to bf16 before "
                 "their product in bf16: another function (three roundings) than the fused op's one rounding, 2 ulps "
                 "apart at worst with no slack; the project's norms are bit-exact or reorder float32 products only"),
    # ----- near-misses
    Spelling("vllm_norm_group_size", VLLM + "vllm/model_executor/layers/layernorm.py (RMSNormGated group_size)",
             RowsNorm(VllmRMSNormGated(D, group_size=D // 2, seed=12)), _rows_inputs, {}, within_ulps(2),
             why="near-miss: RMS over groups of D/2 within each head: another function"),
    Spelling("vllm_norm_before_gate_false",
             VLLM + "vllm/model_executor/layers/layernorm.py (norm_before_gate=False)",
             QwenGDNTail(VllmRMSNormGated(D, norm_before_gate=False, seed=13)), _merge_inputs(14, 12, 5), {},
             within_ulps(2), why="near-miss: norm(x * silu(z)) after the vLLM merge"),
    Spelling("dolomite_gate_before_norm",
             "IBM/dolomite-engine: dolomite_engine/hf_models/models/mamba2_dolomite/gated_rmsnorm.py",
             RowsNorm(DolomiteGatedRMSNorm()), _rows_inputs, {}, within_ulps(2),
             why="near-miss: gate first, transformers-style weight after the cast"),
    Spelling("vllm_merged_buffer_read_again",
             VLLM + "vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py (+ output returned)",
             CpuGDNTail(return_merged=True), _cpu_tail_inputs, {}, within_ulps(2),
             why="near-miss: the merged buffer the norm reads is also an output, so it must be materialized"),
    Spelling("fla_rms_norm_ref_no_upcast",
             "fla-org/flash-linear-attention: fla/modules/layernorm_gated.py (upcast=False)",
             FlaRefNorm3D(eps=1e-6, upcast=False, seed=15), _norm3d_inputs, {}, close(3e-2, 1e-2),
             why="near-miss: the whole norm in bf16 (every step rounded): another function than the float32 kernel"),
    Spelling("mask_merge", "near-miss of " + VLLM + "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py",
             MaskMergeTail(), _mask_merge_inputs, {}, within_ulps(2),
             why="near-miss: boolean-mask merge (out[mask] = v): data-dependent, not index tensors"),
]

CASES = SPLIT_CASES + MERGE_CASES
