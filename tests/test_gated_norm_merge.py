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
from tests.helpers import device_params  # noqa: E402

ON = {"kda": {"strict": True}}
H, D = 3, 16


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


@pytest.mark.parametrize("norm", [_gate_first, _no_gate, _gelu_gate], ids=["gate_first", "no_gate", "gelu"])
def test_other_norms_do_not_match(norm):
    args = _inputs(seed=7)
    fn = _layer_tail(norm)
    out, c = _run(fn, *args)
    assert c.matches["gated_norm_merge"] == 0
    assert_close_to_eager(out, fn(*args))


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


def test_merge_into_zeros_does_not_match():
    def fn(o_s, o_ns, s, ns, z, w):
        out = torch.zeros(1, 13, H, D, dtype=o_s.dtype)
        out.index_copy_(1, s, o_s)
        out.index_copy_(1, ns, o_ns)
        return fla(out.reshape(-1, D), z.reshape(-1, D), w)

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
        if device == "cpu":
            assert_close_to_eager(y, want, exact=True)
        else:  # the GPU reduces in another order than torch's CPU mean
            assert max_ulps(y.cpu(), want) <= 1


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
    assert "indices: []" in c.records[0]["after"] or ", [], " in c.records[0]["after"]
    assert_close_to_eager(out, fn(x, z, w), exact=True)


def test_merge_free_norm_left_to_inductor_when_large_or_symbolic(monkeypatch):
    """Above MERGE_FREE_MAX_VALUES (Inductor's fusion measured faster) or with a symbolic
    row count, the merge-free norm stays with Inductor, with the reason recorded."""
    from kda_inductor.patterns import gated_norm_merge as pattern

    _, x, _, _, z, w = _inputs(T=13, n_spec=0, seed=41)
    fn = _plain(fla)
    monkeypatch.setattr(pattern, "MERGE_FREE_MAX_VALUES", x.numel() - 1)
    out, c = _run(fn, x, z, w)
    assert c.matches["gated_norm_merge"] == 0
    assert "left to Inductor" in str(c.records[0]["misses"]["gated_norm_merge"])
    assert max_ulps(out, fn(x, z, w)) <= 2
    monkeypatch.undo()
    torch._dynamo.mark_dynamic(x, 1)  # the token dims of x [1, T, H, D] and z [T, H, D]
    torch._dynamo.mark_dynamic(z, 0)
    out, c = _run(fn, x, z, w)
    assert c.matches["gated_norm_merge"] == 0
    assert "symbolic row count" in str(c.records[0]["misses"]["gated_norm_merge"])


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
    if device == "cpu":
        assert_close_to_eager(y, want, exact=True)
    else:
        assert max_ulps(y.cpu(), want) <= 1
