"""``moe_grouped_experts`` spellings: a MoE layer's experts as per-(token, expert) weight gathers and
batched matrix-vector products, as transformers' ``batched_mm`` experts (``integrations/moe.py``,
generate()'s decoding path) and hand-written ports write them, and the near misses. Each function
is written in the style of the code named in its ``source`` (read with the search tools; not
copied). Matched cases compute each row as the gather + bmm does (torch's grouped GEMM on CPU sums
in the same order here: bit-exact); near misses run Inductor's code."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.spellings._corpus import Spelling, close, gen, randn

T, E, H, I, TOPK = 5, 8, 64, 32, 2
ONE_LAYER = {"moe_grouped_experts": 1, "moe_grouped_mm": 2}
"""One layer's experts: one routing, its two projections' grouped GEMMs then ``moe_grouped_mm``'s (forced)."""
HF = "huggingface/transformers: src/transformers/integrations/moe.py"


def _routing(g):
    ids = torch.stack([torch.randperm(E, generator=g)[:TOPK] for _ in range(T)])
    return ids, torch.softmax(torch.randn(T, TOPK, generator=g), -1).bfloat16()


def hf_batched_mm_experts(hidden, gate_up, down, top_k_index, top_k_weights):
    """``batched_mm_experts_forward`` of a gated MoE (Qwen3-Next, Kimi Linear, DeepSeek-V3.2 experts):
    tokens repeated per selected expert, ``gate_up_proj[expert_ids]`` / ``down_proj[expert_ids]`` with
    ``_batched_linear``'s ``bmm(weight, input.unsqueeze(-1))``, routing weights, a reshape + sum."""
    topk = top_k_index.size(-1)
    selected = hidden.repeat_interleave(topk, dim=0)
    expert_ids = top_k_index.reshape(-1)
    proj = torch.bmm(gate_up[expert_ids], selected.unsqueeze(-1)).squeeze(-1)
    gate, up = proj.chunk(2, dim=-1)
    proj = F.silu(gate) * up
    proj = torch.bmm(down[expert_ids], proj.unsqueeze(-1)).squeeze(-1)
    weighted = proj * top_k_weights.reshape(-1).unsqueeze(-1)
    return weighted.view(hidden.size(0), topk, hidden.size(-1)).sum(dim=1).to(hidden.dtype)


def hf_batched_mm_transposed(hidden, gate_up_t, down_t, top_k_index, top_k_weights):
    """The same with ``is_transposed`` experts (weights ``[E, in, out]``, as gpt-oss stores them):
    ``bmm(input.unsqueeze(1), weight).squeeze(1)``."""
    topk = top_k_index.size(-1)
    selected = hidden.repeat_interleave(topk, dim=0)
    expert_ids = top_k_index.reshape(-1)
    proj = torch.bmm(selected.unsqueeze(1), gate_up_t[expert_ids]).squeeze(1)
    gate, up = proj.chunk(2, dim=-1)
    proj = torch.bmm((F.silu(gate) * up).unsqueeze(1), down_t[expert_ids]).squeeze(1)
    return (proj * top_k_weights.reshape(-1, 1)).view(hidden.size(0), topk, -1).sum(dim=1)


def einsum_experts(hidden, gate_up, down, top_k_index, top_k_weights):
    """A port written with einsum over the gathered experts (``"snk,sk->sn"``)."""
    ids = top_k_index.reshape(-1)
    x = hidden[:, None].expand(-1, TOPK, -1).reshape(-1, hidden.size(-1))
    gate, up = torch.einsum("snk,sk->sn", gate_up[ids], x).chunk(2, dim=-1)
    out = torch.einsum("snk,sk->sn", down[ids], F.silu(gate) * up)
    return (out.view(-1, TOPK, out.size(-1)) * top_k_weights[..., None]).sum(1)


def broadcast_experts(hidden, gate_up, down, top_k_index, top_k_weights):
    """The products as broadcast multiply + sum: no bmm (Inductor fuses the gathers into its reductions)."""
    ids = top_k_index.reshape(-1)
    x = hidden.repeat_interleave(TOPK, dim=0)
    gate, up = (gate_up[ids] * x[:, None]).sum(-1).chunk(2, dim=-1)
    out = (down[ids] * (F.silu(gate) * up)[:, None]).sum(-1)
    return (out.view(-1, TOPK, out.size(-1)) * top_k_weights[..., None]).sum(1)


def _inputs(seed, transposed=False, dtype=torch.bfloat16):
    g = gen(seed)
    gate_up, down = randn(g, E, 2 * I, H, scale=0.1), randn(g, E, H, I, scale=0.1)
    if transposed:
        gate_up, down = gate_up.transpose(1, 2).contiguous(), down.transpose(1, 2).contiguous()
    hidden = randn(g, T, H)
    ids, weights = _routing(g)
    cast = (lambda t: t.to(dtype))
    return cast(hidden), cast(gate_up), cast(down), ids, cast(weights)


def _close_bf16(got, want):
    from kda_inductor.testing import assert_close_to_eager

    scale = float(want.out.float().abs().max())
    assert_close_to_eager(got.out, want.out, rtol=0.02, atol=4 * torch.finfo(torch.bfloat16).eps * scale)


CASES = [
    Spelling("hf_batched_mm_experts", HF, hf_batched_mm_experts, _inputs, ONE_LAYER, _close_bf16),
    Spelling("hf_batched_mm_transposed", HF, hf_batched_mm_transposed, lambda s: _inputs(s, transposed=True),
             ONE_LAYER, _close_bf16),
    Spelling("einsum_experts", "einsum ports of MoE experts", einsum_experts, _inputs, ONE_LAYER, _close_bf16),
    Spelling("broadcast_experts", "multiply + sum ports", broadcast_experts, _inputs, {"gdn_spec_split": 1},
             _close_bf16, why="no bmm, so not this rewrite's form (Inductor fuses the gathers into its reductions); "
             "the two weight gathers by one index are gdn_spec_split's form: one exact launch for both"),
    Spelling("hf_batched_mm_float32", HF, hf_batched_mm_experts, lambda s: _inputs(s, dtype=torch.float32),
             {"gdn_spec_split": 1}, close(rtol=1e-4, atol=1e-5),
             why="float32 experts: torch's grouped GEMM takes bf16 only (a miss at each bmm); the two weight "
             "gathers by one index then are gdn_spec_split's form: one exact launch for both"),
]
