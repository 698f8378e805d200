"""``kda::gdn_chunk``'s v4 scan and output (``LaunchConfig.scan4``, ``LaunchConfig.out4``, and both
in one launch, ``LaunchConfig.scan4_out``) and v3's inverse with a loop over key blocks
(``LaunchConfig.solve_bk``:
:mod:`kda_inductor.lowerings._gdn_chunk_kernels4`, off by default) under the interpreter on CPU (the
GPU under ``.ci/gpu tests``) against the CPU op (the float32 token loop) and a float64 einsum loop.
Tolerances as ``tests/test_lowering_gdn_chunk.py``'s (float32 products: 2e-5; bf16 operands: 2e-2
relative norm, the interpreter truncating)."""

from __future__ import annotations

import pytest
import torch

from kda_inductor.lowerings import gdn_chunk as mod
from tests.test_lowering_gdn_chunk import DEVICE, V2, V3, _dev, _kernel_vs_op, _rel, inputs, needs_runner, op
from tests.test_lowering_gdn_recurrent_step import einsum_reference

S4 = V2._replace(scan4=True)
"""v2 with ``scan4`` (16 columns a program: ``V = 20`` takes two blocks, the last masked)."""
CFG = {"S4": S4, "O4": V2._replace(out4="group"), "O4H": V2._replace(out4="head"),
       "V4": V3._replace(scan4=True, out4="group"), "S4BV32": S4._replace(scan_block_v=32, scan_stages=3),
       "O4BV32": V2._replace(out4="group", out_block_v=32), "SO": V2._replace(scan4_out=True),
       "SOBV32": V2._replace(scan4_out=True, scan_block_v=32), "SV4": V3._replace(solve_bk=16, scan4_out=True),
       "SV4S": V3._replace(solve_bk=32, solve_inverse="subst")}
FAST = {"FAST scan4": mod.FAST._replace(scan4=True, scan_stages=3), "FAST out4": mod.FAST._replace(out4="group"),
        "FAST out4 head": mod.FAST._replace(out4="head"),
        "FAST4": mod.FAST3._replace(scan4=True, scan_stages=3, out4="group"),
        "FAST scanout4": mod.FAST._replace(scan4_out=True, scan_block_v=16),
        "FAST3 solve4": mod.FAST3._replace(solve_bk=32, solve_warps=2)}


@needs_runner
@pytest.mark.parametrize("config", ["S4", "O4", "O4H", "V4", "SO", "SV4"])
@pytest.mark.parametrize("case", ["T 1", "T 37 GQA", "T 130 GQA", "no state", "no l2norm", "K 80 V 20 masked",
                                  "batch 3", "weak decay", "group 4"])
def test_v4_kernels_match_the_cpu_op(case, config):
    """float32 products (``dot="ieee"``): T below / across the chunk and not a multiple of it, GQA
    (two key heads, four value heads; ``"group 4"``: one key head for four value heads, the whole
    group in one ``output4`` program), no state, raw q / k with a scale, K = 80 (two 64-row state
    blocks, the second masked) with V = 20 (column blocks of 16, the last masked), three sequences
    as a batch, decays near 1 with beta near 1 (the state carries across chunks). ``SV4``: ``solve4``
    over 16-column key blocks (one at K = 16, five at K = 80) with the fused scan."""
    kw = dict(T=int(case.split()[1]) if case.startswith("T ") else 90, Hk=2, Hv=4, state=case != "no state",
              B=3 if case == "batch 3" else 1, weak=case == "weak decay")
    if case.startswith("K 80"):
        kw.update(K=80, V=20, Hk=1, Hv=2)
    if case == "group 4":
        kw.update(Hk=1, Hv=4, T=100)
    q, k, v, g, beta, s = inputs(900 + len(case), **kw)
    if case == "no l2norm":
        q, k = 0.2 * q, 0.2 * k
    _kernel_vs_op((q, k, v, g, beta, s), scale=0.4 if case == "no l2norm" else None, l2=case != "no l2norm",
                  config=CFG[config])


@needs_runner
@pytest.mark.parametrize("config", ["S4", "O4", "V4", "SO", "SV4S"])
@pytest.mark.parametrize("state", [True, False])
def test_v4_kernels_varlen(state, config):
    """Sequences of lengths 1, 69, 0 and 33 packed along T with GQA: chunks restart at each one (the
    scan's chunk ids from ``cu_chunks``, the output's from the chunk map)."""
    _kernel_vs_op(inputs(930, T=103, Hk=1, Hv=2, N=4, state=state), cu=[0, 1, 70, 70, 103], config=CFG[config])


@needs_runner
@pytest.mark.parametrize("config", ["S4BV32", "O4BV32", "SOBV32"])
def test_v4_column_blocks(config):
    """V = 40 in blocks of 32 (the second masked: 8 of 32 columns), varlen with GQA."""
    _kernel_vs_op(inputs(940, T=75, V=40), config=CFG[config])
    _kernel_vs_op(inputs(941, T=75, V=40, Hk=1, N=3), cu=[0, 1, 66, 75], config=CFG[config])


@needs_runner
@pytest.mark.parametrize("config", ["V4", "SO"])
def test_v4_is_the_float64_loop(config):
    """Against the float64 einsum loop (independent of the CPU op), a state, GQA, T across a chunk."""
    q, k, v, g, beta, s = inputs(950, T=100, Hk=2, Hv=4)
    want, want_state = einsum_reference(q, k, v, g, beta, s, 0.3, True)
    out = torch.full(want.shape, float("nan"), dtype=torch.float32, device=DEVICE)
    got, final = mod.chunk_triton(*_dev(q, k, v, g, beta), 0.3, *_dev(s), True, out=out, dot="ieee",
                                  config=CFG[config])
    torch.testing.assert_close(got.cpu(), want.float(), rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(final.cpu(), want_state.float(), rtol=2e-5, atol=2e-5)


@needs_runner
@pytest.mark.parametrize("config", list(FAST))
@pytest.mark.parametrize("case", ["T 100 GQA state", "T 40 no state", "varlen", "T 150 weak decay"])
def test_v4_bf16_operands_within_their_rounding(case, config):
    """The sweep's v4 rows on bfloat16 inputs (bf16 operands and intermediates, the interpreter's
    roundings): within 2e-2 (relative norm) of the float32 op, as ``FAST``'s test."""
    T = int(case.split()[1]) if case.startswith("T ") else 100
    cu = [0, 30, 30, 100] if case == "varlen" else None
    q, k, v, g, beta, s = inputs(960 + len(case), T=T, Hk=1, Hv=2, K=32, V=32, dtype=torch.bfloat16,
                                 N=3 if cu else None, state=case != "T 40 no state", weak="weak" in case)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    want, want_state = op(q, k, v, g, beta, None, s, True, cu_t, 1e-6, torch.float32)
    out = torch.full(want.shape, float("nan"), dtype=torch.float32, device=DEVICE)
    got, final = mod.chunk_triton(*_dev(q, k, v, g, beta), None, *_dev(s), True, *_dev(cu_t), 1e-6, torch.float32,
                                  out=out, dot="tf32", config=FAST[config])
    assert got is out and not got.isnan().any()
    assert _rel(got.cpu(), want) < 2e-2 and _rel(final.cpu(), want_state) < 2e-2, (_rel(got.cpu(), want),
                                                                                   _rel(final.cpu(), want_state))


@needs_runner
@pytest.mark.parametrize("config", ["S4", "V4", "SO"])
def test_v4_no_tokens(config):
    """T = 0: no chunk launch (the output's grid is empty); the final state is the initial state."""
    q, k, v, g, beta, s = inputs(5, T=0, B=2, dtype=torch.bfloat16)
    out, final = mod.chunk_triton(*_dev(q, k, v, g, beta), None, *_dev(s), True, config=CFG[config])
    assert out.shape == (2, 0, 2, 16) and torch.equal(final.cpu(), s)
    _, zeros = mod.chunk_triton(*_dev(q, k, v, g, beta), None, None, True, config=CFG[config])
    assert torch.equal(zeros.cpu(), torch.zeros_like(s))


@needs_runner
def test_v4_unknown_output_is_an_error():
    q, k, v, g, beta, s = inputs(6, T=10)
    with pytest.raises(ValueError, match="out4"):
        mod.chunk_triton(*_dev(q, k, v, g, beta), None, *_dev(s), True, config=V2._replace(out4="heads"))
