"""gdn_spec_split on CUDA: CUDA-graph safety and the device-side index check (skipped without a GPU)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from kda_inductor.testing import (
    assert_close_to_eager,
    assert_cudagraph_safe,
    compile_for_test,
    fresh_compile,
)

from tests.helpers import EXAMPLE_LAYERS, ON, example_layer_reduce_overhead  # noqa: E402

pytestmark = pytest.mark.cuda  # the kda_inductor pytest plugin skips these without a GPU


@pytest.mark.parametrize("kind", EXAMPLE_LAYERS)
def test_reduce_overhead_no_cudagraph_skips(kind):
    assert example_layer_reduce_overhead(kind, ON).matches["gdn_spec_split"] == 1


def test_graph_capture_and_no_host_syncs():
    T = 40
    perm = torch.randperm(T, device="cuda")
    s, ns = perm[:30].int(), perm[30:].int()
    qkv = torch.randn(T, 96, device="cuda").bfloat16()
    g, beta = torch.randn(1, T, 4, device="cuda"), torch.randn(1, T, 4, device="cuda").bfloat16()

    def split(qkv, g, beta, s, ns):
        return (qkv.index_select(0, s), qkv.index_select(0, ns), g.index_select(1, s),
                g.index_select(1, ns), beta.index_select(1, s), beta.index_select(1, ns))

    with fresh_compile():
        compiled = compile_for_test(split, options=ON)
        compiled(qkv, g, beta, s, ns)
        assert compiled.matches["gdn_spec_split"] == 1
        graph = assert_cudagraph_safe(compiled, qkv, g, beta, s, ns)
        qkv.copy_(torch.randn_like(qkv))  # new data in the same buffers: the replay gathers it
        s.copy_(s.flip(0))
        graph.replay()
        torch.cuda.synchronize()
        assert_close_to_eager(list(graph.captured), list(split(qkv, g, beta, s, ns)), exact=True)


@pytest.mark.parametrize("bad", [40, -41])
def test_out_of_range_index_is_a_device_assert(bad):
    """Like stock index_select on CUDA: a device-side assert, never a silent wrong read (in
    a subprocess: the assert poisons the CUDA context)."""
    code = textwrap.dedent(f"""
        import torch, kda_inductor.lowerings.gdn_spec_split as m
        x = torch.randn(40, 64, device="cuda")
        idx = torch.tensor([0, 5, {bad}, 7], device="cuda", dtype=torch.int32)
        out = m.split_triton([x], [idx], [0], [0], [torch.empty(4, 64, device="cuda")])
        torch.cuda.synchronize()
        print("NO ASSERT")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "NO ASSERT" not in proc.stdout, proc.stdout + proc.stderr
    assert "index out of range" in proc.stderr or "device-side assert" in proc.stderr, proc.stderr[-2000:]
