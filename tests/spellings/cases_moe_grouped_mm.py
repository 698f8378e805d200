"""``moe_grouped_mm`` spellings: a MoE layer's experts as grouped GEMMs of the pairs' rows sorted by expert,
as transformers' ``grouped_mm`` experts (``integrations/moe.py``, ``grouped_mm_experts_forward`` /
``_grouped_linear``) and a hand-written port write them, and a near miss. Each function is written in the
style of the code named in its ``source`` (read with the search tools; not copied). On CPU the op is
``torch._grouped_mm`` itself: the matched cases differ from eager only by Inductor's roundings around it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.spellings._corpus import Spelling, gen, randn

T, E, H, I, TOPK = 5, 8, 64, 32, 2
HF = "huggingface/transformers: src/transformers/integrations/moe.py"


def _mm(x, w, offs):
    fn = getattr(F, "grouped_mm", None)
    return fn(x, w, offs=offs) if fn is not None else torch._grouped_mm(x, w, offs=offs)


def hf_grouped_mm_experts(hidden, gate_up, down, top_k_index, top_k_weights, transposed=False):
    """``grouped_mm_experts_forward``: the pairs sorted by expert, ``histc`` counts, int32 ``cumsum`` offsets,
    ``_grouped_linear``'s ``grouped_mm(x, weight.transpose(-2, -1))`` (``is_transposed``: the weight as stored),
    the gated activation, the routing weights, the rows scattered back and summed per token."""
    expert_ids = top_k_index.reshape(-1)
    expert_ids_g, perm = torch.sort(expert_ids)
    x = hidden[perm // TOPK]
    weights_g = top_k_weights.reshape(-1)[perm]
    counts = torch.histc(expert_ids_g.float(), bins=E, min=0, max=E - 1)
    offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    proj = _mm(x, gate_up if transposed else gate_up.transpose(-2, -1), offsets)
    gate, up = proj.chunk(2, dim=-1)
    proj = _mm(F.silu(gate) * up, down if transposed else down.transpose(-2, -1), offsets)
    out = torch.zeros(T * TOPK, H, dtype=proj.dtype).index_add_(0, perm, proj * weights_g[:, None])
    return out.view(T, TOPK, H).sum(dim=1)


def hf_grouped_mm_transposed(hidden, gate_up_t, down_t, top_k_index, top_k_weights):
    return hf_grouped_mm_experts(hidden, gate_up_t, down_t, top_k_index, top_k_weights, transposed=True)


def per_expert_batched(hidden, gate_up, down, top_k_index, top_k_weights):
    """A port that pads every expert to the same rows and runs ``torch._grouped_mm`` of 3-D batches (no
    offsets): a batched GEMM, not this rewrite's form (no miss reported)."""
    x = hidden[None].expand(E, -1, -1).contiguous()
    gate, up = torch._grouped_mm(x, gate_up.transpose(-2, -1)).chunk(2, dim=-1)
    out = torch._grouped_mm(F.silu(gate) * up, down.transpose(-2, -1))  # [E, T, H]
    picked = out.gather(0, top_k_index.T[..., None].expand(-1, -1, H))  # [TOPK, T, H]
    return (picked * top_k_weights.T[..., None]).sum(0)


def _inputs(seed, transposed=False):
    g = gen(seed)
    gate_up, down = randn(g, E, 2 * I, H, scale=0.1), randn(g, E, H, I, scale=0.1)
    if transposed:
        gate_up, down = gate_up.transpose(1, 2).contiguous(), down.transpose(1, 2).contiguous()
    ids = torch.stack([torch.randperm(E, generator=g)[:TOPK] for _ in range(T)])
    return randn(g, T, H), gate_up, down, ids, torch.softmax(torch.randn(T, TOPK, generator=g), -1).bfloat16()


def _close_bf16(got, want):
    from kda_inductor.testing import assert_close_to_eager

    scale = float(want.out.float().abs().max())
    assert_close_to_eager(got.out, want.out, rtol=0.02, atol=4 * torch.finfo(torch.bfloat16).eps * scale)


CASES = [
    Spelling("hf_grouped_mm_experts", HF, hf_grouped_mm_experts, _inputs,
             {"moe_grouped_mm": 2, "moe_routing": 1}, _close_bf16),
    Spelling("hf_grouped_mm_transposed", HF, hf_grouped_mm_transposed, lambda s: _inputs(s, transposed=True),
             {"moe_grouped_mm": 2, "moe_routing": 1}, _close_bf16),
    Spelling("per_expert_batched", "padded per-expert batches", per_expert_batched, _inputs, {}, _close_bf16,
             why="3-D x 3-D grouped GEMMs without offsets: a batch of equal GEMMs, not the sorted pairs' rows"),
]
