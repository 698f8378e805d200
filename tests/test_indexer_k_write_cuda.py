"""indexer_k_write on CUDA: in-place codegen, CUDA-graph safety (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from kda_inductor.reference import (
    cache_row_bytes,
    layer_norm_k,
    write_indexer_k,
    write_indexer_k_loop,
    written_cache_mismatch,
)
from kda_inductor.testing import (
    assert_cudagraph_safe,
    assert_no_cudagraph_skips,
    compile_for_test,
    fresh_compile,
)
from tests.helpers import ON

pytestmark = pytest.mark.cuda  # the kda_inductor pytest plugin skips these without a GPU

HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 128, 64, 40


class IndexerKWriter(torch.nn.Module):
    """The cache as a module buffer (static address); k_norm parameters as buffers."""

    def __init__(self, ue8m0=True, norm=True):
        super().__init__()
        self.ue8m0, self.norm = ue8m0, norm
        g = torch.Generator().manual_seed(0)
        cache = torch.randint(0, 256, (NUM_BLOCKS, BLOCK_SIZE, cache_row_bytes(HEAD_DIM)), dtype=torch.uint8, generator=g)
        self.register_buffer("kv_cache", cache.cuda())
        self.register_buffer("weight", (torch.rand(HEAD_DIM, generator=g) + 0.5).cuda())
        self.register_buffer("bias", (torch.randn(HEAD_DIM, generator=g) * 0.1).cuda())

    def forward(self, k, slot_mapping):
        if self.norm:
            k = layer_norm_k(k, self.weight, self.bias)
        write_indexer_k(k, self.kv_cache, slot_mapping, self.ue8m0)


def _step_inputs(step, tokens=300):
    g = torch.Generator().manual_seed(100 + step)
    k = (torch.randn(tokens, HEAD_DIM, generator=g) * 3).to(torch.bfloat16)
    slots = torch.randperm((NUM_BLOCKS - 1) * BLOCK_SIZE, generator=g)[:tokens] + BLOCK_SIZE
    slots[-5:] = -1  # CUDA-graph padding
    return k.cuda(), slots.cuda()


def _expected(model, before, k, slots):
    ref = before.cpu().clone()
    w, b = (model.weight.cpu(), model.bias.cpu()) if model.norm else (None, None)
    write_indexer_k_loop(k.cpu(), ref, slots.cpu(), model.ue8m0, w, b)
    return ref


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_reduce_overhead_no_cudagraph_skips(mode):
    model = IndexerKWriter()

    def run_steps():
        for step in range(4):  # new tokens and slots each step, same shapes
            k, slots = _step_inputs(step)
            before = model.kv_cache.clone()
            compiled(k, slots)
            why = written_cache_mismatch(model.kv_cache, _expected(model, before, k, slots), slots, HEAD_DIM)
            assert why is None, f"step {step}: {why}"

    with fresh_compile():
        compiled = compile_for_test(model, mode=mode, options=ON)
        assert_no_cudagraph_skips(run_steps)
    assert compiled.matches["indexer_k_write"] == 1


@pytest.mark.parametrize("norm", [True, False], ids=["norm", "quant_only"])
def test_generated_code_writes_the_cache_buffer_in_place(norm):
    model = IndexerKWriter(norm=norm)
    k, slots = _step_inputs(0)
    before = model.kv_cache.clone()
    with fresh_compile():
        compiled = compile_for_test(model, options=ON)
        _, code = run_and_get_code(compiled, k, slots)
    code = "\n".join(code)
    assert compiled.matches["indexer_k_write"] == 1
    assert "kda.indexer_k_write.default(" in code
    from tests.test_indexer_k_write import COPY

    assert not COPY.search(code), code
    ref = _expected(model, before, k, slots)
    if norm:
        why = written_cache_mismatch(model.kv_cache, ref, slots, HEAD_DIM)
        assert why is None, why
    else:  # quant + write only: bit-identical, scales included
        assert torch.equal(model.kv_cache.cpu(), ref)


def test_graph_capture_and_no_host_syncs():
    model = IndexerKWriter()
    k, slots = _step_inputs(1)
    with fresh_compile():
        compiled = torch.compile(model, backend="kda_inductor", options=ON)
        compiled(k, slots)  # compile outside the sync check
        graph = assert_cudagraph_safe(compiled, k, slots)
        # new data in the same buffers: the replay writes it
        k2, slots2 = _step_inputs(2)
        k.copy_(k2)
        slots.copy_(slots2)
        before = model.kv_cache.clone()
        graph.replay()
        torch.cuda.synchronize()
        why = written_cache_mismatch(model.kv_cache, _expected(model, before, k, slots), slots, HEAD_DIM)
        assert why is None, why
