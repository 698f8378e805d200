"""``kda_inductor.testing``'s op counts: a graph's ops before and after our pass, as vLLM's fusion
tests count them (``op_counts(compiled)``, ``counting_ops()`` around any compile)."""

from __future__ import annotations

import torch

from kda_inductor.testing import OpCounter, compile_for_test, counting_ops, op_counts
from tests.helpers import fresh_compile
from tests.test_gated_norm_quant import _inputs, gated_norm


def test_op_counts_before_and_after_the_pass():
    args = _inputs(seed=7)
    with fresh_compile():
        c = compile_for_test(gated_norm)
        with torch.inference_mode():
            c(*args)
    ops = op_counts(c)
    assert c.matches["gated_norm_merge"] == 1
    assert (ops.before[torch.ops.aten.rsqrt.default], ops.after[torch.ops.aten.rsqrt.default]) == (1, 0)
    assert (ops.before[torch.ops.kda.gated_norm_merge], ops.after[torch.ops.kda.gated_norm_merge]) == (0, 1)
    assert ops.changed()["kda.gated_norm_merge.default"] == (0, 1)
    assert ops.after["aten.rsqrt.default"] == 0 and ops.before["aten.rsqrt.default"] == 1
    with fresh_compile(), counting_ops() as seen:  # any compile with the backend, here a plain torch.compile
        with torch.inference_mode():
            torch.compile(gated_norm, backend="kda_inductor", options={"kda": {"force": True}})(*args)
    assert seen == ops


def test_an_op_packet_counts_every_overload():
    counts = OpCounter({"aten.index.Tensor": 2, "aten.index.Tensor_hacked_twin": 1, "aten.index_put.default": 4})
    assert counts[torch.ops.aten.index] == 3 and counts[torch.ops.aten.index.Tensor] == 2
    assert counts[torch.ops.aten.index_put] == 4 and counts[torch.ops.aten.add.Tensor] == 0
