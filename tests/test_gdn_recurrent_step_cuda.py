"""gdn_recurrent_step on CUDA (skipped without a GPU), at Qwen3-Next's and Kimi Linear's per-layer
dims: transformers' decode step rewritten by the default rules (one Triton kernel, the cache in
place), within float32 rounding of eager (the kernel sums over K in its own order), CUDA-graph safe
(no host syncs, capture works, zero cudagraph skips under ``mode="reduce-overhead"`` with the cache
a static address), the state advancing across graph replays; a verify window of 4 tokens."""

from __future__ import annotations

import pytest
import torch

from kda_inductor.testing import assert_close_to_eager, assert_cudagraph_safe, assert_no_cudagraph_skips, \
    compile_for_test, fresh_compile, op_counts
from tests.helpers import ON
from tests.test_gdn_recurrent_step import NAME, hf_decode, torch_core

pytestmark = pytest.mark.cuda  # the kda_inductor pytest plugin skips these without a GPU
BF = torch.bfloat16
DIMS = {"qwen3_next": (16, 32, 128, False), "kimi_linear": (32, 32, 128, True)}  # Hk, Hv, K = V, per-channel


def _core(family):
    """The torch reference core (fla-core's kernels, where installed, are what the hub wrapper picks)."""
    return torch_core(family, "torch_recurrent_gated_delta_rule" if family == "qwen3_next" else
                      "recurrent_kimi_delta_attention")


def _inputs(family, B, T, seed):
    hk, hv, d, kda = DIMS[family]
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k = (torch.randn(B, T, hk, d, device="cuda", generator=g).to(BF) for _ in range(2))
    v = torch.randn(B, T, hv, d, device="cuda", generator=g).to(BF)
    gate = -torch.rand(B, T, hv, *((d,) if kda else ()), device="cuda", generator=g)
    beta = torch.rand(B, T, hv, device="cuda", generator=g).to(BF)
    return [q, k, v, gate, beta], 0.1 * torch.randn(B, hv, d, d, device="cuda", generator=g)


@pytest.mark.parametrize("family", sorted(DIMS))
@pytest.mark.parametrize("B,T", [(1, 1), (32, 1), (8, 4)])
def test_decode_step_matches_eager_in_place(family, B, T):
    xs, state = _inputs(family, B, T, seed=B + T)
    fn = hf_decode(_core(family))
    want_state, start = state.clone(), state.clone()

    def step_from_start():  # the step mutates its cache: each call (and the replay) starts from one state
        state.copy_(start)
        return c(*xs, state)

    with torch.inference_mode():
        want = fn(*xs, want_state)
        with fresh_compile():
            c = compile_for_test(fn, options=ON, force=False)
            out = c(*xs, state)
            assert c.matches[NAME] == 1 and op_counts(c).after["kda.gdn_recurrent_step_inplace.default"] == 1
            assert_close_to_eager(out, want)
            assert_close_to_eager(state, want_state, rtol=1e-5, atol=1e-5)  # float32 sums in the kernel's order
            assert_cudagraph_safe(step_from_start)


class Decode(torch.nn.Module):
    """A decode layer's core with the cache as a static buffer (transformers keeps it at one address)."""

    def __init__(self, family, state):
        super().__init__()
        self.step = hf_decode(_core(family))
        self.register_buffer("state", state)

    def forward(self, q, k, v, g, beta):
        return self.step(q, k, v, g, beta, self.state)


@pytest.mark.parametrize("family", sorted(DIMS))
def test_reduce_overhead_no_skips_and_state_advances(family):
    """Three decode steps replayed by reduce-overhead's CUDA graphs: outputs and the state within
    float32 rounding of three eager steps."""
    steps = [_inputs(family, 32, 1, seed=10 + i)[0] for i in range(3)]
    _, state = _inputs(family, 32, 1, seed=9)
    m, ref = Decode(family, state.clone()), Decode(family, state.clone())
    torch._dynamo.mark_static_address(m.state)
    with torch.inference_mode():
        want = [ref(*xs) for xs in steps]
    got = {}

    def run():
        with fresh_compile(), torch.inference_mode():
            got["c"] = compile_for_test(m, mode="reduce-overhead", options=ON, force=False)
            got["outs"] = [got["c"](*xs).clone() for xs in steps]

    assert_no_cudagraph_skips(run)
    assert got["c"].matches[NAME] == 1
    assert_close_to_eager(got["outs"], want)
    assert_close_to_eager(m.state, ref.state, rtol=1e-5, atol=1e-5)
