"""moe_grouped_experts: transformers' ``batched_mm`` experts (every selected expert's weights gathered
per (token, expert) pair, then a batched matrix-vector product) as one grouped GEMM per projection.

Numerics: each output row is one expert's dot products over K in float32, rounded once; on CPU
torch's grouped GEMM and the bmm sum in the same order here, so the rewrite's result is the same
compile's without it, bit for bit (``exact``), and eager's within the compile's own rounding."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kda_inductor.patterns.base import Stage
from kda_inductor.patterns import moe_grouped_experts as rule
from kda_inductor.patterns.moe_grouped_experts import _grouped_mm_refuses
from kda_inductor.testing import assert_close_to_eager, compile_for_test, fresh_compile, op_counts

NAME = "moe_grouped_experts"


def _gemms(counts) -> int:
    """The grouped GEMMs after our pass: torch's, or ``moe_grouped_mm``'s op where that later rewrite
    (forced here) took them."""
    return counts.after["aten._grouped_mm.default"] + counts.after["kda.moe_grouped_mm.default"]


E, H, I, TOPK = 8, 64, 32, 2


def batched_linear(x, weight, is_transposed=False):
    """transformers' ``_batched_linear`` (integrations/moe.py), without the bias."""
    if is_transposed:
        return torch.bmm(x.unsqueeze(1), weight).squeeze(1)
    return torch.bmm(weight, x.unsqueeze(-1)).squeeze(-1)


class Experts(nn.Module):
    """transformers' ``batched_mm_experts_forward`` for a gated MoE (Qwen3-Next's experts), weights
    ``[E, 2I, H]`` / ``[E, H, I]``, or transposed ``[E, H, 2I]`` / ``[E, I, H]``."""

    def __init__(self, transposed=False, leak=False):
        super().__init__()
        self.transposed, self.leak = transposed, leak
        up, down = ((E, H, 2 * I), (E, I, H)) if transposed else ((E, 2 * I, H), (E, H, I))
        self.gate_up_proj = nn.Parameter(torch.randn(up) * 0.1)
        self.down_proj = nn.Parameter(torch.randn(down) * 0.1)

    def forward(self, hidden, top_k_index, top_k_weights):
        tokens, topk = hidden.shape[0], top_k_index.shape[-1]
        x = hidden.repeat_interleave(topk, dim=0)
        ids = top_k_index.reshape(-1)
        up_w = self.gate_up_proj[ids]
        gate, up = batched_linear(x, up_w, self.transposed).chunk(2, dim=-1)
        h = nn.functional.silu(gate) * up
        out = batched_linear(h, self.down_proj[ids], self.transposed)
        out = (out * top_k_weights.reshape(-1, 1)).view(tokens, topk, -1).sum(dim=1)
        return (out, up_w.sum()) if self.leak else out


def routing(tokens=5, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, H, generator=g).to(dtype)
    ids = torch.stack([torch.randperm(E, generator=g)[:TOPK] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, TOPK, generator=g), -1).to(dtype)
    return hidden, ids, weights


def _run(module, args, **kw):
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(module, **kw)
        return c(*args), module(*args), c


def _misses(c):
    return [m for r in c.records for m in r.misses.get(NAME, [])]


@pytest.mark.parametrize("transposed", [False, True], ids=["weights_first", "is_transposed"])
def test_both_projections_become_grouped_gemms(transposed):
    torch.manual_seed(0)
    module = Experts(transposed).to(torch.bfloat16).eval()
    args = routing()
    got, want, c = _run(module, args)
    assert c.matches[NAME] == 1  # one match an ids tensor: the up and the down projection
    counts = op_counts(c)
    assert counts.before["aten.bmm.default"] == 2 and counts.after["aten.bmm.default"] == 0
    assert _gemms(counts) == 2 and counts.after["aten.sort.stable"] == 1
    assert counts.before["aten.index.Tensor"] == 2 and counts.after["aten.index.Tensor"] == 0
    assert_close_to_eager(got, want)
    off, _, _ = _run(module, args, options={"kda": {"disable": [NAME]}})
    assert_close_to_eager(got, off, exact=True)


_W = torch.randn(E, 2 * I, H).bfloat16()
SPELLINGS = {
    "einsum": lambda x, ids: torch.einsum("snk,sk->sn", _W[ids], x),
    "matmul": lambda x, ids: (_W[ids] @ x.unsqueeze(-1)).squeeze(-1),  # an expand to its own shape
    "matmul, transposed": lambda x, ids: torch.matmul(x.unsqueeze(1), _W[ids].transpose(1, 2)).squeeze(1),
    "index_select": lambda x, ids: torch.bmm(_W.index_select(0, ids), x.unsqueeze(-1)).squeeze(-1),
    "transposed weights, transposed read": lambda x, ids: torch.bmm(
        _W.transpose(1, 2).contiguous()[ids].transpose(1, 2), x.unsqueeze(-1)).squeeze(-1),
}


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_spellings(name):
    """Other ways to write the per-pair product: each one grouped GEMM, the same bits as without it."""
    f, x, ids = SPELLINGS[name], torch.randn(6, H).bfloat16(), torch.randint(0, E, (6,))
    got, want, c = _run(f, (x, ids))
    assert c.matches[NAME] == 1 and _gemms(op_counts(c)) == 1
    off, _, _ = _run(f, (x, ids), options={"kda": {"disable": [NAME]}})
    assert_close_to_eager(got, off, exact=True)
    assert_close_to_eager(got, want)


def test_a_broadcast_reduction_is_not_read():
    """``(W[ids] * x[:, None]).sum(-1)``: no bmm in the graph (Inductor fuses the gather into its
    reduction, no copy): not this rewrite's form, and no miss."""
    f, x, ids = (lambda x, ids: (_W[ids] * x[:, None]).sum(-1)), torch.randn(6, H).bfloat16(), torch.randint(0, E, (6,))
    got, want, c = _run(f, (x, ids))
    assert c.matches[NAME] == 0 and not _misses(c)
    assert_close_to_eager(got, want, rtol=0.02, atol=0.1)


def test_transformers_qwen3_next_experts():
    """transformers' own module (its ``batched_mm`` experts, as ``generate()`` switches them)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextSparseMoeBlock

    cfg = transformers.Qwen3NextConfig(hidden_size=H, moe_intermediate_size=I, shared_expert_intermediate_size=I,
                                       num_experts=E, num_experts_per_tok=TOPK)
    cfg._experts_implementation = "batched_mm"
    torch.manual_seed(0)
    block = Qwen3NextSparseMoeBlock(cfg).to(torch.bfloat16).eval()
    for p in block.parameters():
        nn.init.normal_(p, std=0.1)
    x = torch.randn(3, 2, H, dtype=torch.bfloat16)
    got, want, c = _run(block, (x,))
    assert c.matches == {**dict.fromkeys(c.matches, 0), NAME: 1, "moe_grouped_mm": 2}  # the latter's: forced
    assert _gemms(op_counts(c)) == 2
    assert_close_to_eager(got, want)
    assert not [m for r in c.records for ms in r.misses.values() for m in ms if m.shown]


def test_negative_ids_read_as_the_gather_does():
    torch.manual_seed(0)
    module = Experts().to(torch.bfloat16).eval()
    hidden, ids, weights = routing(seed=1)
    ids = torch.where(ids % 2 == 0, ids - E, ids)  # -E..-1 read experts 0..E-1
    assert (ids < 0).any()
    got, want, c = _run(module, (hidden, ids, weights))
    assert c.matches[NAME] == 1
    assert_close_to_eager(got, want)


def test_an_expert_id_out_of_range_fails_loudly():
    torch.manual_seed(0)
    module = Experts().to(torch.bfloat16).eval()
    hidden, ids, weights = routing(seed=2)
    ids[1, 0] = E
    with pytest.raises(IndexError):
        module(hidden, ids, weights)
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(module)
        with pytest.raises(RuntimeError, match="expert id outside"):
            c(hidden, ids, weights)
    assert c.matches[NAME] == 1


def test_an_out_of_range_pair_is_nan_where_the_assert_does_not_trap():
    """The replacement's own arithmetic: a pair whose id lies outside ``[-E, E)`` comes out NaN (on CUDA
    Inductor's assert did not trap on an H100), the other pairs as the gather + bmm give them."""
    torch.manual_seed(0)
    w, x = torch.randn(E, 2 * I, H).bfloat16(), torch.randn(6, H, 1).bfloat16()
    ids = torch.tensor([3, 0, 7, 1, 3, 5])
    perm, offs, valid = rule.routing(ids, E)
    bad = valid.clone()
    bad[2] = False  # as if ids[2] were out of range (eager's assert passed: the ids are in range)
    got = rule.project(x, w, perm, offs, bad, True)
    want = torch.bmm(w[ids], x)
    assert torch.isnan(got[2]).all() and not torch.isnan(got[bad]).any()
    assert_close_to_eager(got[bad], want[bad], exact=True)
    with pytest.raises(RuntimeError, match="expert id outside"):
        rule.routing(torch.tensor([0, E]), E)


@pytest.mark.parametrize("experts", [16, 512])
def test_ranked_routing_is_the_stable_sort(experts):
    """At the pair counts of ``RANKED_PAIRS`` the routing ranks the pairs by a cumulative count: the same
    permutation and offsets as the stable sort (ties in pair order), negative ids read as ``id + E``; an id
    outside ``[-E, E)`` goes after the last offset and its pair is not valid."""
    g = torch.Generator().manual_seed(experts)
    ids = torch.randint(-experts, experts, (rule.RANKED_PAIRS[0],), generator=g)
    perm, offs, valid = rule.routing(ids, experts)
    normal = torch.where(ids < 0, ids + experts, ids)
    order, want = torch.sort(normal, stable=True)
    assert torch.equal(perm, want) and valid.all()
    assert torch.equal(offs, torch.searchsorted(order, torch.arange(experts), right=True, out_int32=True))
    bad = ids.clone()
    bad[[3, 100]] = torch.tensor([experts + 5, -experts - 1])
    bad = torch.where(bad < 0, bad + experts, bad)
    place, offs_bad = rule.ranked(bad, experts)
    inside = torch.ones_like(ids, dtype=torch.bool)
    inside[[3, 100]] = False
    assert torch.equal(place[offs_bad[-1]:], torch.tensor([3, 100]))  # after the last offset, in pair order
    assert torch.equal(place[:offs_bad[-1]], torch.arange(len(ids))[inside][torch.sort(bad[inside], stable=True).indices])
    assert torch.equal(torch.sort(place).values, torch.arange(len(ids)))  # a permutation


def test_a_step_at_a_ranked_pair_count_matches_eager(monkeypatch):
    """A compiled layer whose pair count lies in ``RANKED_PAIRS`` (160 tokens x top-2 = 320 pairs): one
    match, routed by the count (not the sort), the grouped GEMM's rows as the gather + bmm give them."""
    torch.manual_seed(0)
    module = Experts().to(torch.bfloat16).eval()
    args = routing(tokens=rule.RANKED_PAIRS[0] // TOPK, seed=4)
    calls = []
    monkeypatch.setattr(rule, "ranked", lambda *a, _f=rule.ranked: calls.append(1) or _f(*a))
    got, want, c = _run(module, args)
    assert c.matches[NAME] == 1 and calls
    assert_close_to_eager(got, want)


def test_tokens_dynamic():
    """The pairs' count S symbolic (a dynamic batch): the match holds, each size checked."""
    torch.manual_seed(0)
    module = Experts().to(torch.bfloat16).eval()
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(module, dynamic=True)
        for tokens in (5, 9):
            args = routing(tokens, seed=tokens)
            assert_close_to_eager(c(*args), module(*args))
    assert c.matches[NAME] == 1


def test_float32_is_left_to_inductor():
    """torch's grouped GEMM takes bf16 only: float32 experts stay gather + bmm, with the reason."""
    torch.manual_seed(0)
    module = Experts().eval()
    got, want, c = _run(module, routing(dtype=torch.float32))
    assert c.matches[NAME] == 0
    misses = _misses(c)
    assert len(misses) == 2 and all(m.stage == Stage.LAYOUT and "bf16 only" in m.check for m in misses)
    assert_close_to_eager(got, want)


def test_a_gather_read_elsewhere_stays():
    torch.manual_seed(0)
    module = Experts(leak=True).to(torch.bfloat16).eval()
    got, want, c = _run(module, routing())
    assert c.matches[NAME] == 1  # the down projection alone
    [miss] = _misses(c)
    assert miss.stage == Stage.REGION and "read elsewhere" in miss.check
    assert miss.location and "test_moe_grouped_experts.py" in miss.location
    assert_close_to_eager(got, want)


def test_a_batched_gemm_of_gathered_weights_is_not_a_projection():
    """``bmm(W[ids], X)`` with X ``[S, K, 2]``: two vectors a pair, not the experts' form: a miss."""
    w = torch.randn(E, 2 * I, H)

    def f(x, ids):
        return torch.bmm(w[ids], x)

    x, ids = torch.randn(6, H, 2), torch.randint(0, E, (6,))
    got, want, c = _run(f, (x, ids))
    assert c.matches[NAME] == 0
    [miss] = _misses(c)
    assert miss.stage == Stage.FORM and "not one vector a pair" in miss.check
    assert_close_to_eager(got, want)


def test_a_plain_bmm_is_not_a_candidate():
    def f(a, b):
        return torch.bmm(a, b)

    got, want, c = _run(f, (torch.randn(4, 8, 16), torch.randn(4, 16, 1)))
    assert c.matches[NAME] == 0 and not _misses(c)
    assert_close_to_eager(got, want)


def test_unforced_on_cpu_is_a_speed_rule_miss():
    torch.manual_seed(0)
    module = Experts().to(torch.bfloat16).eval()
    got, want, c = _run(module, routing(), force=False)
    assert c.matches[NAME] == 0
    [miss] = _misses(c)
    assert miss.stage == Stage.SPEED_RULE and "forced only" in miss.check
    assert_close_to_eager(got, want)


class _Meta:
    """A tensor's metadata as ``_grouped_mm_refuses`` reads it (CUDA, without a GPU)."""

    def __init__(self, shape, dtype, device="cuda"):
        self.shape, self.dtype, self.device = shape, dtype, torch.device(device)

    def element_size(self):
        return torch.empty((), dtype=self.dtype).element_size()


@pytest.mark.parametrize("shape,dtype,want", [
    ((8, 64, 32), torch.bfloat16, None),
    ((8, 64, 32), torch.float16, "bf16 only"),
    ((8, 64, 32), torch.float32, "bf16 only"),
    ((8, 64, 36), torch.bfloat16, "16-byte aligned"),
])
def test_what_cuda_grouped_gemm_takes(shape, dtype, want):
    why = _grouped_mm_refuses(_Meta(shape, dtype), _Meta((5, 32, 1), dtype))
    assert (why is None) if want is None else (want in why)
    assert "differ in dtype" in _grouped_mm_refuses(_Meta(shape, torch.bfloat16), _Meta((5, 32, 1), torch.float32))
