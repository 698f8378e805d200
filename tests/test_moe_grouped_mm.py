"""moe_grouped_mm: a MoE layer's ``torch._grouped_mm`` / ``F.grouped_mm`` as ``kda::moe_grouped_mm``.

On CPU the op is ``torch._grouped_mm`` itself: the compiled result equals eager's bit for bit on the
rows the groups cover (rows past the last offset are unwritten by both: not compared). The kernel's own
numerics: ``tests/test_lowering_moe_grouped_mm.py`` (interpreter) and ``test_moe_grouped_mm_cuda.py``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kda_inductor.testing import assert_close_to_eager, compile_for_test, fresh_compile, op_counts

NAME = "moe_grouped_mm"
E, H, I, TOPK = 8, 32, 16, 2
pytestmark = pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="no torch._grouped_mm in this torch")


def _grouped(x, w, offs):
    fn = getattr(F, "grouped_mm", None)
    return fn(x, w, offs=offs) if fn is not None else torch._grouped_mm(x, w, offs=offs)


class Experts(nn.Module):
    """transformers 5.17's ``grouped_mm_experts_forward`` in short: the pairs sorted by expert, offsets by
    ``histc`` + ``cumsum``, the gate-up and down projections as grouped GEMMs of ``[E, N, K]`` weights
    transposed (``transposed=False``: stored ``[E, K, N]``, the ``is_transposed`` experts)."""

    def __init__(self, transposed=True):
        super().__init__()
        self.transposed = transposed
        up, down = torch.randn(E, 2 * I, H) * 0.2, torch.randn(E, H, I) * 0.2
        if not transposed:
            up, down = up.transpose(1, 2).contiguous(), down.transpose(1, 2).contiguous()
        self.gate_up, self.down = nn.Parameter(up.bfloat16()), nn.Parameter(down.bfloat16())

    def _w(self, w):
        return w.transpose(-2, -1) if self.transposed else w

    def forward(self, hidden, top_k_index, top_k_weights):
        ids = top_k_index.reshape(-1)
        ids_g, perm = torch.sort(ids, stable=True)
        x = hidden[perm // TOPK]
        offs = torch.cumsum(torch.histc(ids_g.float(), bins=E, min=0, max=E - 1), 0, dtype=torch.int32)
        gate, up = _grouped(x, self._w(self.gate_up), offs).chunk(2, dim=-1)
        out = _grouped(F.silu(gate) * up, self._w(self.down), offs) * top_k_weights.reshape(-1)[perm, None]
        back = torch.empty_like(out).index_put((perm,), out)
        return back.view(-1, TOPK, H).sum(1)


def _inputs(tokens, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:TOPK] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, TOPK, generator=g), -1).bfloat16()
    return torch.randn(tokens, H, generator=g).bfloat16(), ids, weights


@pytest.mark.parametrize("transposed", [True, False], ids=["view", "stored"])
def test_both_projections_become_the_op(transposed):
    torch.manual_seed(0)
    module = Experts(transposed).eval()
    with torch.no_grad(), fresh_compile():
        c = compile_for_test(module)
        without = compile_for_test(module, options={"kda": {"disable": [NAME]}})
        for tokens, seed in ((6, 1), (6, 2)):  # fresh inputs: the same compile
            got = c(*_inputs(tokens, seed))
            assert torch.equal(got, without(*_inputs(tokens, seed)))  # the op is torch's kernel on CPU
            assert_close_to_eager(got, module(*_inputs(tokens, seed)))  # Inductor's own roundings around it
    assert c.matches[NAME] == 2 and without.matches.get(NAME, 0) == 0
    counts = op_counts(c)
    assert counts.after["kda.moe_grouped_mm.default"] == 2 and counts.before["aten._grouped_mm.default"] == 2
    assert counts.after["aten._grouped_mm.default"] == 0


def test_a_batched_grouped_mm_is_left_without_a_miss():
    """3-D x 3-D (no offsets): a batch of GEMMs, not a MoE layer's forward: left, nothing reported."""
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(2, 6, 16, generator=g).bfloat16(), torch.randn(2, 16, 8, generator=g).bfloat16()
    fn = torch._grouped_mm
    with torch.no_grad(), fresh_compile():
        c = compile_for_test(lambda a, b: fn(a, b) * 2)
        assert torch.equal(c(x, w), fn(x, w) * 2)
    assert c.matches.get(NAME, 0) == 0 and not [m for r in c.records for m in r.misses.get(NAME, [])]


def _graph(**kwargs):
    """A post-grad graph of one ``aten._grouped_mm`` with ``kwargs`` (bias, out_dtype), its values on the
    meta device (this torch's CPU kernel refuses a bias and another output dtype: no compiled graph has
    them here; CUDA's accepts them)."""
    import torch.fx as fx

    graph = fx.Graph()
    vals = {"x": torch.empty(12, 16, dtype=torch.bfloat16), "w": torch.empty(3, 16, 8, dtype=torch.bfloat16),
            "offs": torch.empty(3, dtype=torch.int32), "bias": torch.empty(3, 8, dtype=torch.bfloat16)}
    nodes = {}
    for name, v in vals.items():
        nodes[name] = graph.placeholder(name)
        nodes[name].meta["val"] = v.to("meta")
    kw = {k: (nodes[k] if k == "bias" else v) for k, v in kwargs.items()}
    mm = graph.call_function(torch.ops.aten._grouped_mm.default, (nodes["x"], nodes["w"], nodes["offs"]), kw)
    mm.meta["val"] = torch.empty(12, 8, dtype=kwargs.get("out_dtype", torch.bfloat16), device="meta")
    graph.output(mm)
    return graph


@pytest.mark.parametrize("kwargs, says", [({"bias": True}, "a bias"), ({"out_dtype": torch.float32}, "output dtype"),
                                          ({}, None)], ids=["bias", "out_dtype", "plain"])
def test_a_bias_or_another_output_dtype_is_a_miss(kwargs, says):
    from kda_inductor.patterns.moe_grouped_mm import MoeGroupedMm

    rule = MoeGroupedMm()
    found = rule.find(_graph(**kwargs))
    assert len(found) == (0 if says else 1)
    assert [says in m.check for m in rule.misses] == ([True] if says else [])


def test_off_unless_forced():
    """Not measured: a user's compile leaves the grouped GEMM to torch's kernel, saying why."""
    module = Experts().eval()
    with torch.no_grad(), fresh_compile():
        c = compile_for_test(module, force=False)
        c(*_inputs(6, 1))
    misses = [str(m) for r in c.records for m in r.misses.get(NAME, [])]
    assert c.matches.get(NAME, 0) == 0 and any("12 pairs on cpu" in m and "no size yet" in m for m in misses), misses


@pytest.mark.parametrize("span, fires", [((12, 12), True), ((13, 1280), False)])
def test_speed_rule_holds_in_the_measured_pair_range(monkeypatch, span, fires):
    import kda_inductor.patterns.moe_grouped_mm as pattern

    monkeypatch.setitem(pattern.MEASURED, "cpu", span)
    module = Experts().eval()
    with torch.no_grad(), fresh_compile():
        c = compile_for_test(module, force=False)
        c(*_inputs(6, 1))
    assert c.matches.get(NAME, 0) == (2 if fires else 0)
