"""``gdn_recurrent_step`` spellings: the gated delta rule's recurrence over a few tokens as
transformers (Qwen3-Next / Qwen3.5 / OLMo-hybrid's ``torch_recurrent_gated_delta_rule``, Kimi /
Bailing's ``recurrent_kimi_delta_attention``), FLA (``recurrent_gated_delta_rule_ref`` of its
tests, ``naive_recurrent_kda``) and vLLM's CPU path write it, other equivalent spellings (einsum,
matmul, a zeros start, a prologue the op cannot take), and the near misses. Each function is
written in the style of the file named in its ``source`` (read with the search tools; not
copied). Outputs and states are compared with eager within float32 rounding (the op's CPU loop
sums as eager does; einsum's bmm in another order); near misses run Inductor's own code."""

from __future__ import annotations

import torch

from kda_inductor.testing import assert_close_to_eager
from tests.spellings._corpus import Spelling, close, gen, randn

B, HK, HV, D = 2, 2, 4, 8
STEP = {"gdn_recurrent_step": 1}
HF = "huggingface/transformers: src/transformers/models/"
FLA_REF = "fla-org/flash-linear-attention: tests/ops/test_gated_delta.py (recurrent_gated_delta_rule_ref)"
FLA_KDA = "fla-org/flash-linear-attention: fla/ops/kda/naive.py"
VLLM_CPU = "vllm-project/vllm: vllm/model_executor/layers/mamba/ops/cpu/recurrent_gated_delta_rule.py"
BF = torch.bfloat16


def _flat(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def fp32_close(got, want) -> None:
    """Outputs and the written state within float32 rounding of eager (bf16 outputs: one step)."""
    assert_close_to_eager(_flat(got.out), _flat(want.out))
    assert_close_to_eager(got.args, want.args)


INDUCTOR = close(rtol=0.02, atol=0.02)  # near misses and bf16 prologues: stock Inductor's own rounding


def _state_close(got, want) -> None:
    INDUCTOR(got, want)
    assert_close_to_eager(got.args, want.args, rtol=0.02, atol=0.02)


_CORES: dict[tuple[str, str], object] = {}


def _core(module: str, name: str):
    """transformers' torch reference core itself (not fla's kernel, where fla-core is installed),
    looked up once, eagerly: a compiled case's trace reads it from ``_CORES`` (no import, no
    ``inspect`` in the traced code); a case runs eagerly before it compiles (``check_case``, the
    CUDA-graph test)."""
    if (module, name) not in _CORES:
        from tests.test_gdn_recurrent_step import torch_core

        _CORES[module, name] = torch_core(module, name)
    return _CORES[module, name]


def inputs(T, *, hk=HK, kda=False, head_major=False, state_dtype=torch.float32):
    """``seed -> [q, k, v, g, beta, state]``: bf16 q / k / v / beta, float32 log-space g, a random
    (never zero) state."""

    def make(seed):
        g = gen(seed)
        xs = [randn(g, B, T, hk, D), randn(g, B, T, hk, D), randn(g, B, T, HV, D),
              -torch.rand(B, T, HV, *((D,) if kda else ()), generator=g), torch.rand(B, T, HV, generator=g).to(BF)]
        if head_major:
            xs = [x.transpose(1, 2).contiguous() for x in xs]
        return [*xs, randn(g, B, HV, D, D, dtype=state_dtype, scale=0.5)]

    return make


# --------------------------------------------------------------------------- transformers


def hf_qwen3_next_decode(q, k, v, g, beta, cache):
    """The layer's decode: ``torch_recurrent_gated_delta_rule`` continuing the cache, then
    ``update_recurrent_state``'s ``copy_``."""
    out, new = _core("qwen3_next", "torch_recurrent_gated_delta_rule")(
        q, k, v, g=g, beta=beta, initial_state=cache, output_final_state=True, use_qk_l2norm_in_kernel=True)
    cache.copy_(new)
    return out


def hf_qwen3_next_5_17_decode(q, k, v, g, beta, cache):
    """transformers 5.17's layer (the GPU machine's): the GQA repeat in the layer, before its core
    (whose loop then sees as many q / k heads as v heads)."""
    rep = v.shape[2] // q.shape[2]
    q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
    return hf_qwen3_next_decode(q, k, v, g, beta, cache)


def hf_kimi_decode(q, k, v, g, beta, cache):
    out, new = _core("kimi_linear", "recurrent_kimi_delta_attention")(
        q, k, v, g=g, beta=beta, initial_state=cache, output_final_state=True, use_qk_l2norm_in_kernel=True)
    cache.copy_(new)
    return out


def hf_kimi_verify_returned(q, k, v, g, beta, state):
    return _core("kimi_linear", "recurrent_kimi_delta_attention")(
        q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True)


# --------------------------------------------------------------------------- references


def fla_recurrent_ref(q, k, v, beta, g, h):
    """Head-major after ``transpose(1, 2).contiguous().float()``, ``h.clone()`` every line, an
    einsum output, the state returned."""
    q, k, v, beta, g = (x.transpose(1, 2).contiguous().to(torch.float32) for x in (q, k, v, beta, g))
    o = torch.zeros(*v.shape).to(v)
    q = q * (1 / (q.shape[-1] ** 0.5))
    for i in range(q.shape[2]):
        b_q, b_k, b_v = q[:, :, i], k[:, :, i], v[:, :, i].clone()
        h = h.clone() * g[:, :, i].exp()[..., None, None]
        b_v = b_v - (h.clone() * b_k[..., None]).sum(-2)
        b_v = b_v * beta[:, :, i][..., None]
        h = h.clone() + b_k.unsqueeze(-1) * b_v.unsqueeze(-2)
        o[:, :, i] = torch.einsum("bhd,bhdm->bhm", b_q, h)
    return o.transpose(1, 2).to(BF), h


def fla_naive_recurrent_kda(q, k, v, g, beta, initial_state):
    """GQA by ``repeat_interleave`` with the scale, zeros plus the state, beta times k in an einsum
    outer product, an einsum output."""
    G = v.shape[2] // q.shape[2]
    q, k, v, g, beta = (x.to(torch.float) for x in (q, k, v, g, beta))
    q = q.repeat_interleave(G, dim=2) * q.shape[-1] ** -0.5
    k = k.repeat_interleave(G, dim=2)
    S = q.new_zeros(*initial_state.shape)
    S += initial_state
    o = torch.zeros_like(v)
    for i in range(q.shape[1]):
        q_i, k_i, v_i, g_i, b_i = q[:, i], k[:, i], v[:, i], g[:, i], beta[:, i]
        S = S * g_i[..., None].exp()
        S = S + torch.einsum("b h k, b h v -> b h k v", b_i[..., None] * k_i, v_i - (k_i[..., None] * S).sum(-2))
        o[:, i] = torch.einsum("b h k, b h k v -> b h v", q_i, S)
    return o.to(BF), S


def vllm_cpu_recurrent(query, key, value, g, beta, initial_state):
    """vLLM's CPU reference: the l2norm in the input's dtype before the GQA repeat (Inductor keeps
    it; the op reads its result), the state ``[B, H, V, K]`` (read as a transposed view)."""
    initial_dtype = query.dtype
    query, key = (x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6) for x in (query, key))
    rep = value.shape[2] // query.shape[2]
    query, key = query.repeat_interleave(rep, dim=2), key.repeat_interleave(rep, dim=2)
    query, key, value, beta, g = (x.transpose(1, 2).contiguous().to(torch.float32) for x in (query, key, value, beta, g))
    query = query * (1 / (query.shape[-1] ** 0.5))
    out = value.new_empty(value.shape)
    state = initial_state.to(value)
    for t in range(query.shape[2]):
        q_t, k_t, v_t = query[:, :, t], key[:, :, t], value[:, :, t]
        state = state * g[:, :, t].exp().unsqueeze(-1).unsqueeze(-1)
        delta = (v_t - (state * k_t.unsqueeze(-2)).sum(dim=-1)) * beta[:, :, t].unsqueeze(-1)
        state = state + delta.unsqueeze(-1) * k_t.unsqueeze(-2)
        out[:, :, t] = (state * q_t.unsqueeze(-2)).sum(dim=-1)
    return out.transpose(1, 2).contiguous().to(initial_dtype), state


# --------------------------------------------------------------------------- other spellings


def einsum_head_major(q, k, v, g, beta, cache):
    """Einsum contractions everywhere, head-major inputs, outputs stacked, the cache written."""
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    q, S, outs = q * D ** -0.5, cache, []
    for t in range(q.shape[2]):
        S = S * torch.exp(g[:, :, t])[:, :, None, None]
        kv = torch.einsum("bhk,bhkv->bhv", k[:, :, t], S)
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, :, t], (v[:, :, t] - kv) * beta[:, :, t, None])
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))
    cache.copy_(S)
    return torch.stack(outs, 2).to(BF)


def matmul_zeros_start(q, k, v, g, beta, unused_state):
    """Matmul contractions (``k @ S``) and outer product (``k^T @ delta``: post-grad a product of
    ``[B * H, K, 1]`` and ``[B * H, 1, V]`` reshapes), a zeros start, the state returned."""
    S = q.new_zeros(B, HV, D, D, dtype=torch.float32)
    out = q.new_zeros(B, q.shape[1], HV, D, dtype=torch.float32)
    for t in range(q.shape[1]):
        qt, kt = q[:, t].float() * D ** -0.5, k[:, t].float()
        S = S * g[:, t].exp()[..., None, None]
        kv = (kt.unsqueeze(-2) @ S).squeeze(-2)
        S = S + kt.unsqueeze(-1) @ ((v[:, t].float() - kv) * beta[:, t].float()[..., None]).unsqueeze(-2)
        out[:, t] = (qt.unsqueeze(-2) @ S).squeeze(-2)
    return out.to(BF), S


def _step(S, q, k, v, g, beta, t, scale=D ** -0.5):
    """One token (token-major, float32 inputs): ``(new state, output)``."""
    kt = k[:, t]
    S = S * g[:, t].exp()[..., None, None]
    S = S + kt[..., None] * ((v[:, t] - (S * kt[..., None]).sum(-2)) * beta[:, t][..., None])[..., None, :]
    return S, (S * (q[:, t] * scale)[..., None]).sum(-2)


def _l2(x):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def prologue_variants(q, k, v, g, beta, cache, how):
    """Prologues the op takes only in part: q alone normalized (neither l2norm folded in), a
    ``repeat`` that tiles the heads (not ``repeat_interleave``: the op reads it materialized), the
    scale before the l2norm (the l2norm undoes it: not folded in)."""
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if how == "q_only":
        q = _l2(q)
    elif how == "tiled_heads":
        q, k = q.repeat(1, 1, HV // HK, 1), k.repeat(1, 1, HV // HK, 1)
    else:  # scale_first
        q, k = _l2(q * 0.5), _l2(k)
    S, outs = cache, []
    for t in range(q.shape[1]):
        S, o = _step(S, q, k, v, g, beta, t)
        outs.append(o)
    cache.copy_(S)
    return torch.stack(outs, 1).to(BF)


# --------------------------------------------------------------------------- near misses


def gated_linear_attention(q, k, v, g, beta, cache):
    S = cache * g[:, 0].exp()[..., None, None]
    S = S + k[:, 0].float()[..., None] * v[:, 0].float()[..., None, :]
    cache.copy_(S)
    return (S * q[:, 0].float()[..., None]).sum(-2)


def decay_after_update(q, k, v, g, beta, cache):
    kt = k[:, 0].float()
    delta = (v[:, 0].float() - (cache * kt[..., None]).sum(-2)) * beta[:, 0].float()[..., None]
    S = (cache + kt[..., None] * delta[..., None, :]) * g[:, 0].exp()[..., None, None]
    cache.copy_(S)
    return (S * q[:, 0].float()[..., None]).sum(-2)


def delta_rule_without_decay(q, k, v, g, beta, cache):
    kt = k[:, 0].float()
    delta = (v[:, 0].float() - (cache * kt[..., None]).sum(-2)) * beta[:, 0].float()[..., None]
    S = cache + kt[..., None] * delta[..., None, :]
    cache.copy_(S)
    return (S * q[:, 0].float()[..., None]).sum(-2)


def bf16_cache(q, k, v, g, beta, cache):
    S, o = _step(cache.float(), *(x.float() for x in (q, k, v, g, beta)), 0)
    cache.copy_(S)
    return o


def prefill_tail(q, k, v, g, beta, state):
    """Nine tokens: more than ``MAX_TOKENS``."""
    core = _core("qwen3_next", "torch_recurrent_gated_delta_rule")
    return core(q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True)


def _ordered(fn):
    """FLA's reference takes ``beta`` before ``g``."""
    return lambda q, k, v, g, beta, s: fn(q, k, v, beta, g, s)


CASES = [
    Spelling("hf_qwen3_next_recurrent_decode", HF + "qwen3_next/modeling_qwen3_next.py", hf_qwen3_next_decode,
             inputs(1), STEP, fp32_close, mutated_args=(5,)),
    Spelling("hf_qwen3_next_recurrent_verify4", HF + "qwen3_next/modeling_qwen3_next.py", hf_qwen3_next_decode,
             inputs(4), STEP, fp32_close, mutated_args=(5,)),
    Spelling("hf_qwen3_next_5_17_layer_repeat", HF + "qwen3_next/modeling_qwen3_next.py (5.17)",
             hf_qwen3_next_5_17_decode, inputs(2), STEP, fp32_close, mutated_args=(5,)),
    Spelling("hf_kimi_recurrent_decode", HF + "kimi_linear/modeling_kimi_linear.py", hf_kimi_decode,
             inputs(1, hk=HV, kda=True), STEP, fp32_close, mutated_args=(5,)),
    Spelling("hf_kimi_recurrent_verify3_returned", HF + "kimi_linear/modeling_kimi_linear.py", hf_kimi_verify_returned,
             inputs(3, hk=HV, kda=True), STEP, fp32_close),
    Spelling("fla_recurrent_gated_delta_rule_ref", FLA_REF, _ordered(fla_recurrent_ref), inputs(3, hk=HV), STEP,
             fp32_close),
    Spelling("fla_naive_recurrent_kda_gqa", FLA_KDA, fla_naive_recurrent_kda, inputs(2, kda=True), STEP, fp32_close),
    Spelling("vllm_cpu_recurrent_transposed_state", VLLM_CPU, vllm_cpu_recurrent, inputs(2), STEP, INDUCTOR,
             why="the l2norm in bf16 stays with Inductor (it rounds once, eager per op: as stock does)"),
    Spelling("einsum_head_major_cache", "einsum spellings of " + FLA_REF, einsum_head_major,
             inputs(2, hk=HV, head_major=True), STEP, fp32_close, mutated_args=(5,)),
    Spelling("matmul_zeros_start", "matmul spellings of " + FLA_REF, matmul_zeros_start, inputs(2, hk=HV), STEP,
             fp32_close),
    *[Spelling(f"prologue_{how}", "prologue variants of " + HF + "qwen3_next/modeling_qwen3_next.py",
               lambda *a, how=how: prologue_variants(*a, how), inputs(2, hk=HK if how == "tiled_heads" else HV),
               STEP, fp32_close, mutated_args=(5,), why="matched; the part of the prologue the op does not take stays")
      for how in ("q_only", "tiled_heads", "scale_first")],
    Spelling("gated_linear_attention", "near-miss of " + HF + "qwen3_next", gated_linear_attention,
             inputs(1, hk=HV), {}, _state_close, mutated_args=(5,), why="no delta rule"),
    Spelling("decay_after_update", "near-miss of " + HF + "qwen3_next", decay_after_update, inputs(1, hk=HV), {},
             _state_close, mutated_args=(5,), why="the decay after the update"),
    Spelling("delta_rule_without_decay", "near-miss of " + HF + "qwen3_next", delta_rule_without_decay,
             inputs(1, hk=HV), {}, _state_close, mutated_args=(5,), why="no decay (DeltaNet)"),
    Spelling("bf16_cache_cast", "near-miss of " + HF + "qwen3_next", bf16_cache, inputs(1, hk=HV, state_dtype=BF), {},
             _state_close, mutated_args=(5,), why="a bf16 state cast to float32 here"),
    Spelling("prefill_tail_9_tokens", "near-miss of " + HF + "qwen3_next/modeling_qwen3_next.py", prefill_tail,
             inputs(9), {}, INDUCTOR, why="more tokens than MAX_TOKENS"),
]
