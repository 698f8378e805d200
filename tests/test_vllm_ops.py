"""The plugin door (``kda_inductor.vllm_ops``): vLLM's indexer cache functions on our kernels.

On CPU the door's kernels run under the Triton interpreter (the door takes CPU tensors only
in these tests, through ``DEVICE_TYPES``) against our references: the gather bit-exact, the
write within one fp8 step and every byte outside the written slots unchanged. Calls outside
the validated domain go to vLLM's own function with the same arguments. The entry point
installs the door only when ``KDA_INDUCTOR_VLLM_OPS`` asks for it. (Signatures against a real
vLLM: ``integration/test_vllm_real.py``; bytes against vLLM's CUDA ops:
``benchmarks/bench_vllm_indexer_ops.py`` on a GPU.)
"""

from __future__ import annotations

import os
import types

import pytest
import torch

from kda_inductor import reference as R
from kda_inductor import vllm_ops

HAS_RUNNER = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_runner = pytest.mark.skipif(not HAS_RUNNER, reason="needs a GPU or TRITON_INTERPRET=1")


class FakeOps(types.SimpleNamespace):
    """``vllm._custom_ops``' two functions, recording their calls."""

    def __init__(self):
        calls = []
        super().__init__(calls=calls,
                         indexer_k_quant_and_cache=lambda *a: calls.append(("write", a)),
                         cp_gather_indexer_k_quant_cache=lambda *a: calls.append(("gather", a)))


@pytest.fixture
def door(monkeypatch):
    """The door installed on a fake ``vllm._custom_ops`` that takes tensors of this device."""
    monkeypatch.setattr(vllm_ops, "DEVICE_TYPES", ("cuda", DEVICE))
    ops = FakeOps()
    vllm_ops.install(ops)
    yield ops
    vllm_ops.uninstall(ops)


def _counts():
    from torch._dynamo.utils import counters

    return dict(counters[vllm_ops.COUNTER_KEY])


@needs_runner
@pytest.mark.parametrize("scale_fmt", ["ue8m0", ""])
def test_write_door_matches_the_reference(door, scale_fmt):
    g = torch.Generator().manual_seed(3)
    kv, _, _, _ = R.random_indexer_cache([40, 9], block_size=16, generator=g)
    kv = kv.to(DEVICE)
    k = (torch.randn(12, 128, generator=g) * 3).to(torch.bfloat16).to(DEVICE)
    slots = torch.randperm(kv.shape[0] * 16, generator=g)[:12].to(DEVICE)
    slots[[2, 7]] = -1  # padding: skipped
    want = kv.clone()
    R.write_indexer_k_loop(k.cpu(), want_cpu := want.cpu(), slots.cpu(), ue8m0=scale_fmt == "ue8m0")
    before = _counts().get("write", 0)
    door.indexer_k_quant_and_cache(k, kv, slots, 128, scale_fmt)
    assert _counts()["write"] == before + 1 and door.calls == []
    assert R.written_cache_mismatch(kv, want_cpu, slots, 128) is None


@needs_runner
def test_gather_door_matches_the_reference_bit_exact(door):
    g = torch.Generator().manual_seed(4)
    kv, table, cu, n = R.random_indexer_cache([70, 0, 33, 5], block_size=16, generator=g)
    kv, table, cu = kv.to(DEVICE), table.contiguous().to(DEVICE), cu.to(DEVICE)
    dst_k = torch.full((n, 128), 0x7E, dtype=torch.uint8, device=DEVICE).view(torch.float8_e4m3fn)  # poisoned
    dst_scale = torch.full((n, 4), 0xA5, dtype=torch.uint8, device=DEVICE)
    door.cp_gather_indexer_k_quant_cache(kv, dst_k, dst_scale, table, cu)
    values, scales = R.gather_indexer_k(kv.cpu(), table.cpu(), cu.cpu(), n)
    assert torch.equal(dst_k.view(torch.uint8).cpu(), values.view(torch.uint8))
    assert torch.equal(dst_scale.cpu(), scales.view(torch.uint8).reshape(n, 4))
    assert door.calls == []


def test_outside_the_domain_goes_to_vllms_own_op(door):
    """Every argument we did not validate against vLLM's op: vLLM's function, same arguments."""
    kv = torch.zeros(4, 16, 132, dtype=torch.uint8, device=DEVICE)
    k = torch.zeros(3, 128, dtype=torch.bfloat16, device=DEVICE)
    slots = torch.zeros(3, dtype=torch.int64, device=DEVICE)
    writes = {
        "quant_block_size is 64": (k, kv, slots, 64, "ue8m0"),
        "k is 2-D torch.float16": (k.half(), kv, slots, 128, "ue8m0"),
        "k is not contiguous": (torch.zeros(128, 3, dtype=torch.bfloat16, device=DEVICE).t(), kv, slots, 128, ""),
        "slot_mapping is 1-D torch.int32": (k, kv, slots.int(), 128, ""),
        "kv_cache is 3-D torch.uint8 (4, 16, 68)": (k, kv[..., :68].contiguous(), slots, 128, ""),
    }
    for why, args in writes.items():
        door.calls.clear()
        door.indexer_k_quant_and_cache(*args)
        assert door.calls == [("write", args)], why
        assert why in vllm_ops.write_unsupported(*args)
    table, cu = torch.zeros(2, 3, dtype=torch.int32, device=DEVICE), torch.zeros(3, dtype=torch.int32, device=DEVICE)
    dk, ds = torch.zeros(5, 128, dtype=torch.uint8, device=DEVICE), torch.zeros(5, 4, dtype=torch.uint8, device=DEVICE)
    gathers = {
        "dst_scale is torch.float32": (kv, dk, torch.zeros(5, 1, device=DEVICE), table, cu),  # vLLM: another quant block
        "dst_k is 2-D torch.uint8 (5, 64)": (kv[..., :68].contiguous(), dk[:, :64].contiguous(), ds, table, cu),  # MXFP4
        "cu_seq_lens is torch.int32 (4,)": (kv, dk, ds, table, torch.zeros(4, dtype=torch.int32, device=DEVICE)),
        "block_table is 2-D torch.int64": (kv, dk, ds, table.long(), cu),
    }
    for why, args in gathers.items():
        door.calls.clear()
        door.cp_gather_indexer_k_quant_cache(*args)
        assert door.calls == [("gather", args)], why
        assert why in vllm_ops.gather_unsupported(*args)
    assert _counts()["write_fallback"] >= 4 and _counts()["gather_fallback"] >= 4


def test_cpu_tensors_stay_with_vllm_by_default():
    """Out of the tests' interpreter setting the door takes CUDA tensors only."""
    assert vllm_ops.DEVICE_TYPES == ("cuda",)
    k = torch.zeros(3, 128, dtype=torch.bfloat16)
    why = vllm_ops.write_unsupported(k, torch.zeros(4, 16, 132, dtype=torch.uint8), torch.zeros(3, dtype=torch.int64),
                                     128, "ue8m0")
    assert why == "k is not a CUDA tensor"


def test_install_is_idempotent_and_reversible():
    ops = FakeOps()
    own = ops.indexer_k_quant_and_cache, ops.cp_gather_indexer_k_quant_cache
    vllm_ops.install(ops)
    vllm_ops.install(ops)
    assert ops.indexer_k_quant_and_cache is vllm_ops.indexer_k_quant_and_cache
    vllm_ops.uninstall(ops)
    assert (ops.indexer_k_quant_and_cache, ops.cp_gather_indexer_k_quant_cache) == own


@pytest.mark.parametrize("value, installed", [(None, False), ("0", False), ("1", True)])
def test_the_plugin_entry_point_installs_only_when_asked(monkeypatch, value, installed):
    import kda_inductor

    calls = []
    monkeypatch.setattr(vllm_ops, "install", lambda ops=None: calls.append(ops))
    if value is None:
        monkeypatch.delenv(vllm_ops.ENV, raising=False)
    else:
        monkeypatch.setenv(vllm_ops.ENV, value)
    kda_inductor.vllm_plugin()
    assert calls == ([None] if installed else [])
