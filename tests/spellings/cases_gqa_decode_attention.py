"""``gqa_decode_attention`` spellings: a decode step's grouped-query attention over repeated K /
V as transformers (its ``repeat_kv`` + sdpa integration, Falcon's per-head ALiBi bias) and
vLLM's CPU attention write it, and the near misses. Each function is written in the style of
the file named in its ``source`` (read with the search tools; not copied). Matched cases agree
with eager within float32 rounding (the folded attention runs the CPU flash kernel on ``n_rep``
query rows per kv head: the same sums, blocked differently); near misses run Inductor's code."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.spellings._corpus import Spelling, close, gen, randn

B, H, HKV, S, D = 2, 8, 2, 13, 16
N_REP = H // HKV
FOLD = {"gqa_decode_attention": 1}
HF = "huggingface/transformers: src/transformers/"
FLOAT32 = close(rtol=1e-5, atol=1e-5)  # the folded rows: float32 rounding of another blocking
BF16 = close(rtol=0.02, atol=0.02)  # the same in bf16 (on CUDA the fused backend for bf16: cuDNN / flash / efficient)


def hf_repeat_kv(hidden_states, n_rep):
    """``repeat_kv`` of transformers' modeling files (llama, qwen3_next, olmo_hybrid, ...)."""
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def hf_sdpa_attention_forward(query, key, value, attention_mask, scaling=None, is_causal=None):
    """transformers' ``sdpa_attention_forward`` with a mask (``use_gqa_in_sdpa`` is False: the
    repeat is explicit), output transposed to [B, T, H, D] as the integration returns it."""
    key = hf_repeat_kv(key, query.shape[1] // key.shape[1])
    value = hf_repeat_kv(value, query.shape[1] // value.shape[1])
    if is_causal is None:
        is_causal = query.shape[2] > 1 and attention_mask is None
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=0.0,
                                         scale=scaling, is_causal=is_causal)
    return out.transpose(1, 2).contiguous()


def hf_padded_decode(query, key, value, padding):
    """A left-padded batch's decode step: the bool mask transformers' ``sdpa_mask`` builds
    ([B, 1, 1, S], True where a key may be read)."""
    mask = padding[:, None, None, :].bool()
    return hf_sdpa_attention_forward(query, key, value, mask, scaling=D ** -0.5)


def falcon_alibi_decode(query, key, value, alibi):
    """Falcon's sdpa path with ALiBi: a per-head float bias ``alibi.view(B, H, 1, S)`` added to
    the mask, K / V expanded per group (``modeling_falcon.py``'s new decoder architecture)."""
    bias = alibi.view(B, H, 1, -1)
    key = key.unsqueeze(2).expand(-1, -1, N_REP, -1, -1).reshape(B, H, -1, D)
    value = value.unsqueeze(2).expand(-1, -1, N_REP, -1, -1).reshape(B, H, -1, D)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=bias, scale=D ** -0.5)


def interleaved_decode(query, key, value):
    """``repeat_interleave`` on the head dim (written so in many ports of GQA models)."""
    key = torch.repeat_interleave(key, dim=1, repeats=N_REP)
    value = torch.repeat_interleave(value, dim=1, repeats=N_REP)
    return F.scaled_dot_product_attention(query, key, value)


def vllm_cpu_sdpa(query, key, value):
    """vLLM's CPU attention (``TorchSDPABackendImpl._run_sdpa_forward``): tokens-major
    ``[T, H, D]`` moved to ``[H, T, D]``, K / V ``repeat_interleave``d on the head dim, then
    each sequence's rows sliced and given a batch dim. The repeat happens before the slices:
    not the form the fold reads (the fused op's K is a slice of the repeat)."""
    query, key, value = (x.movedim(0, x.dim() - 2) for x in (query, key, value))
    key = key.repeat_interleave(N_REP, dim=-3)
    value = value.repeat_interleave(N_REP, dim=-3)
    outs = []
    for i in range(B):
        q = query[None, :, i:i + 1, :]
        k, v = key[None, :, i * S:(i + 1) * S, :], value[None, :, i * S:(i + 1) * S, :]
        outs.append(F.scaled_dot_product_attention(q, k, v, scale=D ** -0.5))
    return torch.cat(outs, dim=2)


def tiled_decode(query, key, value):
    """``key.repeat(1, n_rep, 1, 1)``: head ``r * Hkv + h`` reads kv head ``h``, another grouping."""
    return F.scaled_dot_product_attention(query, key.repeat(1, N_REP, 1, 1), value.repeat(1, N_REP, 1, 1))


def _qkv(seed, tokens=1):
    g = gen(seed)
    return (randn(g, B, tokens, H, D, dtype=torch.float32).transpose(1, 2),
            randn(g, B, HKV, S, D, dtype=torch.float32), randn(g, B, HKV, S, D, dtype=torch.float32))


def _padded(seed, tokens=1, dtype=torch.float32):
    padding = torch.ones(B, S, dtype=torch.long)
    padding[1, :4] = 0
    return (*(x.to(dtype) for x in _qkv(seed, tokens)), padding)


def _vllm(seed):
    g = gen(seed)
    return (randn(g, B, H, D, dtype=torch.float32), randn(g, B * S, HKV, D, dtype=torch.float32),
            randn(g, B * S, HKV, D, dtype=torch.float32))


CASES = [
    Spelling("hf_padded_decode", HF + "integrations/sdpa_attention.py", hf_padded_decode, _padded, FOLD, FLOAT32),
    Spelling("hf_padded_decode_bf16", HF + "integrations/sdpa_attention.py", hf_padded_decode,
             lambda seed: _padded(seed, dtype=torch.bfloat16), FOLD, BF16),
    Spelling("falcon_alibi_decode", HF + "models/falcon/modeling_falcon.py", falcon_alibi_decode,
             lambda seed: (*_qkv(seed), randn(gen(seed + 1), B * H, 1, S, dtype=torch.float32)), FOLD, FLOAT32),
    Spelling("interleaved_decode", "repeat_interleave(n_rep, dim=1) GQA ports", interleaved_decode, _qkv, FOLD,
             FLOAT32),
    Spelling("hf_padded_prefill", HF + "integrations/sdpa_attention.py", hf_padded_decode,
             lambda seed: _padded(seed, tokens=3), {}, FLOAT32,
             why="three query tokens: a prefill's group cannot fold into one row per head"),
    Spelling("vllm_cpu_sdpa", "vllm-project/vllm: vllm/v1/attention/backends/cpu_attn.py", vllm_cpu_sdpa, _vllm, {},
             FLOAT32, why="the repeat is sliced per sequence before the attention reads it: not read through"),
    Spelling("tiled_repeat", "x.repeat(1, n_rep, 1, 1): another head grouping", tiled_decode, _qkv, {}, FLOAT32,
             why="head r * Hkv + h reads kv head h: tiled, not the interleaved repeat_kv"),
]
