"""moe_grouped_experts on CUDA (skipped without a GPU): transformers' ``batched_mm`` experts at
Qwen3-Next's expert dims as torch's grouped GEMM, against eager, CUDA-graph safe (no host sync: the
offsets by ``searchsorted``), no cudagraph skip under ``reduce-overhead``, and the device assert of
an expert id out of range.

Numerics: cuBLAS' bmm and torch's grouped GEMM sum K in another order, so the rows agree within
bf16 rounding (a few steps of the output's scale), not bit for bit."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from kda_inductor.testing import (
    assert_close_to_eager,
    assert_cudagraph_safe,
    assert_no_cudagraph_skips,
    compile_for_test,
    fresh_compile,
)

pytestmark = pytest.mark.cuda  # the kda_inductor pytest plugin skips these without a GPU

NAME = "moe_grouped_experts"
HIDDEN, INTER, TOPK = 2048, 512, 10


def _layer(experts=64):
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextExperts

    cfg = transformers.Qwen3NextConfig(hidden_size=HIDDEN, moe_intermediate_size=INTER, num_experts=experts,
                                       num_experts_per_tok=TOPK)
    cfg._experts_implementation = "batched_mm"
    layer = Qwen3NextExperts(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=HIDDEN ** -0.5)
    return layer


def _inputs(tokens, experts=64, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, HIDDEN, generator=g, device="cuda").bfloat16()
    ids = torch.rand(tokens, experts, generator=g, device="cuda").topk(TOPK, dim=-1).indices
    w = torch.softmax(torch.randn(tokens, TOPK, generator=g, device="cuda"), -1).bfloat16()
    return x, ids, w


def _close(got, want):
    step = torch.finfo(torch.bfloat16).eps * float(want.float().abs().max())
    assert_close_to_eager(got, want, rtol=0.02, atol=4 * step)


@pytest.mark.parametrize("tokens", [1, 32])
def test_grouped_gemm_against_eager_and_graph_safe(tokens):
    layer, args = _layer(), _inputs(tokens)
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(layer)
        got = c(*args)
        assert c.matches[NAME] == 1
        _close(got, layer(*args))
        assert_cudagraph_safe(c, *args)


def test_the_speed_rule_on_cuda():
    """Rewritten by default where measured (``MEASURED["cuda"]``), left to Inductor otherwise."""
    from kda_inductor.patterns.moe_grouped_experts import MEASURED

    layer, args = _layer(), _inputs(8)
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(layer, force=False)
        c(*args)
    assert c.matches[NAME] == (1 if MEASURED.get("cuda") else 0)


def test_reduce_overhead_no_cudagraph_skips():
    layer, args = _layer(), _inputs(4)

    def run():
        with torch.inference_mode(), fresh_compile():
            c = compile_for_test(layer, mode="reduce-overhead")
            for _ in range(3):
                got = c(*args)
            assert c.matches[NAME] == 1
            _close(got, layer(*args))

    assert_no_cudagraph_skips(run)


@pytest.mark.parametrize("plain", [True, False], ids=["plain_batched_mm", "transformers"])
def test_an_expert_id_out_of_range_is_never_stale_memory(plain):
    """An expert id of E among E experts, in a child process (a device assert kills its CUDA context).
    Eager decides what is right: where transformers clamps the ids first (5.17 does, for expert
    parallelism's sentinels), the rewrite sees clamped ids and must give eager's rows; where eager's gather
    fails (the plain ``batched_mm`` module, as transformers 5.23 writes it), the rewrite's assert traps
    where Inductor keeps it, else the pair's token comes out NaN (on an H100, torch 2.11, Inductor's assert
    did not trap), the other tokens as eager's."""
    code = textwrap.dedent(f"""
        import torch
        from tests.test_moe_grouped_experts_cuda import _layer, _inputs
        from kda_inductor.testing import compile_for_test, fresh_compile
        if {plain!r}:
            from tests.test_moe_grouped_experts import E, Experts, routing
            torch.manual_seed(0)
            layer = Experts().to("cuda", torch.bfloat16).eval()
            x, ids, w = (t.cuda() for t in routing(tokens=3))
        else:
            E, layer, (x, ids, w) = 64, _layer(), _inputs(3)
        want = layer(x, ids, w)
        ids[1, 0] = E
        with torch.inference_mode(), fresh_compile():
            c = compile_for_test(layer)
            got = c(x, ids, w)
            torch.cuda.synchronize()
        others = torch.tensor([0, 2], device="cuda")
        ok = bool(torch.isnan(got[1]).all()) and not bool(torch.isnan(got[others]).any())
        diff = float((got[others].float() - want[others].float()).abs().max())
        print("matches", c.matches["moe_grouped_experts"], "nan_fraction", float(torch.isnan(got[1]).float().mean()))
        print("NAN ROW" if ok else "NO NAN", diff, flush=True)
        with torch.inference_mode():  # last: where eager's gather fails, the context dies here
            eager = layer(x, ids, w)
            torch.cuda.synchronize()
        step = torch.finfo(torch.bfloat16).eps * float(eager.float().abs().max())
        print("EAGER RETURNS", float((got.float() - eager.float()).abs().max()) / step, flush=True)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    said = r.stdout[-2000:] + r.stderr[-2000:]
    if "EAGER RETURNS" in r.stdout:  # this transformers clamps the ids: eager's rows are the answer
        assert not plain and "matches 1 " in r.stdout and float(r.stdout.split()[-1]) <= 4, said
        return
    if "NAN ROW" in r.stdout:  # eager's gather failed; the rewrite's rows for that token are NaN
        assert "matches 1 " in r.stdout and float(r.stdout.split("NAN ROW")[1].split()[0]) < 0.05, said
    else:  # or the compiled step trapped before it printed anything
        assert "NO NAN" not in r.stdout and ("expert id outside" in r.stderr or "device-side assert" in r.stderr), said
