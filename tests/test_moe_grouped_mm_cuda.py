"""``kda::moe_grouped_mm`` on CUDA: bf16 at Qwen3-Next's expert dims against torch's grouped GEMM and
the groups one by one in float32, each launch the benchmark tries, CUDA-graph capture without host
syncs (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from kda_inductor.lowerings import moe_grouped_mm as mod
from kda_inductor.testing import assert_cudagraph_safe
from tests.test_lowering_moe_grouped_mm import _case

pytestmark = pytest.mark.cuda  # the kda_inductor pytest plugin skips these without a GPU


def _routed(S, E, K, N, seed=0):
    """Each token's 10 distinct experts (top-k of random scores), as a decode step routes them."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.rand(-(-S // 10), E, generator=g).topk(min(10, E), dim=-1).indices.reshape(-1)[:S]
    return _case(S, E, K, N, torch.bincount(ids, minlength=E).tolist(), dtype=torch.bfloat16, seed=seed,
                 device="cuda")


@pytest.mark.parametrize("S, E, K, N", [
    (320, 16, 2048, 1024),    # Qwen3-Next decode 32, gate-up
    (320, 16, 512, 2048),     # its down projection
    (1280, 16, 2048, 1024),   # decode 128: 80 rows a group, two row blocks of 64 for some
    (320, 512, 2048, 1024),   # the released 512 experts: most groups empty
    (7, 16, 2048, 1024),      # one token of top-7
], ids=["b32_gate_up", "b32_down", "b128_gate_up", "b32_512_experts", "one_token"])
@pytest.mark.parametrize("launch", [None, (16, 32, 128, 4, 4), (64, 64, 128, 4, 3), (32, 128, 64, 8, 3)],
                         ids=["default", "16x32", "64x64", "32x128w8"])
def test_op_matches_torch_grouped_mm(S, E, K, N, launch):
    x, w, offs = _routed(S, E, K, N)
    out = torch.full((S, N), float("nan"), dtype=x.dtype, device="cuda")
    mod.grouped_triton(x, w, offs, out, launch=launch)
    used = int(offs[-1])
    ref = mod.reference(x, w, offs)[:used].float()
    step = torch.finfo(torch.bfloat16).eps * float(ref.abs().max())
    torch.testing.assert_close(out[:used].float(), ref, atol=4 * step, rtol=0.02)
    torch.testing.assert_close(out[:used].float(), torch._grouped_mm(x, w, offs=offs)[:used].float(),
                               atol=4 * step, rtol=0.02)


def test_rows_past_the_last_offset_are_left_and_capture_has_no_sync():
    x, w, offs = _case(40, 4, 256, 128, [10, 0, 14, 6], dtype=torch.bfloat16, device="cuda")
    out = torch.full((40, 128), float("nan"), dtype=x.dtype, device="cuda")
    mod.grouped_triton(x, w, offs, out)
    assert torch.isnan(out[30:]).all() and not torch.isnan(out[:30]).any()
    assert_cudagraph_safe(lambda a, b, c: torch.ops.kda.moe_grouped_mm(a, b, c)[:30], x, w, offs)
