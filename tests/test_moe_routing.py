"""moe_routing: transformers' ``grouped_mm`` routing (the (token, expert) pairs sorted by expert id, the
sorted ids counted by ``histc``) with the sort as a rank by comparisons.

Numerics: the rank is the stable sort's exact result for any integer ids; eager's sort is unstable, so
ties may come in another order there. The layers below are what transformers computes from that sort:
each output row depends on its own pair only, so the compiled result equals eager's up to the order of
the top-k sum's terms, which the test layer fixes (its scatter back is by the inverse permutation)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kda_inductor.patterns import moe_routing as rule
from kda_inductor.testing import assert_close_to_eager, compile_for_test, fresh_compile

NAME = "moe_routing"
E, H, TOPK = 8, 16, 2


class Routed(nn.Module):
    """transformers 5.17's ``grouped_mm_experts_forward`` routing with one linear expert a row (a per-row
    ``bmm`` by the sorted ids standing in for the grouped GEMM), the rows put back by the inverse
    permutation; ``spelling`` picks how the sort is written."""

    def __init__(self, spelling="torch.sort", cast=True):
        super().__init__()
        self.spelling, self.cast = spelling, cast
        self.w = nn.Parameter(torch.randn(E, H, H) * 0.2)

    def forward(self, hidden, top_k_index, top_k_weights):
        ids = top_k_index.reshape(-1)
        if self.spelling == "method":
            ids_g, perm = ids.sort()
        elif self.spelling == "stable":
            ids_g, perm = torch.sort(ids, stable=True)
        else:
            ids_g, perm = torch.sort(ids)
        x = hidden[perm // TOPK]
        counts = torch.histc(ids_g.float() if self.cast else ids_g, bins=E, min=0, max=E - 1)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        rows = torch.bmm(self.w[ids_g], x.unsqueeze(-1)).squeeze(-1) * top_k_weights.reshape(-1)[perm, None]
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel())
        return rows[inv].view(-1, TOPK, H).sum(1), offsets


def _inputs(tokens, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:TOPK] for _ in range(tokens)])
    return (torch.randn(tokens, H, generator=g), ids, torch.softmax(torch.randn(tokens, TOPK, generator=g), -1))


@pytest.mark.parametrize("spelling", ["torch.sort", "method", "stable"])
def test_the_routing_sort_becomes_the_rank(spelling):
    torch.manual_seed(0)
    module = Routed(spelling).eval()
    with torch.no_grad(), fresh_compile():
        c = compile_for_test(module)
        for tokens, seed in ((12, 1), (12, 2)):  # fresh inputs: the same compile
            got, want = c(*_inputs(tokens, seed)), module(*_inputs(tokens, seed))
            assert torch.equal(got[1], want[1])  # the offsets: bit-exact
            assert_close_to_eager(got[0], want[0])
    assert c.matches[NAME] == 1


def test_ranked_sort_is_the_stable_sort_for_any_ids():
    """Negative ids, sentinels past the experts, repeats: the stable sort's values and permutation."""
    g = torch.Generator().manual_seed(0)
    for ids in (torch.randint(-3, 12, (57,), generator=g), torch.zeros(9, dtype=torch.long),
                torch.arange(20).flip(0), torch.randint(0, 4, (33,), generator=g).int()):
        values, perm = rule.ranked_sort(ids)
        want = torch.sort(ids, stable=True)
        assert torch.equal(values, want.values) and torch.equal(perm, want.indices)


class Plain(nn.Module):
    """Sorts that are not a MoE routing, or not one the rank takes."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, ids, scores):
        if self.kind == "no_count":  # sorted ids nobody counts
            return torch.sort(ids)[0] * 2
        if self.kind == "descending":
            v, i = torch.sort(ids, descending=True)
            return torch.histc(v.float(), bins=E, min=0, max=E - 1), i
        if self.kind == "floats":
            v, i = torch.sort(scores)
            return torch.histc(v, bins=E, min=0, max=E - 1), i
        v, i = torch.sort(ids.view(-1, 4), dim=-1)  # "2d"
        return torch.histc(v.float(), bins=E, min=0, max=E - 1), i


@pytest.mark.parametrize("kind", ["no_count", "descending", "floats", "2d"])
def test_what_must_not_match(kind):
    g = torch.Generator().manual_seed(3)
    args = (torch.randint(0, E, (24,), generator=g), torch.rand(24, generator=g) * E)
    with torch.no_grad(), fresh_compile():
        c = compile_for_test(Plain(kind))
        got, want = c(*args), Plain(kind)(*args)
    assert c.matches.get(NAME, 0) == 0
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert torch.equal(a, b)
    misses = [m for r in c.records for m in r.misses.get(NAME, [])]
    assert bool(misses) == (kind in ("descending", "floats", "2d"))


def test_a_symbolic_pair_count_keeps_the_sort():
    module = Routed().eval()
    with torch.no_grad(), fresh_compile():
        c = compile_for_test(module, dynamic=True)
        for tokens in (12, 13):
            got, want = c(*_inputs(tokens, tokens)), module(*_inputs(tokens, tokens))
            assert_close_to_eager(got[0], want[0])
    misses = [m for r in c.records for m in r.misses.get(NAME, [])]
    assert c.matches.get(NAME, 0) == 0 and any("O(S^2)" in str(m) for m in misses), misses


def test_off_unless_forced():
    """Not measured on CPU: a user's compile leaves the sort to Inductor, saying why."""
    module = Routed().eval()
    with torch.no_grad(), fresh_compile():
        c = compile_for_test(module, force=False)
        c(*_inputs(12, 1))
    misses = [m for r in c.records for m in r.misses.get(NAME, [])]
    assert c.matches.get(NAME, 0) == 0 and any("24 pairs" in str(m) and "at no size" in str(m) for m in misses), misses


@pytest.mark.parametrize("span, fires", [((24, 24), True), ((25, 1280), False), ((1, 23), False)])
def test_speed_rule_holds_in_the_measured_pair_range(monkeypatch, span, fires):
    """The rule fires at pair counts inside the device's measured range (ends included), not outside."""
    import kda_inductor.patterns.moe_routing as pattern

    monkeypatch.setitem(pattern.MEASURED, "cpu", span)
    module = Routed().eval()
    with torch.no_grad(), fresh_compile():
        c = compile_for_test(module, force=False)
        c(*_inputs(12, 1))
    assert c.matches.get(NAME, 0) == int(fires)
    if not fires:
        misses = [str(m) for r in c.records for m in r.misses.get(NAME, [])]
        assert any(f"{span[0]}-{span[1]} pairs" in m for m in misses), misses


def test_transformers_grouped_mm_experts():
    """transformers' own ``Qwen3NextExperts`` with ``grouped_mm`` (its CPU fallback GEMM here): one match,
    eager's output within the compile's rounding."""
    modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    from transformers import Qwen3NextConfig

    config = Qwen3NextConfig(hidden_size=64, moe_intermediate_size=32, num_experts=16, num_experts_per_tok=4,
                             num_hidden_layers=1)
    config._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    experts = modeling.Qwen3NextExperts(config).eval()
    for p in experts.parameters():
        nn.init.normal_(p, std=0.1)
    g = torch.Generator().manual_seed(5)
    ids = torch.stack([torch.randperm(16, generator=g)[:4] for _ in range(8)])
    args = (torch.randn(8, 64, generator=g), ids, torch.softmax(torch.randn(8, 4, generator=g), -1))
    with torch.no_grad(), fresh_compile():
        c = compile_for_test(experts)
        assert_close_to_eager(c(*args), experts(*args))
    assert c.matches[NAME] == 1
