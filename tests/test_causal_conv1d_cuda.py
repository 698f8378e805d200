"""causal_conv1d on CUDA (skipped without a GPU): bit-exact with eager's conv + silu where aten runs
its own depthwise kernel (the kernel sums in its order, its silu is eager's ``x / (1 + expf(-x))``;
eager picks cuDNN for a token-major bf16 / fp16 input, whose sums may round otherwise: within one
ulp of that), CUDA-graph safe (no host syncs, capture works, zero cudagraph skips under
``mode="reduce-overhead"``), the decode form's state advancing across graph replays, and the
varlen kernel captured."""

from __future__ import annotations

import pytest
import torch

from kda_inductor.lowerings import causal_conv1d as L
from kda_inductor.testing import (
    assert_close_to_eager,
    assert_cudagraph_safe,
    assert_no_cudagraph_skips,
    compile_for_test,
    fresh_compile,
    max_ulps,
)
from tests.helpers import ON
from tests.test_lowering_causal_conv1d import eager_fn, eager_update, taps_reference

pytestmark = pytest.mark.cuda  # the kda_inductor pytest plugin skips these without a GPU


def atens_depthwise():
    """Eager with cuDNN off: aten's ``conv_depthwise2d_forward_kernel_generic`` for any layout."""
    return torch.backends.cudnn.flags(enabled=False)
C, K = 8192, 4


class Prefill(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(0.3 * torch.randn(C, K, device="cuda", dtype=torch.bfloat16),
                                         requires_grad=False)

    def forward(self, x):  # x [1, T, C]: transformers' layer around causal_conv1d_fn
        return eager_fn(x.transpose(1, 2), self.weight, None).transpose(1, 2)


class Decode(torch.nn.Module):
    def __init__(self, B):
        super().__init__()
        self.weight = torch.nn.Parameter(0.3 * torch.randn(C, K, device="cuda", dtype=torch.bfloat16),
                                         requires_grad=False)
        self.register_buffer("state", torch.randn(B, C, K, device="cuda", dtype=torch.bfloat16))

    def forward(self, x):  # x [B, 1, C]: causal_conv1d_update, the state a static buffer
        return eager_update(x.transpose(1, 2), self.state, self.weight, None).transpose(1, 2)


def test_prefill_bit_exact_with_eager_and_cudagraph_safe():
    torch.manual_seed(0)
    m = Prefill().eval()
    x = torch.randn(1, 1000, C, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(m, options=ON, force=False)
        out = c(x)
        assert c.matches["causal_conv1d"] == 1
        with atens_depthwise():
            assert_close_to_eager(out, m(x), exact=True)
        assert max_ulps(out, m(x)) <= 1  # eager as it runs (cuDNN, where it picks it)
        assert_cudagraph_safe(c, x)


def test_decode_reduce_overhead_no_skips_and_state_advances():
    """Three decode steps replayed by reduce-overhead's CUDA graphs: outputs and the state
    bit-exact with three eager steps."""
    torch.manual_seed(1)
    m, ref = Decode(32).eval(), Decode(32).eval()
    ref.load_state_dict(m.state_dict())
    torch._dynamo.mark_static_address(m.state)  # transformers' cache keeps it at one address
    xs = [torch.randn(32, 1, C, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    with torch.inference_mode(), atens_depthwise():
        want = [ref(x) for x in xs]
    got = {}

    def steps():
        with fresh_compile(), torch.inference_mode():
            got["c"] = compile_for_test(m, mode="reduce-overhead", options=ON, force=False)
            got["outs"] = [got["c"](x).clone() for x in xs]

    assert_no_cudagraph_skips(steps)
    assert got["c"].matches["causal_conv1d"] == 1
    assert_close_to_eager([*got["outs"], m.state], [*want, ref.state], exact=True)


def test_varlen_kernel_captured_no_host_sync():
    torch.manual_seed(2)
    x = torch.randn(1, 300, C, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    w = 0.3 * torch.randn(C, K, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, 1, 100, 100, 300], device="cuda", dtype=torch.int32)
    state = torch.randn(4, C, K, device="cuda", dtype=torch.bfloat16)
    graph = assert_cudagraph_safe(lambda: L.conv_triton(x, w, None, state, cu))
    want = taps_reference(x.cpu(), w.cpu(), None, state.cpu(), cu.cpu())
    assert max_ulps(graph.captured.cpu(), want) <= 1


def test_kernel_sums_in_atens_order_float32():
    """float32 inputs: products are rounded, so the order and the FMA matter; aten's
    depthwise kernel and ours agree bit for bit (conv alone: no activation; x token-major for
    the kernel, channel-first for aten)."""
    torch.manual_seed(3)
    x = torch.randn(2, 700, 512, device="cuda").transpose(1, 2)
    w, b = torch.randn(512, K, device="cuda"), torch.randn(512, device="cuda")
    got = L.conv_triton(x, w, b, activation="none")
    with atens_depthwise():
        want = eager_fn(x.contiguous(), w, b, act="none")
    assert torch.equal(got, want), f"max diff {(got - want).abs().max().item():.3g}: not aten's order (or not its kernel)"


STREAMING = [L.LaunchConfig(32, 128, 1, 1, 2, True, True, True, 4), L.LaunchConfig(64, 256, 1, 1, 2, True, True, True, 4),
             L.LaunchConfig(64, 128, 1, 1, 4, True, True, True, 2),
             L.LaunchConfig(64, 256, 1, 1, 2, True, True, True), L.LaunchConfig(64, 128, 1, 1, 2, True, True, False, 4),
             L.LaunchConfig(16, 64, 1, 1, 8, True, True, True)]
"""The streaming window (``_conv_stream.py``), with its ``ptx`` division and rounding (which the
interpreter does not run) and without, its loop unrolled and not (the sweep's ``PREFILL_FIRST``
forms; the first two are the table's launches from 4,096 and 16,384 tokens)."""


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cfg", STREAMING, ids=str)
def test_streaming_window_silu_of_every_16_bit_value(cfg, dtype):
    """Every finite bf16 / fp16 value as the conv's sum (the newest tap's weight 1, the others 0)
    in the tiles after the first (the streaming window's): the silu bit-exact with eager's
    (aten's depthwise kernel) and with the table's launch, zeros, subnormals, the range check's
    edges and the values past them included."""
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype)
    vals = bits[torch.isfinite(bits.float())]
    Cw, T = 1024, 64 + -(-vals.numel() // 1024)
    x = torch.zeros(1, T, Cw, dtype=dtype)
    x.view(-1)[64 * Cw:64 * Cw + vals.numel()] = vals
    x = x.cuda().transpose(1, 2)
    w = torch.zeros(Cw, K, device="cuda", dtype=dtype)
    w[:, -1] = 1
    got = L.conv_triton(x, w, None, config=cfg)
    assert torch.equal(got, L.conv_triton(x, w, None))
    with atens_depthwise():
        want = eager_fn(x.contiguous(), w, None)
    assert torch.equal(got, want)


@pytest.mark.parametrize("cfg", STREAMING, ids=str)
def test_streaming_window_bit_exact_at_qwen3_next_width(cfg):
    """Random inputs at 8192 channels, T = 1000 (a partial last tile): the streaming window
    against the table's launch, bit for bit."""
    torch.manual_seed(4)
    x = torch.randn(1, 1000, C, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    w = 0.3 * torch.randn(C, K, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(L.conv_triton(x, w, None, config=cfg), L.conv_triton(x, w, None))
