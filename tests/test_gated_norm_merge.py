"""gated_norm_merge: pattern, op and Triton kernel.

Bounds: on CPU the op computes what eager computes for the fla and hf spellings, so those
tests assert bit equality with eager; spellings whose products are in another order
assert at most two bf16 ulps (the issue's bound).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kda_inductor.lowerings import gated_norm_merge as mod
from kda_inductor.testing import (
    assert_close_in_range,
    assert_close_to_eager,
    compile_for_test,
    fresh_compile,
    max_ulps,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import gdn_layers as G  # noqa: E402
from tests.helpers import ON, device_params  # noqa: E402

H, D = 3, 16


def assert_kernel_matches_cpu_op(y, want, label=""):
    """The Triton kernel's output against the CPU op: within 1 ulp of the output dtype, on a GPU
    and under the interpreter alike. The interpreter's sum of squares is numpy's, whose
    reduction order follows the machine's SIMD dispatch, so one rounding flip in a few hundred
    outputs is machine-dependent (CI saw 1 of 672 fp16 bytes on a machine where this one was
    bit-exact); the gathers and copies around the norm stay bit-exact (their own tests)."""
    assert max_ulps(y.cpu(), want) <= 1, label


def _inputs(T=13, n_spec=8, dtype=torch.bfloat16, wdtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(T, generator=g)
    s, ns = perm[:n_spec], perm[n_spec:]
    o_s = torch.randn(1, n_spec, H, D, generator=g).to(dtype)
    o_ns = torch.randn(1, T - n_spec, H, D, generator=g).to(dtype)
    z = torch.randn(T, H, D, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(D, generator=g)).to(wdtype)
    return o_s, o_ns, s, ns, z, w


def _merge(o_s, o_ns, s, ns, how="index_copy_"):
    T = s.shape[0] + ns.shape[0]
    out = torch.empty(1, T, H, D, dtype=o_s.dtype, device=o_s.device)
    if how == "index_copy_":
        out.index_copy_(1, s, o_s)
        out.index_copy_(1, ns, o_ns)
    elif how == "index_put_":  # vLLM's [T, H, D] buffer, merged along dim 0
        out = torch.empty(T, H, D, dtype=o_s.dtype, device=o_s.device)
        out.index_put_((s,), o_s[0])
        out.index_put_((ns,), o_ns[0])
    else:  # setitem
        out[:, s] = o_s
        out[:, ns] = o_ns
    return out


def fla(x, z, w, eps=1e-6, act="silu"):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()
    return (y * (F.silu(z.float()) if act == "silu" else torch.sigmoid(z.float()))).to(x.dtype)


def fla_sqrt(x, z, w, eps=1e-6):
    """flash-linear-attention's reference spelling: 1 / sqrt, square."""
    xf = x.float()
    rstd = 1 / torch.sqrt(xf.square().mean(dim=-1, keepdim=True) + eps)
    return (xf * rstd * w.float() * F.silu(z.float())).to(x.dtype)


def hf(x, z, w, eps=1e-6):
    """transformers' Qwen3NextRMSNormGated: weight applied after casting back."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    h = w * h.to(input_dtype)
    h = h * F.silu(z.to(torch.float32))
    return h.to(input_dtype)


def reordered(x, z, w, eps=1e-6):
    """Products in another order, x * x, sum / D, explicit x * sigmoid(x)."""
    xf = x.float()
    zf = z.float()
    var = (xf * xf).sum(-1, keepdim=True) / x.shape[-1]
    return ((zf * torch.sigmoid(zf)) * w.float() * (xf * torch.rsqrt(var + eps))).to(x.dtype)


def _layer_tail(norm, how="index_copy_", **kw):
    def f(o_s, o_ns, s, ns, z, w):
        out = _merge(o_s, o_ns, s, ns, how)
        return norm(out.reshape(-1, D), z.reshape(-1, D), w, **kw)
    return f


def _run(fn, *args, options=ON):
    with fresh_compile():
        c = compile_for_test(fn, options=options)
        out = c(*args)
    return out, c


# --------------------------------------------------------------------------- examples
@pytest.mark.parametrize("build", [G.build_gdn, G.build_kda], ids=["gdn", "kda"])
def test_example_layers_match_once(build):
    layer, args = build()
    with torch.no_grad():
        out, c = _run(layer, *args)
        eager = layer(*args)
    assert c.matches["gated_norm_merge"] == 1
    assert_close_in_range(out, eager)  # the recurrence before the norm is compiled too


def test_on_by_default_and_can_be_disabled():
    fn, args = _layer_tail(fla), _inputs(seed=9)
    _, c = _run(fn, *args, options=None)
    assert c.matches["gated_norm_merge"] == 1
    out, c = _run(fn, *args, options={"kda": {"disable": ["gated_norm_merge"]}})
    assert c.matches["gated_norm_merge"] == 0
    assert_close_to_eager(out, fn(*args), exact=True)


# --------------------------------------------------------------------------- spellings (bit-exact)
@pytest.mark.parametrize("how", ["index_copy_", "index_put_", "setitem"])
@pytest.mark.parametrize("act", ["silu", "sigmoid"])
def test_fla_spelling_is_bit_exact(how, act):
    args = _inputs(seed=1)
    fn = _layer_tail(fla, how, act=act)
    out, c = _run(fn, *args)
    assert c.matches["gated_norm_merge"] == 1
    assert_close_to_eager(out, fn(*args), exact=True)


def test_fla_reference_spelling_sqrt_square_is_bit_exact():
    args = _inputs(seed=2)
    fn = _layer_tail(fla_sqrt)
    out, c = _run(fn, *args)
    assert c.matches["gated_norm_merge"] == 1
    assert_close_to_eager(out, fn(*args), exact=True)


@pytest.mark.parametrize("wdtype", [torch.bfloat16, torch.float32], ids=["w_bf16", "w_fp32"])
def test_hf_spelling_is_bit_exact(wdtype):
    args = _inputs(seed=3, wdtype=wdtype)
    fn = _layer_tail(hf)
    out, c = _run(fn, *args)
    assert c.matches["gated_norm_merge"] == 1
    assert_close_to_eager(out, fn(*args), exact=True)


def test_reordered_spelling_within_two_bf16_ulps():
    args = _inputs(seed=4)
    fn = _layer_tail(reordered)
    out, c = _run(fn, *args)
    assert c.matches["gated_norm_merge"] == 1
    assert max_ulps(out, fn(*args)) <= 2


def _z_arg_targets(compiled) -> list[str]:
    """The target of the node each ``kda.gated_norm_merge`` reads its gate from."""
    out = []
    for r in compiled.records:
        rows = {row.name: row for row in r.after_nodes}
        for row in r.after_nodes:
            if row.target == "kda.gated_norm_merge.default":
                z = row.args.split("], ")[2].split(",")[0].strip().lstrip("%")
                out.append(rows[z].target)
    return out


def test_gate_split_from_the_projection_is_read_in_place():
    """As the GDN layer writes it: the gate is a split of the projection that the user's
    ``reshape`` copies (a contiguous clone); the op reads the split itself, viewed ``[T, H, D]``
    (no copy left in the graph), and the result is eager's, bit for bit."""
    o_s, o_ns, s, ns, z, w = _inputs(seed=14)
    proj = torch.cat([torch.randn(13, 2 * H * D).bfloat16(), z.reshape(13, H * D)], dim=-1)

    def fn(o_s, o_ns, s, ns, proj, w):
        _, gate = proj.split([2 * H * D, H * D], dim=-1)
        out = _merge(o_s, o_ns, s, ns)
        return fla(out.reshape(-1, D), gate.reshape(-1, D), w)

    out, c = _run(fn, o_s, o_ns, s, ns, proj, w)
    assert c.matches["gated_norm_merge"] == 1
    assert _z_arg_targets(c) == ["aten.view.default"]
    assert not any(row.target == "aten.clone.default" for r in c.records for row in r.after_nodes)
    assert_close_to_eager(out, fn(o_s, o_ns, s, ns, proj, w), exact=True)
    # the gate copied from a tensor the graph writes in place is read from the copy
    def written(o_s, o_ns, s, ns, proj, w):
        _, gate = proj.split([2 * H * D, H * D], dim=-1)
        g = gate.reshape(-1, D)
        proj.mul_(2)
        return fla(_merge(o_s, o_ns, s, ns).reshape(-1, D), g, w)

    out, c = _run(written, o_s, o_ns, s, ns, proj.clone(), w)
    assert c.matches["gated_norm_merge"] == 1
    assert_close_to_eager(out, written(o_s, o_ns, s, ns, proj.clone(), w), exact=True)


def _one_key_head(x, proj, w):
    """transformers' Qwen3-Next with one key head and two value heads: the
    projection viewed ``[B, S, 1, W]``, the gate split ``[B, S, 1, 2 * D]``, reshaped
    ``[B, S, 2, D]`` (a view) and then ``[-1, D]`` (a copy: no view merges S with the heads)."""
    B, S = proj.shape[:2]
    _, z = torch.split(proj.view(B, S, 1, -1), [proj.shape[-1] - 2 * D, 2 * D], dim=3)
    z = z.reshape(B, S, -1, D)
    return hf(x.reshape(-1, D), z.reshape(-1, z.shape[-1]), w)


def test_gate_copied_from_a_reshape_of_the_split_one_key_head():
    """The copied gate ``[B, S, 2, D]`` cannot be viewed as rows; the split it was reshaped
    from can: the op reads that in place (before, a fake ``view`` raised ValueError and the
    rewrite was skipped with a warning)."""
    g = torch.Generator().manual_seed(21)
    x = torch.randn(1, 5, 2, D, generator=g).bfloat16()
    proj = torch.randn(1, 5, 3 * D, generator=g).bfloat16()
    w = (1 + 0.1 * torch.randn(D, generator=g))
    out, c = _run(_one_key_head, x, proj, w)
    assert c.matches["gated_norm_merge"] == 1
    assert _z_arg_targets(c) == ["aten.view.default"]
    assert not any(row.target == "aten.clone.default" for r in c.records for row in r.after_nodes)
    assert_close_to_eager(out, _one_key_head(x, proj, w), exact=True)


def test_transformers_qwen3_next_one_key_head(monkeypatch):
    """transformers' own ``Qwen3NextGatedDeltaNet`` with one key head and two value heads
   , its torch paths (not fla's kernels, which need a GPU), under inference mode:
    the gated norm is rewritten and the layer matches eager."""
    pytest.importorskip("transformers")
    M = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                 "causal_conv1d_update"):  # the hub / fla wrappers keep the torch function as __wrapped__
        f = getattr(M, name)
        monkeypatch.setattr(M, name, getattr(f, "__wrapped__", f))
    cfg = M.Qwen3NextConfig(hidden_size=32, linear_num_key_heads=1, linear_num_value_heads=2,
                            linear_key_head_dim=8, linear_value_head_dim=D, linear_conv_kernel_dim=4,
                            num_hidden_layers=1, layer_types=["linear_attention"])
    torch.manual_seed(0)
    layer = M.Qwen3NextGatedDeltaNet(cfg, 0).to(torch.bfloat16).eval()
    with torch.no_grad():
        layer.norm.weight.copy_(1 + 0.1 * torch.randn(D))
    x = torch.randn(1, 5, 32, dtype=torch.bfloat16)
    with torch.inference_mode():
        out, c = _run(layer, x)
        eager = layer(x)
    assert c.matches["gated_norm_merge"] == 1
    assert _z_arg_targets(c) == ["aten.view.default"]
    assert_close_in_range(out, eager)  # the recurrence and projections are compiled too


def test_transformers_kimi_linear_and_qwen3_5_gated_norms():
    """transformers' own gated norms: Kimi Linear's ``o_norm`` (sigmoid, weight in float32) on
    its 4-D ``[B, T, H, D]`` output with the gate viewed 4-D, and Qwen3.5's (silu, weight after
    the cast back) on rows: each is rewritten (the norm alone: no merge) and bit-exact."""
    kimi = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")
    qwen = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    torch.manual_seed(1)
    o_norm, q_norm = kimi.KimiLinearRMSNormGated(D).eval(), qwen.Qwen3_5RMSNormGated(D).eval()
    with torch.no_grad():
        for m in (o_norm, q_norm):
            m.weight.copy_(1 + 0.1 * torch.randn(D))
    x, gate = torch.randn(2, 5, H, D).bfloat16(), torch.randn(2, 5, H * D).bfloat16()

    def kimi_tail(x, gate):
        return o_norm(x, gate.view(2, 5, H, D)).reshape(2, 5, -1)

    def qwen_tail(x, gate):
        return q_norm(x.reshape(-1, D), gate.reshape(-1, D))

    for fn in (kimi_tail, qwen_tail):
        with torch.inference_mode():
            out, c = _run(fn, x, gate)
            eager = fn(x, gate)
        assert c.matches["gated_norm_merge"] == 1, fn.__name__
        assert c.records[0].parts == {"gated_norm_merge": {"norm alone": 1}}
        assert_close_to_eager(out, eager, exact=True)


def test_eps_is_a_parameter():
    args = _inputs(seed=5)
    outs = []
    for eps in (1e-6, 0.5):
        fn = _layer_tail(fla, eps=eps)
        out, c = _run(fn, *args)
        assert c.matches["gated_norm_merge"] == 1
        assert_close_to_eager(out, fn(*args), exact=True)
        outs.append(out)
    assert not torch.equal(*outs)


def test_float32_layer_and_int32_indices():
    o_s, o_ns, s, ns, z, w = _inputs(seed=6, dtype=torch.float32)

    def fn(o_s, o_ns, s, ns, z, w):
        out = torch.empty(1, 13, H, D)
        out[:, s] = o_s  # int32 indices: advanced indexing takes them
        out[:, ns] = o_ns
        return fla(out.reshape(-1, D), z.reshape(-1, D), w)

    args = (o_s, o_ns, s.int(), ns.int(), z, w)
    out, c = _run(fn, *args)
    assert c.matches["gated_norm_merge"] == 1
    assert_close_to_eager(out, fn(*args), exact=True)


# --------------------------------------------------------------------------- must not match
def _gate_first(x, z, w, eps=1e-6):
    """norm_before_gate=False."""
    xf = x.float() * F.silu(z.float())
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def _no_gate(x, z, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def _gelu_gate(x, z, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float() * F.gelu(z.float())).to(x.dtype)


def _bf16_silu_gate(x, z, w, eps=1e-6):
    """F.silu of the bf16 gate: silu rounded to bf16 before the product (eager differs from the
    fused op's float32 gate by one bf16 ulp in about a quarter of the outputs)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float() * F.silu(z)).to(x.dtype)


def _gate_first_bf16(x, z, w, eps=1e-6):
    """fla's norm_before_gate=False written in bf16: x * silu(z), then the norm."""
    x = x * F.silu(z)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def _no_upcast(x, z, w, eps=1e-6):
    """The whole norm in bf16: no .float() of x."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.to(x.dtype) * F.silu(z)


def _norm_of_silu(x, z, w, eps=1e-6):
    """A plain RMSNorm of an activation's output (no gate after it): no candidate."""
    xf = F.silu(x).float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


_RMSNORM = torch.nn.RMSNorm(D, eps=1e-6).requires_grad_(False)  # a graph with grad is not rewritten


def _nn_rmsnorm_bf16(x, z, w, eps=1e-6):
    """nn.RMSNorm of the bf16 tensor (its own float32 math, rounded), gated in bf16."""
    return _RMSNORM(x) * F.silu(z)


def _nn_rmsnorm_f32_gate(x, z, w, eps=1e-6):
    """nn.RMSNorm of the bf16 tensor, its output (weight applied in float32, then rounded)
    gated in float32: a rounding neither of the op's forms has."""
    return (_RMSNORM(x) * F.silu(z.float())).to(x.dtype)


_WHY = {  # what each miss must name
    "gate_first": "the gate is applied before the norm",
    "gate_first_bf16": "the gate is applied before the norm",
    "gelu": "the gate's activation is gelu",
    "bf16_silu_gate": "the gate's activation is rounded to bfloat16",
    "no_upcast": "the norm is computed in bfloat16 (no float32 upcast",
    "nn_rmsnorm_bf16": "the gate's activation is rounded to bfloat16",
    "nn_rmsnorm_f32_gate": "the norm is rounded to 16 bits after its weight and before the gate",
}
_PRECISION_ONLY = {"bf16_silu_gate", "no_upcast", "nn_rmsnorm_bf16", "nn_rmsnorm_f32_gate"}


@pytest.mark.parametrize("norm", [_gate_first, _no_gate, _gelu_gate, _bf16_silu_gate, _gate_first_bf16, _no_upcast,
                                  _nn_rmsnorm_bf16, _nn_rmsnorm_f32_gate, _norm_of_silu],
                         ids=["gate_first", "no_gate", "gelu", "bf16_silu_gate", "gate_first_bf16", "no_upcast",
                              "nn_rmsnorm_bf16", "nn_rmsnorm_f32_gate", "norm_of_silu"])
def test_other_norms_do_not_match(norm, request):
    """Each is a gated norm a user would recognize, and not what the op computes: not rewritten,
    and the miss names what differs (only precision, where that is all), at this file's line
    (nn.RMSNorm's too: not torch/nn/functional.py); a plain RMSNorm is no candidate."""
    case = request.node.callspec.id
    args = _inputs(seed=7)
    fn = _layer_tail(norm)
    out, c = _run(fn, *args)
    assert c.matches["gated_norm_merge"] == 0
    if norm is _no_upcast:  # stock Inductor keeps this bf16 norm's intermediates in float32 (3 ulps from eager)
        stock, _ = _run(fn, *args, options={"kda": {"disable": ["gated_norm_merge"]}})
        assert_close_to_eager(out, stock, exact=True)
    else:
        assert_close_to_eager(out, fn(*args))
    misses = [str(m) for m in c.records[0].misses["gated_norm_merge"]]
    if norm in (_no_gate, _norm_of_silu):  # a plain RMSNorm is no candidate (every model has them)
        assert not any("gate" in m for m in misses), misses
        return
    files = [m.split(": not rewritten")[0].rsplit("/", 1)[-1].split(":")[0] for m in misses]
    assert files == ["test_gated_norm_merge.py"], misses
    assert _WHY[case] in misses[0], misses
    assert ("precision differs" in misses[0]) == (case in _PRECISION_ONLY), misses


def test_merged_buffer_read_elsewhere_does_not_match():
    def fn(o_s, o_ns, s, ns, z, w):
        out = _merge(o_s, o_ns, s, ns)
        return fla(out.reshape(-1, D), z.reshape(-1, D), w), out.sum()

    args = _inputs(seed=8)
    _, c = _run(fn, *args)
    assert c.matches["gated_norm_merge"] == 0


def test_intermediate_read_elsewhere_does_not_match():
    def fn(o_s, o_ns, s, ns, z, w):
        x = _merge(o_s, o_ns, s, ns).reshape(-1, D).float()
        var = x.pow(2).mean(-1, keepdim=True)
        return (x * torch.rsqrt(var + 1e-6) * w * F.silu(z.reshape(-1, D).float())).bfloat16(), var

    args = _inputs(seed=9)
    _, c = _run(fn, *args)
    assert c.matches["gated_norm_merge"] == 0


def test_merge_into_zeros_matches():
    """A merge into ``torch.zeros`` whose indices cover every token: the fill is never read."""
    def fn(o_s, o_ns, s, ns, z, w):
        out = torch.zeros(1, 13, H, D, dtype=o_s.dtype)
        out.index_copy_(1, s, o_s)
        out.index_copy_(1, ns, o_ns)
        return fla(out.reshape(-1, D), z.reshape(-1, D), w)

    args = _inputs(seed=10)
    out, c = _run(fn, *args)
    assert c.matches["gated_norm_merge"] == 1
    assert_close_to_eager(out, fn(*args))


def test_merge_into_zeros_with_uncovered_rows_does_not_match():
    """Rows of the zeros no index covers would be normed as zero rows (signed zeros from the
    gate): the op has no such path, so the merge is left alone."""
    def fn(o_s, o_ns, s, ns, z, w):
        out = torch.zeros(1, 14, H, D, dtype=o_s.dtype)
        out.index_copy_(1, s, o_s)
        out.index_copy_(1, ns, o_ns)
        return fla(out.reshape(-1, D), torch.cat([z, z[:1]]).reshape(-1, D), w)

    args = _inputs(seed=10)
    out, c = _run(fn, *args)
    assert c.matches["gated_norm_merge"] == 0
    assert_close_to_eager(out, fn(*args))


def test_indices_that_are_not_a_partition_do_not_match():
    o_s, o_ns, s, ns, z, w = _inputs(seed=11)

    def same_index_twice(o_s, o_ns, s, ns, z, w):
        out = torch.empty(1, 13, H, D, dtype=o_s.dtype)
        out.index_copy_(1, s, o_s)
        out.index_copy_(1, s, o_s * 2)
        return fla(out.reshape(-1, D), z.reshape(-1, D), w)

    def too_few_rows(o_s, o_ns, s, ns, z, w):
        out = torch.empty(1, 14, H, D, dtype=o_s.dtype)  # one token no index covers
        out.index_copy_(1, s, o_s)
        out.index_copy_(1, ns, o_ns)
        return fla(out.reshape(-1, D), torch.cat([z, z[:1]]).reshape(-1, D), w)

    for fn in (same_index_twice, too_few_rows):
        _, c = _run(fn, o_s, o_ns, s, ns, z, w)
        assert c.matches["gated_norm_merge"] == 0, fn.__name__


# --------------------------------------------------------------------------- the op
def test_op_rejects_bad_arguments_by_name():
    o_s, o_ns, s, ns, z, w = _inputs()
    srcs, z2 = [o_s.reshape(8, -1), o_ns.reshape(5, -1)], z.reshape(-1, D)
    op = torch.ops.kda.gated_norm_merge.default
    with pytest.raises(ValueError, match="^activation: "):
        op(srcs, [s, ns], z2, w, 1e-6, "gelu", "fla", True, 13, torch.bfloat16)
    with pytest.raises(ValueError, match=r"^indices\[1\]: "):
        op(srcs, [s, ns.float()], z2, w, 1e-6, "silu", "fla", True, 13, torch.bfloat16)
    with pytest.raises(ValueError, match="^weight: "):
        op(srcs, [s, ns], z2, w[:4], 1e-6, "silu", "fla", True, 13, torch.bfloat16)
    with pytest.raises(IndexError, match=r"^indices\[0\]: index 13 out of range"):
        op(srcs, [torch.where(s == s.max(), 13, s), ns], z2, w, 1e-6, "silu", "fla", True, 13, torch.bfloat16)
    with pytest.raises(ValueError, match="^sources: "):  # no indices: one source only
        op(srcs, [], z2, w, 1e-6, "silu", "fla", True, 13, torch.bfloat16)
    with pytest.raises(ValueError, match=r"^sources\[0\]: without indices"):
        op(srcs[:1], [], z2, w, 1e-6, "silu", "fla", True, 13, torch.bfloat16)


def test_opcheck():
    o_s, o_ns, s, ns, z, w = _inputs()
    torch.library.opcheck(torch.ops.kda.gated_norm_merge.default,
                          ([o_s.reshape(8, -1), o_ns.reshape(5, -1)], [s, ns], z.reshape(-1, D), w, 1e-6,
                           "silu", "fla", True, 13, torch.bfloat16))
    torch.library.opcheck(torch.ops.kda.gated_norm_merge.default,
                          ([o_ns.reshape(5, -1)], [], z[:5].reshape(-1, D), w, 1e-6, "sigmoid", "hf", False, 5,
                           torch.bfloat16))


HAS_KERNEL_RUNNER = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.skipif(not HAS_KERNEL_RUNNER or mod.triton is None, reason="no triton runner")
@pytest.mark.parametrize("form", ["fla", "hf"])
@pytest.mark.parametrize("act", ["silu", "sigmoid"])
def test_triton_kernel_matches_the_cpu_op(form, act):
    """float16 here: the interpreter truncates float32 -> bfloat16 instead of rounding."""
    from tests.test_lowering_indexer_k_gather import LAUNCHER_OK

    if not LAUNCHER_OK:
        pytest.skip("this Triton interpreter cannot run our kernels")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    o_s, o_ns, s, ns, z, w = (t.to(device) for t in _inputs(seed=12, dtype=dtype, wdtype=dtype))
    s = s.clone()
    s[0] -= 13  # negative: counts from the end
    srcs, z2 = [o_s.reshape(8, -1), o_ns.reshape(5, -1)], z.reshape(-1, D)
    for rsqrt, block_r in ((True, None), (False, None), (True, 4)):  # None: 1 row per program here
        want = torch.ops.kda.gated_norm_merge.default(
            [t.cpu() for t in srcs], [s.cpu(), ns.cpu()], z2.cpu(), w.cpu(), 1e-6, act, form, rsqrt, 13, dtype)
        y = torch.full_like(z2, 7.0)  # poisoned
        mod.norm_merge_triton(srcs, [s, ns], z2, w, y, eps=1e-6, activation=act, form=form, rsqrt=rsqrt,
                              num_tokens=13, block_r=block_r)
        assert_kernel_matches_cpu_op(y, want)


@pytest.mark.skipif(not HAS_KERNEL_RUNNER or mod.triton is None, reason="no triton runner")
def test_triton_kernel_reads_a_strided_3d_gate():
    """A gate ``[A, B, D]`` read where it lies: a split of a wider projection viewed
    ``[T, H, D]`` (no copy), and a head-major one (``[H, T, D]`` transposed); the same as the
    CPU op on the gate's rows in order."""
    from tests.test_lowering_indexer_k_gather import LAUNCHER_OK

    if not LAUNCHER_OK:
        pytest.skip("this Triton interpreter cannot run our kernels")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    o_s, o_ns, s, ns, z, w = (t.to(device) for t in _inputs(seed=13, dtype=dtype, wdtype=dtype))
    srcs, z2 = [o_s.reshape(8, -1), o_ns.reshape(5, -1)], z.reshape(-1, D)
    wide = torch.randn(13, 3 * H * D, device=device).to(dtype)
    wide[:, H * D:2 * H * D] = z2.view(13, H * D)
    gates = {"split of a projection": wide[:, H * D:2 * H * D].view(13, H, D),
             "head-major": z2.view(13, H, D).transpose(0, 1).contiguous().transpose(0, 1)}
    want = torch.ops.kda.gated_norm_merge.default(
        [t.cpu() for t in srcs], [s.cpu(), ns.cpu()], z2.cpu(), w.cpu(), 1e-6, "silu", "fla", True, 13, dtype)
    for label, g in gates.items():
        assert not g.is_contiguous() and torch.equal(g.reshape(-1, D), z2), label
        y = torch.full_like(z2, 7.0)  # poisoned
        mod.norm_merge_triton(srcs, [s, ns], g, w, y, eps=1e-6, activation="silu", form="fla", rsqrt=True,
                              num_tokens=13, block_r=4)
        assert_kernel_matches_cpu_op(y, want, label)
        # the CPU op takes the same 3-D gate
        got = torch.ops.kda.gated_norm_merge.default(
            [t.cpu() for t in srcs], [s.cpu(), ns.cpu()], g.cpu(), w.cpu(), 1e-6, "silu", "fla", True, 13, dtype)
        assert got.shape == (13 * H, D)
        assert_close_to_eager(got, want, exact=True)


@device_params
def test_automatic_dynamic_token_count_from_the_gate(device):
    """As the layers write it: ``out``'s T comes from another tensor, so under automatic
    dynamic T and the index lengths are unrelated symbols. Still one match per graph; a
    call whose lengths do not add up to T (duplicates: the later write wins) runs eager's
    merge-then-norm inside the op and equals eager exactly."""
    def fn(o_s, o_ns, s, ns, z, w):
        out = torch.empty(1, z.shape[0], H, D, dtype=o_s.dtype, device=o_s.device)
        out.index_copy_(1, s, o_s)
        out.index_copy_(1, ns, o_ns)
        return fla(out.reshape(-1, D), z.reshape(-1, D), w)

    dtype = torch.float16 if device == "cpu" else torch.bfloat16
    with fresh_compile():
        c = compile_for_test(fn, options=ON)
        for T, n_spec, seed in ((13, 8, 30), (21, 15, 31), (17, 12, 32)):
            o_s, o_ns, s, ns, z, w = _inputs(T=T, n_spec=n_spec, seed=seed, dtype=dtype)
            if T == 17:  # not a partition: ns overlaps s in 7 tokens and covers the rest
                ns = torch.cat([s[5:], ns])
                o_ns = torch.randn(1, ns.shape[0], H, D, dtype=dtype)
            args = [t.to(device).clone() for t in (o_s, o_ns, s, ns, z, w)]  # no views: same guards
            got, want = c(*args), fn(*args)
            if device == "cpu" or T == 17:  # the fallback is eager's own ops
                assert_close_to_eager(got, want, exact=True)
            else:
                assert max_ulps(got, want) <= 2
    assert len(c.records) == 2 and c.matches["gated_norm_merge"] == 2


def test_automatic_dynamic_token_count():
    """The second token count recompiles with a symbolic T (the op gets it as the sum of
    the index lengths). Under ``dynamic=True`` Dynamo also lifts eps to a graph input:
    not matched (eps must be a constant of the graph)."""
    fn = _layer_tail(fla)
    with fresh_compile():
        c = compile_for_test(fn, options=ON)
        for T, n_spec, seed in ((13, 8, 20), (21, 15, 21), (17, 9, 22)):
            args = _inputs(T=T, n_spec=n_spec, seed=seed)
            assert_close_to_eager(c(*args), fn(*args), exact=True)
    assert len(c.records) == 2 and c.matches["gated_norm_merge"] == 2


# --------------------------------------------------------------------------- merge-free
def _plain(norm, **kw):
    def f(x, z, w):
        return norm(x.reshape(-1, D), z.reshape(-1, D), w, **kw)
    return f


@pytest.mark.parametrize("norm, kw", [(fla, {}), (fla, {"act": "sigmoid"}), (hf, {})], ids=["fla", "sigmoid", "hf"])
def test_merge_free_norm_is_fused(norm, kw):
    """No merge: the gated RMSNorm of a contiguous tensor, one source and no indices; bit-exact."""
    _, x, _, _, z, w = _inputs(T=13, n_spec=0, seed=40)
    fn = _plain(norm, **kw)
    out, c = _run(fn, x, z, w)
    assert c.matches["gated_norm_merge"] == 1
    assert "indices: []" in c.records[0].after or ", [], " in c.records[0].after
    assert_close_to_eager(out, fn(x, z, w), exact=True)


def test_rewrite_table_says_which_part_fired():
    """A merge by cat + argsort is a gather, not index_put writes: only the norm is fused, and
    the rewrite table (explain's, TORCH_LOGS', graph-diff's) says so; an index_copy_ merge is
    fused with its norm."""
    from kda_inductor.diff import rewrite_table

    def by_argsort(o_s, o_ns, s, ns, z, w):
        merged = torch.cat([o_s, o_ns], dim=1)[:, torch.argsort(torch.cat([s, ns]))]
        return fla(merged.reshape(-1, D), z.reshape(-1, D), w)

    args = _inputs(seed=42)
    for fn, part in ((by_argsort, "norm alone"), (_layer_tail(fla), "merge + norm")):
        out, c = _run(fn, *args)
        assert c.matches["gated_norm_merge"] == 1
        assert c.records[0].parts == {"gated_norm_merge": {part: 1}}
        table = rewrite_table(c.records[0])
        row = next(i for i, line in enumerate(table) if line.startswith("gated_norm_merge "))
        assert table[row + 1].split() == ["fused:", *part.split(), "1"], table
        assert_close_to_eager(out, fn(*args), exact=True)


def test_merge_free_norm_rule_static_threshold_symbolic_always(monkeypatch):
    """The speed rule (unforced): on CUDA, a static merge-free norm above MERGE_FREE_MAX_VALUES
    stays with Inductor (its static code measured faster), with the reason recorded; with a
    symbolic row count (how vLLM compiles it) it is rewritten: its kernel was measured never
    slower than Inductor's symbolic code at any size; on CPU it always stays. (The CUDA rule
    is exercised here on CPU by reporting the match's device as cuda.)"""
    from kda_inductor.patterns import gated_norm_merge as pattern

    unforced = {"kda": {"strict": True, "force": False}}
    _, x, _, _, z, w = _inputs(T=13, n_spec=0, seed=41)
    fn = _plain(fla)
    out, c = _run(fn, x, z, w, options=unforced)
    assert c.matches["gated_norm_merge"] == 0
    assert "left to Inductor: on cpu" in str(c.records[0].misses["gated_norm_merge"])
    assert all(m.check.endswith('(options={"kda": {"force": True}} rewrites it anyway)')
               for m in c.records[0].misses["gated_norm_merge"])
    monkeypatch.setattr(pattern.NormMatch, "device", "cuda")
    out, c = _run(fn, x, z, w, options=unforced)
    assert c.matches["gated_norm_merge"] == 1  # small and static: rewritten on CUDA
    monkeypatch.setattr(pattern, "MERGE_FREE_MAX_VALUES", x.numel() - 1)
    out, c = _run(fn, x, z, w, options=unforced)
    assert c.matches["gated_norm_merge"] == 0
    assert any("Inductor's fusion is faster above" in m.check for m in c.records[0].misses["gated_norm_merge"])
    assert max_ulps(out, fn(x, z, w)) <= 2
    torch._dynamo.mark_dynamic(x, 1)  # the token dims of x [1, T, H, D] and z [T, H, D]
    torch._dynamo.mark_dynamic(z, 0)
    out, c = _run(fn, x, z, w, options=unforced)  # symbolic: rewritten whatever the threshold
    assert c.matches["gated_norm_merge"] == 1
    assert_close_to_eager(out, fn(x, z, w), exact=True)


@pytest.mark.skipif(not HAS_KERNEL_RUNNER, reason="needs a GPU or TRITON_INTERPRET=1")
def test_triton_kernel_merge_free_identity():
    """One source, no indices: row p is token p (no index load); the same numbers as the CPU op."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    _, x, _, _, z, w = (t.to(device) for t in _inputs(T=13, n_spec=0, seed=42, dtype=dtype, wdtype=dtype))
    src, z2 = x.reshape(13, -1), z.reshape(-1, D)
    want = torch.ops.kda.gated_norm_merge.default([src.cpu()], [], z2.cpu(), w.cpu(), 1e-6, "silu", "fla", True, 13,
                                                  dtype)
    y = torch.full_like(z2, 7.0)  # poisoned
    mod.norm_merge_triton([src], [], z2, w, y, eps=1e-6, activation="silu", form="fla", rsqrt=True, num_tokens=13)
    assert_kernel_matches_cpu_op(y, want)


# --------------------------------------------------------------------------- 3-D / 4-D norms
def _kda_norm(x, z, w, eps=1e-6):
    """KDA's o_norm applied to [.., H, D] directly, sigmoid gate, no reshape to rows."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()
    return (y * torch.sigmoid(z.float())).to(x.dtype)


@pytest.mark.parametrize("rank", [3, 4])
def test_norm_on_3d_and_4d_merge_is_fused(rank):
    args = _inputs(seed=50)

    def fn(o_s, o_ns, s, ns, z, w):
        out = _merge(o_s, o_ns, s, ns)  # [1, T, H, D]
        x = out if rank == 4 else out.squeeze(0)
        return _kda_norm(x, z if rank == 3 else z.unsqueeze(0), w)

    out, c = _run(fn, *args)
    assert c.matches["gated_norm_merge"] == 1
    assert out.shape == ((1, 13, H, D) if rank == 4 else (13, H, D))
    assert_close_to_eager(out, fn(*args), exact=True)


@pytest.mark.parametrize("rank", [3, 4])
def test_merge_free_norm_on_3d_and_4d(rank):
    _, x, _, _, z, w = _inputs(T=13, n_spec=0, seed=51)  # x [1, 13, H, D], z [13, H, D]

    def fn(x, z, w):
        return _kda_norm(x if rank == 4 else x[0], z.unsqueeze(0) if rank == 4 else z, w)

    out, c = _run(fn, x, z, w)
    assert c.matches["gated_norm_merge"] == 1
    assert_close_to_eager(out, fn(x, z, w), exact=True)


def test_norm_over_part_of_a_head_does_not_match():
    """A group-size norm: the reduced dim (D / 2) is not the weight's... the weight is [D / 2]
    but z and x are normalized per half-head: a different function from the kernel's rows
    only if the rows straddle tokens; the per-group norm of the merged buffer is still a
    gated norm of [rows, D / 2], so the case that must not match is the weight of another
    size than the reduced dim."""
    o_s, o_ns, s, ns, z, w = _inputs(seed=52)

    def fn(o_s, o_ns, s, ns, z, w):
        x = _merge(o_s, o_ns, s, ns).reshape(-1, D // 2).float()
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        y = y.reshape(-1, D) * w  # weight over the whole head, after a norm over halves
        return (y * F.silu(z.reshape(-1, D).float())).bfloat16()

    out, c = _run(fn, o_s, o_ns, s, ns, z, w)
    assert c.matches["gated_norm_merge"] == 0
    assert_close_to_eager(out, fn(o_s, o_ns, s, ns, z, w))


# --------------------------------------------------------------------------- merge into a padded output
def _padded(how, base="zeros", pad=3):
    """vLLM: merge into torch.empty, copy into a zeros-initialized output that may be longer
    than the tokens (core_attn_out[:n] = merged.squeeze(0)), norm over all of it."""
    def fn(o_s, o_ns, s, ns, z, w):
        n = s.shape[0] + ns.shape[0]
        merged = torch.empty(1, n, H, D, dtype=o_s.dtype)
        merged.index_copy_(1, s, o_s)
        merged.index_copy_(1, ns, o_ns)
        make = {"zeros": torch.zeros, "empty": torch.empty, "ones": torch.ones}[base]
        if how == "3d":
            out = make(n + pad, H, D, dtype=o_s.dtype)
            out[:n] = merged.squeeze(0)
        else:  # out[0, :n] = ... into [1, T_pad, H, D]
            out = make(1, n + pad, H, D, dtype=o_s.dtype)
            out[0, :n] = merged.squeeze(0)
        zz = torch.cat([z, z[:pad]]) if pad else z
        y = fla(out.reshape(-1, D), zz.reshape(-1, D), w)
        return y if base != "empty" else y[: n * H]  # rows of torch.empty are undefined
    return fn


@pytest.mark.parametrize("base", ["zeros", "ones"])
@pytest.mark.parametrize("how", ["3d", "4d"])
def test_merge_into_padded_output_is_fused(how, base):
    args = _inputs(seed=53)
    fn = _padded(how, base)
    out, c = _run(fn, *args)
    assert c.matches["gated_norm_merge"] == 1
    after = c.records[0].after
    assert "slice_scatter" not in after and "index_put" not in after and "full" not in after
    assert_close_to_eager(out, fn(*args), exact=True)


def test_merge_into_padded_empty_and_no_padding():
    args = _inputs(seed=54)
    for fn in (_padded("3d", "empty"), _padded("3d", "zeros", pad=0)):
        out, c = _run(fn, *args)
        assert c.matches["gated_norm_merge"] == 1
        assert_close_to_eager(out, fn(*args), exact=True)


def test_padded_output_read_elsewhere_or_an_input_does_not_match():
    args = _inputs(seed=55)

    def read_elsewhere(o_s, o_ns, s, ns, z, w):
        n = s.shape[0] + ns.shape[0]
        merged = torch.empty(1, n, H, D, dtype=o_s.dtype)
        merged.index_copy_(1, s, o_s)
        merged.index_copy_(1, ns, o_ns)
        out = torch.zeros(n + 2, H, D, dtype=o_s.dtype)
        out[:n] = merged.squeeze(0)
        return fla(out.reshape(-1, D), torch.cat([z, z[:2]]).reshape(-1, D), w), out.sum()

    def into_input(o_s, o_ns, s, ns, z, w, out):
        n = s.shape[0] + ns.shape[0]
        merged = torch.empty(1, n, H, D, dtype=o_s.dtype)
        merged.index_copy_(1, s, o_s)
        merged.index_copy_(1, ns, o_ns)
        out[:n] = merged.squeeze(0)  # the user's buffer: its rows must be stored
        return fla(out.reshape(-1, D), torch.cat([z, z[:2]]).reshape(-1, D), w)

    out, c = _run(read_elsewhere, *args)
    assert c.matches["gated_norm_merge"] == 0
    assert "read elsewhere" in str(c.records[0].misses["gated_norm_merge"])
    buf = torch.randn(15, H, D).bfloat16()
    eager_buf = buf.clone()
    out, c = _run(into_input, *args, buf)
    assert c.matches["gated_norm_merge"] == 0
    assert "graph input" in str(c.records[0].misses["gated_norm_merge"])
    assert_close_to_eager(out, into_input(*args, eager_buf))
    assert_close_to_eager(buf, eager_buf, exact=True)


def test_padded_output_with_automatic_dynamic_tokens():
    """Serving: the merged count and the padded length both vary; one recompile, then
    symbolic sizes; every graph fused, exact."""
    fn = _padded("3d", "zeros")
    with fresh_compile():
        c = compile_for_test(fn, options=ON)
        for T, n_spec, seed in ((13, 8, 60), (21, 15, 61), (17, 9, 62)):
            args = _inputs(T=T, n_spec=n_spec, seed=seed)
            assert_close_to_eager(c(*args), fn(*args), exact=True)
    assert len(c.records) == 2 and c.matches["gated_norm_merge"] == 2


def test_op_pad_value_rows():
    """The op's padding tokens: every value pad_value, normalized like the others."""
    o_s, o_ns, s, ns, z, w = _inputs(seed=56)
    zz = torch.cat([z, z[:3]]).reshape(-1, D)
    srcs = [o_s.reshape(8, -1), o_ns.reshape(5, -1)]
    op = torch.ops.kda.gated_norm_merge.default
    for pad in (0.0, 1.5):
        got = op(srcs, [s, ns], zz, w, 1e-6, "silu", "fla", True, 13, torch.bfloat16, pad)
        merged = torch.full((16, H, D), pad, dtype=torch.bfloat16)
        merged[s] = o_s[0]
        merged[ns] = o_ns[0]
        assert_close_to_eager(got, fla(merged.reshape(-1, D), zz, w), exact=True)
    with pytest.raises(ValueError, match="^num_tokens: "):  # padding rows need a pad_value
        op(srcs, [s, ns], zz, w, 1e-6, "silu", "fla", True, 13, torch.bfloat16)


@pytest.mark.skipif(not HAS_KERNEL_RUNNER or mod.triton is None, reason="no triton runner")
def test_triton_kernel_padded_rows():
    from tests.test_lowering_indexer_k_gather import LAUNCHER_OK

    if not LAUNCHER_OK:
        pytest.skip("this Triton interpreter cannot run our kernels")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    o_s, o_ns, s, ns, z, w = (t.to(device) for t in _inputs(seed=57, dtype=dtype, wdtype=dtype))
    zz = torch.cat([z, z[:3]]).reshape(-1, D)
    srcs = [o_s.reshape(8, -1), o_ns.reshape(5, -1)]
    want = torch.ops.kda.gated_norm_merge.default([t.cpu() for t in srcs], [s.cpu(), ns.cpu()], zz.cpu(), w.cpu(),
                                                  1e-6, "sigmoid", "hf", True, 13, dtype, 2.0)
    y = torch.full_like(zz, 7.0)  # poisoned
    mod.norm_merge_triton(srcs, [s, ns], zz, w, y, eps=1e-6, activation="sigmoid", form="hf", rsqrt=True,
                          num_tokens=13, pad_value=2.0)
    assert_kernel_matches_cpu_op(y, want)


@pytest.mark.skipif(not HAS_KERNEL_RUNNER or mod.triton is None, reason="no triton runner")
def test_triton_kernel_copied_into_padded_rows():
    """A tensor copied into the first rows of a padded output (no merge, vLLM Kimi's
    core_attn_out[0, :n] = o[0, :n]): row p is token p, the padding rows are pad_value."""
    from tests.test_lowering_indexer_k_gather import LAUNCHER_OK

    if not LAUNCHER_OK:
        pytest.skip("this Triton interpreter cannot run our kernels")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    _, x, _, _, z, w = (t.to(device) for t in _inputs(T=13, n_spec=0, seed=58, dtype=dtype, wdtype=dtype))
    src, zz = x.reshape(13, -1), torch.cat([z, z[:3]]).reshape(-1, D)
    want = torch.ops.kda.gated_norm_merge.default([src.cpu()], [], zz.cpu(), w.cpu(), 1e-6, "sigmoid", "fla", True,
                                                  13, dtype, 0.0)
    y = torch.full_like(zz, 7.0)  # poisoned
    mod.norm_merge_triton([src], [], zz, w, y, eps=1e-6, activation="sigmoid", form="fla", rsqrt=True, num_tokens=13,
                          pad_value=0.0)
    assert_kernel_matches_cpu_op(y, want)


# --------------------------------------------------------------------------- in context
def _recurrent_decode_tail(state, q, z, w):
    """transformers' torch recurrent decode core (``torch_recurrent_gated_delta_rule``, one token)
    then Qwen3.5's gated norm: the float32 output written into a zeroed ``[B, H, 1, V]`` buffer,
    transposed to ``[B, 1, H, V]``, rounded to bf16, normed per head (``hf`` form)."""
    B, Hh, K, V = state.shape
    out = torch.zeros(B, Hh, 1, V, dtype=torch.float32)
    out[:, :, 0] = (state * q.unsqueeze(-1)).sum(dim=-2)
    x = out.transpose(1, 2).contiguous().to(torch.bfloat16)
    return hf(x.reshape(-1, V), z.reshape(-1, V), w)


def _decode_tail_inputs(seed=0, B=3, K=8):
    g = torch.Generator().manual_seed(seed)
    state = torch.randn(B, H, K, D, generator=g)
    q = torch.randn(B, H, K, generator=g)
    z = torch.randn(B, 1, H * D, generator=g).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(D, generator=g)).to(torch.bfloat16)
    return state, q, z, w


def test_norm_input_read_before_its_rounding():
    """The norm's bf16 input is a rounding (through a transpose, a copy and a ``select_scatter``
    into a fresh buffer) of a float32 reduction: the op reads the float32 values with
    ``in_dtype=bfloat16`` and rounds them itself, so none of those steps is left for Inductor to
    fuse into the reduction (that fusion made Qwen3.5's decode 1.08-1.26x stock's);
    bit-exact with eager."""
    args = _decode_tail_inputs(seed=3)
    out, c = _run(_recurrent_decode_tail, *args)
    assert c.matches["gated_norm_merge"] == 1
    assert_close_to_eager(out, _recurrent_decode_tail(*args), exact=True)
    after = c.records[0].after
    (op,) = [line for line in after.splitlines() if "kda.gated_norm_merge" in line]
    assert "None, None, torch.bfloat16), kwargs" in op  # pad_value, eps_input, in_dtype
    assert "select_scatter" not in after and "aten.permute" not in after
    assert "select_scatter" in c.records[0].before


def _pointwise_input_norm(a, b, z, w):
    """A norm whose bf16 input Inductor computes inside its norm kernel (a product, rounded)."""
    return hf((a * b).to(torch.bfloat16).reshape(-1, D), z.reshape(-1, D), w)


def _pointwise_gate_norm(x, z, w):
    """A norm whose gate is computed by pointwise code (Inductor fuses it into its norm)."""
    return fla(x.reshape(-1, D), (2 * z).reshape(-1, D), w)


def test_speed_rule_in_context(monkeypatch):
    """The CUDA rule looks at what surrounds the norm: where the input (merge-free) or the gate
    is computed by pointwise code, which Inductor emits inside its own norm kernel, the norm stays
    with Inductor and the miss says so at the user's line; where they are buffers Inductor writes
    anyway (a reduction's output, graph inputs) it is rewritten. (The CUDA rule on CPU: the
    match's device reported as cuda.)"""
    from kda_inductor.patterns import gated_norm_merge as pattern

    monkeypatch.setattr(pattern.NormMatch, "device", "cuda")
    unforced = {"kda": {"strict": True, "force": False}}
    args = _decode_tail_inputs(seed=4)
    out, c = _run(_recurrent_decode_tail, *args, options=unforced)
    assert c.matches["gated_norm_merge"] == 1  # the reduction's output: rewritten
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(4, H * D, generator=g), torch.randn(4, H * D, generator=g)
    z, w = torch.randn(4 * H, D, generator=g).to(torch.bfloat16), torch.ones(D, dtype=torch.bfloat16)
    for fn, fargs, what in ((_pointwise_input_norm, (a, b, z, w), "input"),
                            (_pointwise_gate_norm, (a.to(torch.bfloat16), z, w), "gate")):
        out, c = _run(fn, *fargs, options=unforced)
        assert c.matches["gated_norm_merge"] == 0, what
        (miss,) = c.records[0].misses["gated_norm_merge"]
        assert f"the norm's {what} is computed by" in miss.check and "fuses into its own norm kernel" in miss.check
        assert miss.location.endswith(f"test_gated_norm_merge.py:{_line_of(fla if what == 'gate' else hf, 'return')}")
        assert f"test_gated_norm_merge.py:{_line_of(fn, 'return')}" in miss.check  # where the input is computed
        assert max_ulps(out, fn(*fargs)) <= 2  # Inductor's own code: its precision, not eager's
        out, c = _run(fn, *fargs)  # forced: matched all the same, bit-exact
        assert c.matches["gated_norm_merge"] == 1
        assert_close_to_eager(out, fn(*fargs), exact=True)


def _line_of(fn, text: str) -> int:
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if line.strip().startswith(text))


def _norm_then_amax(x, z, w):
    """A norm whose output an fp8 quantization reduces again (its amax over each row)."""
    y = fla(x.reshape(-1, D), z.reshape(-1, D), w)
    return y, y.abs().amax(dim=-1)


def _norm_then_matmul(x, z, w, proj):
    """A norm whose output goes to the output projection (a matmul): nothing fuses into it."""
    return fla(x.reshape(-1, D), z.reshape(-1, D), w) @ proj


def test_speed_rule_reads_the_consumers(monkeypatch):
    """The CUDA rule in context, the norm's consumers: where its output is reduced again (the amax
    of a quantization, which Inductor fuses into its own norm kernel) the norm stays with Inductor
    and the miss says so; where a matmul reads it, it is rewritten."""
    from kda_inductor.patterns import gated_norm_merge as pattern

    monkeypatch.setattr(pattern.NormMatch, "device", "cuda")
    unforced = {"kda": {"strict": True, "force": False}}
    _, x, _, _, z, w = _inputs(T=6, n_spec=0, seed=7)
    out, c = _run(_norm_then_amax, x, z, w, options=unforced)
    assert c.matches["gated_norm_merge"] == 0
    (miss,) = c.records[0].misses["gated_norm_merge"]
    assert "the norm's output is reduced again" in miss.check and "test_gated_norm_merge.py" in miss.check
    proj = torch.randn(D, 8).to(torch.bfloat16)
    out, c = _run(_norm_then_matmul, x, z, w, proj, options=unforced)
    assert c.matches["gated_norm_merge"] == 1
    assert_close_to_eager(out, _norm_then_matmul(x, z, w, proj), exact=True)
