"""vLLM's gated RMSNorm as vLLM traces it: ``RMSNormGated.forward_native`` on ``core_attn_out
[T, H, D]`` with the gate a ``[T, H, D]`` view of the input projection's split, compiled with
the token dim dynamic (vLLM's one graph for every size). Both spellings: the current
``forward_static`` (``x.pow(2).mean`` + ``rsqrt``, weight in float32) and 0.11-0.12's
``rms_norm_ref`` from ``layernorm_guard`` (``x.square().mean``, ``1 / sqrt``, ``out *= silu(z)``;
written here from their reading). Unforced on CUDA (the match's device is reported as cuda on
CPU) the rewrite fires at a symbolic T; the gate is read where it lies (no copy); exact
against eager on CPU at several sizes of one compiled graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kda_inductor.testing import assert_close_to_eager, compile_for_test
from tests.helpers import fresh_compile

H, D = 3, 16


def forward_static(core_attn_out, z, weight, eps=1e-6):
    orig_dtype = core_attn_out.dtype
    x, weight, z = core_attn_out.float(), weight.float(), z.float()
    variance = x.pow(2).mean(dim=-1, keepdim=True)
    out = x * torch.rsqrt(variance + eps) * weight
    out = out * F.silu(z)
    return out.to(orig_dtype).flatten(-2)


def rms_norm_ref_0_11(core_attn_out, z, weight, eps=1e-6):
    dtype = core_attn_out.dtype
    weight = weight.float()
    x, z = core_attn_out.float(), z.float()
    rstd = 1 / torch.sqrt((x.square()).mean(dim=-1, keepdim=True) + eps)
    out = x * rstd * weight
    out *= F.silu(z)
    return out.to(dtype).flatten(-2)


def _inputs(T, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, D, generator=g).to(torch.bfloat16)
    proj = torch.randn(T, 2 * H * D, generator=g).to(torch.bfloat16)
    return x, proj[:, H * D:].view(T, H, D), (1 + 0.1 * torch.randn(D, generator=g)).to(torch.bfloat16)


@pytest.mark.parametrize("fn", [forward_static, rms_norm_ref_0_11], ids=["forward_static", "rms_norm_ref_0_11"])
def test_vllm_norm_rewritten_at_a_symbolic_token_count(monkeypatch, fn):
    from kda_inductor.patterns import gated_norm_merge as pattern

    monkeypatch.setattr(pattern.NormMatch, "device", "cuda")  # the CUDA speed rule, on CPU
    with fresh_compile():
        c = compile_for_test(fn, force=False)
        for T, seed in ((5, 1), (9, 2), (2, 3)):
            x, z, w = _inputs(T, seed)
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(z, 0)
            with torch.inference_mode():
                assert_close_to_eager(c(x, z, w), fn(x, z, w), exact=True)
    assert len(c.records) == 1, "one graph for every T"
    assert c.matches["gated_norm_merge"] == 1
    after = c.records[0].after
    assert "kda.gated_norm_merge" in after and "clone" not in after


def test_vllm_norm_gate_is_passed_in_place():
    """The op's gate argument is the graph's strided ``[T, H, D]`` view itself: no reshape that
    would copy it (measured 4x slower at 16K tokens on the H200 when it was copied)."""
    with fresh_compile():
        c = compile_for_test(forward_static)  # forced: the CPU rule would leave it
        x, z, w = _inputs(7, 4)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(z, 0)
        with torch.inference_mode():
            c(x, z, w)
    (op,) = [line for line in c.records[0].after.splitlines() if "kda.gated_norm_merge" in line]
    gate = op.split("args = (")[1].split("], ")[2].split(",")[0].strip().lstrip("%")
    gate_line = [line for line in c.records[0].after.splitlines() if line.strip().startswith(f"%{gate} ")]
    assert gate.startswith("arg") or "reshape" not in gate_line[0], (gate, gate_line)
