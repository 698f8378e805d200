"""``causal_conv1d`` spellings: the depthwise causal short conv of GDN / KDA / Mamba layers as
transformers, Dao's causal-conv1d references (which vLLM's kernel tests use), FLA's test
reference and vLLM's CPU fallback write it, and the near misses. Each function is written in
the style of the file named in its ``source`` (read with the search tools; not copied).
Matched cases are bit-exact with eager (the op's CPU kernel is aten's conv); near misses run
Inductor's own code. The cat form's cases check that the ``_cat`` op reads the parts (no cat)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tests.spellings._corpus import Spelling, close, exact, gen, randn

C, K = 24, 4  # channels (q | k | v; real: 8192), kernel width (every model: 4)
QK, V = 4, 4  # per key head (2 heads) of q / k and of v: 2 x (4 + 4 + 4) = 24 channels
CONV = {"causal_conv1d": 1}
HF = "huggingface/transformers: src/transformers/models/"
DAO = "Dao-AILab/causal-conv1d: causal_conv1d/causal_conv1d_interface.py"
FLA = "fla-org/flash-linear-attention: tests/modules/test_conv.py"
VLLM_CPU = "vllm-project/vllm: vllm/model_executor/layers/mamba/ops/cpu/causal_conv1d.py"
INDUCTOR = close(rtol=0.02, atol=0.02)  # near misses: Inductor's own rounding of the silu


def _weight(seed: int, dtype=torch.bfloat16, width: int = K):
    return nn.Parameter(randn(gen(500 + seed), C, width, dtype=dtype, scale=0.5), requires_grad=False)


# --------------------------------------------------------------------------- transformers


def hf_conv_fn(hidden_states, weight, bias=None, activation=None):
    """``causal_conv1d_fn`` of qwen3_next / qwen3_5 / kimi_linear / olmo_hybrid / bailing_hybrid /
    lara_mini (one function in each modeling file, 5.17 and 5.24 alike)."""
    _, hidden_size, seq_len = hidden_states.shape
    out = F.conv1d(hidden_states.to(weight.dtype), weight=weight.unsqueeze(1), bias=bias, padding=weight.shape[-1] - 1,
                   groups=hidden_size)[:, :, :seq_len]
    if activation is not None:
        out = F.silu(out)
    return out.to(hidden_states.dtype)


def hf_conv_update(hidden_states, conv_state, weight, bias=None, activation=None):
    """``causal_conv1d_update`` of the same files: the state written in place."""
    _, hidden_size, seq_len = hidden_states.shape
    state_len = conv_state.shape[-1]
    new = torch.cat([conv_state, hidden_states], dim=-1).to(weight.dtype)
    conv_state.copy_(new[:, :, -state_len:])
    out = F.conv1d(new, weight.unsqueeze(1), bias, padding=0, groups=hidden_size)[:, :, -seq_len:]
    if activation is not None:
        out = F.silu(out)
    return out.to(hidden_states.dtype)


class Qwen3NextConv(nn.Module):
    """Qwen3-Next's ``Qwen3NextGatedDeltaNet.forward`` around the conv: q / k / v split out of the
    grouped ``qkvz`` projection, ``cat``, transpose, the conv, transpose back, split. ``cache``: a
    first prefill's state write, 5.24's ``conv_state.copy_(x[..., -K:])`` (``update_conv_state``)
    or 5.17's ``F.pad(x, (K - T, 0))`` (returned: the layer stores it on the cache)."""

    def __init__(self, seed: int = 0, cache: str | None = None):
        super().__init__()
        self.weight, self.cache = _weight(seed), cache

    def forward(self, qkvz, conv_state=None):
        q, k, v, _z = torch.split(qkvz, [QK, QK, V, V], dim=3)
        mixed = torch.cat([t.reshape(t.shape[0], t.shape[1], -1) for t in (q, k, v)], dim=-1).transpose(1, 2)
        new_state = F.pad(mixed, (K - mixed.shape[-1], 0)) if self.cache == "5.17" else None
        if self.cache == "5.24":
            conv_state.copy_(mixed[..., -K:])
        if conv_state is not None and mixed.shape[-1] == 1:
            mixed = hf_conv_update(mixed, conv_state, self.weight, None, "silu")
        else:
            mixed = hf_conv_fn(mixed, self.weight, None, activation="silu")
        query, key, value = torch.split(mixed.transpose(1, 2), [2 * QK, 2 * QK, 2 * V], dim=-1)
        out = query.reshape(*query.shape[:2], -1, QK), key, value.reshape(*value.shape[:2], -1, V)
        return out if new_state is None else (*out, new_state)


class CatReadElsewhere(nn.Module):
    """Qwen3-Next's ``cat(q, k, v)`` also returned (read elsewhere): the cat is written anyway."""

    def __init__(self, seed: int = 0):
        super().__init__()
        self.weight = _weight(seed)

    def forward(self, qkvz):
        q, k, v, _z = torch.split(qkvz, [QK, QK, V, V], dim=3)
        mixed = torch.cat([t.reshape(t.shape[0], t.shape[1], -1) for t in (q, k, v)], dim=-1)
        return hf_conv_fn(mixed.transpose(1, 2), self.weight, None, activation="silu"), mixed


class ProjectedConv(nn.Module):
    """Qwen3.5 / OLMo-hybrid / Lara (one ``in_proj_qkv`` or its sum of parts) and Kimi Linear /
    Bailing (``cat([q_proj(h), k_proj(h), v_proj(h)])``) before the same conv."""

    def __init__(self, parts: int, seed: int = 0):
        super().__init__()
        g = gen(600 + seed)
        self.proj = nn.ModuleList(nn.Linear(16, C // parts, bias=False).to(torch.bfloat16) for _ in range(parts))
        for p in self.proj:
            p.weight.data = randn(g, *p.weight.shape, scale=0.25)
        self.weight = _weight(seed)

    def forward(self, h):
        x = torch.cat([p(h) for p in self.proj], dim=-1) if len(self.proj) > 1 else self.proj[0](h)
        return torch.split(hf_conv_fn(x.transpose(1, 2), self.weight, None, "silu").transpose(1, 2), C // 3, dim=-1)


def hf_cached_prefill_continued(x, conv_state, weight):
    """transformers 5.24's prefill continuing a cached state (``update_conv_state``: ``cat`` of the
    state and the new tokens, its last K columns cached), then ``causal_conv1d_fn`` and the
    layer's ``[:, :, -seq_len:]``."""
    seq_len = x.shape[1]
    full = torch.cat([conv_state, x.transpose(1, 2)], dim=-1)
    conv_state.copy_(full[..., -K:])
    return hf_conv_fn(full, weight, None, "silu")[:, :, -seq_len:].transpose(1, 2)


def hf_cached_prefill_padded(x, conv_state, weight):
    """The first prefill shorter than the kernel: ``F.pad`` to K columns, cached, convolved."""
    x = x.transpose(1, 2)
    full = F.pad(x, (K - x.shape[-1], 0), value=0)
    conv_state.copy_(full[..., -K:])
    return hf_conv_fn(full, weight, None, "silu")[:, :, -x.shape[-1]:].transpose(1, 2)


class MambaConv(nn.Module):
    """Mamba's ``slow_forward`` (``models/mamba/modeling_mamba.py``): an ``nn.Conv1d`` module with a
    bias, padding K - 1, ``act(conv1d(x)[..., :seq_len])``."""

    def __init__(self, seed: int = 0):
        super().__init__()
        self.conv1d = nn.Conv1d(C, C, K, groups=C, padding=K - 1, bias=True).to(torch.bfloat16)
        g = gen(700 + seed)
        self.conv1d.weight.data = randn(g, C, 1, K, scale=0.5)
        self.conv1d.bias.data = randn(g, C, scale=0.5)
        self.act = nn.SiLU()

    def forward(self, hidden_states):
        seq_len = hidden_states.shape[-1]
        return self.act(self.conv1d(hidden_states)[..., :seq_len])


# --------------------------------------------------------------------------- references


def dao_causal_conv1d_ref(x, weight, bias, initial_states=None):
    """``causal_conv1d_ref``: ``x (batch, dim, seqlen)``, optional initial states ``(batch, dim,
    width - 1)`` concatenated in front (padding 0), silu, cast back."""
    dtype_in = x.dtype
    x = x.to(weight.dtype)
    seqlen = x.shape[-1]
    dim, width = weight.shape
    if initial_states is None:
        out = F.conv1d(x, weight.unsqueeze(1), bias, padding=width - 1, groups=dim)
    else:
        x = torch.cat([initial_states, x], dim=-1)
        out = F.conv1d(x, weight.unsqueeze(1), bias, padding=0, groups=dim)
    out = out[..., :seqlen]
    return F.silu(out).to(dtype=dtype_in)


def dao_causal_conv1d_update_ref(x, conv_state, weight, bias):
    """``causal_conv1d_update_ref`` on a 2-D decode batch ``x (batch, dim)``: unsqueezed, the state
    shifted in place, the conv's last output squeezed back."""
    dtype_in = x.dtype
    x = x.unsqueeze(-1)
    seqlen, width, state_len = x.shape[-1], weight.shape[1], conv_state.shape[-1]
    x = torch.cat([conv_state, x], dim=-1).to(weight.dtype)
    conv_state.copy_(x[:, :, -state_len:])
    out = F.conv1d(x, weight.unsqueeze(1), bias, padding=0, groups=x.shape[1])[:, :, -seqlen:]
    return F.silu(out).squeeze(-1).to(dtype=dtype_in)


def fla_causal_conv1d_ref_torch(x, initial_state, weight, bias):
    """FLA's ``causal_conv1d_ref_torch`` (token-major input rearranged by the caller): 16-bit
    inputs computed in float32, the final state a ``F.pad`` of ``[state | x]`` (so the cat
    stays for it)."""
    dtype_in, width = x.dtype, weight.shape[1]
    x = x.transpose(1, 2)
    x_full = torch.cat([initial_state, x], dim=-1)
    out = F.conv1d(x_full.to(torch.float32), weight.to(torch.float32).unsqueeze(1), bias.to(torch.float32),
                   padding=0, groups=weight.shape[0])[..., :x.shape[-1]]
    final_states = F.pad(x_full, (width - 1 - x_full.shape[-1], 0)).to(dtype_in)
    return F.silu(out).to(dtype=dtype_in).transpose(1, 2), final_states


def vllm_cpu_conv_update(x, conv_state, weight, bias):
    """vLLM's CPU ``causal_conv1d_update_torch``: no cast after the silu."""
    _, dim, seq_len = x.shape
    state_len = conv_state.shape[-1]
    x_new = torch.cat([conv_state, x], dim=-1).to(weight.dtype)
    conv_state.copy_(x_new[:, :, -state_len:])
    out = F.conv1d(x_new, weight.unsqueeze(1), bias, padding=0, groups=dim)[:, :, -seq_len:]
    return F.silu(out)


# --------------------------------------------------------------------------- near misses


def dilated_conv(x, weight):
    return F.silu(F.conv1d(x, weight.unsqueeze(1), padding=6, dilation=2, groups=C)[..., :x.shape[-1]])


def strided_conv(x, weight):
    return F.silu(F.conv1d(x, weight.unsqueeze(1), padding=3, stride=2, groups=C))


def wide_conv(x, weight9):
    return F.silu(F.conv1d(x, weight9.unsqueeze(1), padding=8, groups=C)[..., :x.shape[-1]])


def grouped_conv(x, weight_g):
    """Two channels per group: not depthwise."""
    return F.silu(F.conv1d(x, weight_g, padding=3, groups=C // 2)[..., :x.shape[-1]])


def same_padded_conv(x, weight):
    """Every output of a conv padded on both sides: not causal."""
    return F.silu(F.conv1d(x, weight.unsqueeze(1), padding=K - 1, groups=C))


def conv_read_before_silu(x, weight):
    """The conv's output read twice: the conv alone is rewritten, the silu stays."""
    out = F.conv1d(x, weight.unsqueeze(1), padding=K - 1, groups=C)[..., :x.shape[-1]]
    return F.silu(out), out


def bias_added_after(x, weight, bias):
    """A bias of another shape added after the conv: the conv alone is rewritten."""
    out = F.conv1d(x, weight.unsqueeze(1), padding=K - 1, groups=C)[..., :x.shape[-1]]
    return F.silu(out + bias)


# --------------------------------------------------------------------------- graph checks


def reads_parts(op: str = "kda.causal_conv1d_cat.default", cat_tokens: int | None = None):
    """The cat form: one ``op``, reading no ``aten.cat`` (the parts where the projection wrote
    them); a cat left in the graph only of ``cat_tokens`` tokens (the state write's last K)."""

    def check(records) -> str | None:
        rows = [r for rec in records for r in rec.after_nodes]
        by_name = {r.name: r for r in rows}
        ops = [r for r in rows if r.target == op]
        if len(ops) != 1:
            return f"expected one {op}, found {[r.target for r in rows if r.target.startswith('kda.')]}"
        fed = [by_name[i].target for i in ops[0].inputs]
        cats = [r.meta for r in rows if r.target == "aten.cat.default"]
        if "aten.cat.default" in fed or any(f", {cat_tokens}, " not in m for m in cats):
            return f"{op} reads {fed}; cats left: {cats}"
        return None

    return check


def reads_the_cat(records) -> str | None:
    """The cat stays (read elsewhere): the single-source op reads it."""
    rows = [r for rec in records for r in rec.after_nodes]
    ops = [r.target for r in rows if r.target.startswith("kda.")]
    return None if ops == ["kda.causal_conv1d.default"] else f"expected kda.causal_conv1d alone, found {ops}"


# --------------------------------------------------------------------------- inputs


def _qkvz(seed, T):
    return lambda s: [randn(gen(seed + s), 2, T, 2, 2 * QK + 2 * V)]


def _with_state(T, width=K, two_d=False, token_major=True):
    def make(seed):
        g = gen(seed)
        x = randn(g, 2, C) if two_d else (randn(g, 2, T, C) if token_major else randn(g, 2, C, T))
        return [x, randn(g, 2, C, width), _weight(seed).data, randn(g, C, scale=0.5)]
    return make


def _plain(T, *extra):
    def make(seed):
        g = gen(seed)
        return [randn(g, 2, C, T)] + [randn(g, *shape, scale=0.5) for shape in extra]
    return make


def _qwen_decode(seed):
    g = gen(seed)
    return [randn(g, 2, 1, 2, 2 * QK + 2 * V), randn(g, 2, C, K)]


def _qwen_cached(T):
    def make(seed):
        g = gen(seed)
        return [randn(g, 2, T, 2, 2 * QK + 2 * V), randn(g, 2, C, K)]
    return make


def _h(seed):
    return [randn(gen(seed), 2, 7, 16)]


def _state_only(T):
    def make(seed):
        g = gen(seed)
        return [randn(g, 2, T, C), randn(g, 2, C, K), _weight(seed).data]
    return make


CASES = [
    Spelling("hf_qwen3_next_conv_prefill", HF + "qwen3_next/modeling_qwen3_next.py", Qwen3NextConv(), _qkvz(1, 7),
             CONV, exact, graph_check=reads_parts()),
    Spelling("hf_qwen3_next_conv_decode", HF + "qwen3_next/modeling_qwen3_next.py", Qwen3NextConv(1), _qwen_decode,
             CONV, exact, mutated_args=(1,), graph_check=reads_parts("kda.causal_conv1d_update_cat.default")),
    Spelling("hf_qwen3_next_conv_cached_first_prefill", HF + "qwen3_next/modeling_qwen3_next.py (+ cache_utils.py, 5.24)",
             Qwen3NextConv(2, cache="5.24"), _qwen_cached(7), CONV, exact, mutated_args=(1,),
             why="the state copy reads the cat's last K tokens: rebuilt from q / k / v's", graph_check=reads_parts(cat_tokens=K)),
    Spelling("hf_qwen3_next_conv_state_pad_5_17", HF + "qwen3_next/modeling_qwen3_next.py (5.17)",
             Qwen3NextConv(3, cache="5.17"), _qkvz(2, 7), CONV, exact,
             why="F.pad(x, (K - T, 0)) with T > K is x's last K tokens", graph_check=reads_parts(cat_tokens=K)),
    Spelling("hf_qwen3_next_conv_state_pad_short_5_17", HF + "qwen3_next/modeling_qwen3_next.py (5.17)",
             Qwen3NextConv(4, cache="5.17"), _qkvz(3, 2), CONV, exact,
             why="a prompt shorter than K: the state is x after K - T zeros", graph_check=reads_parts(cat_tokens=2)),
    Spelling("hf_qwen3_5_conv_prefill", HF + "qwen3_5/modeling_qwen3_5.py", ProjectedConv(1), _h, CONV, exact),
    Spelling("hf_kimi_linear_conv_prefill", HF + "kimi_linear/modeling_kimi_linear.py", ProjectedConv(3), _h, CONV,
             exact, why="cat of three projections: the cat form reads them", graph_check=reads_parts()),
    Spelling("hf_cached_prefill_continued", HF + "qwen3_next/modeling_qwen3_next.py (+ cache_utils.py, 5.24)",
             hf_cached_prefill_continued, _state_only(6), CONV, exact, mutated_args=(1,)),
    Spelling("hf_cached_prefill_padded", HF + "qwen3_next/modeling_qwen3_next.py (+ cache_utils.py, 5.24)",
             hf_cached_prefill_padded, _state_only(2), CONV, exact, mutated_args=(1,),
             why="the conv reads the pad (its zeros are the sequence start); the state copy of the pad stays"),
    Spelling("hf_mamba_conv_module_bias", HF + "mamba/modeling_mamba.py", MambaConv(), _plain(9), CONV, exact),
    Spelling("dao_causal_conv1d_ref", DAO, lambda x, w, b: dao_causal_conv1d_ref(x, w, b), _plain(9, (C, K), (C,)),
             CONV, exact),
    Spelling("dao_causal_conv1d_ref_initial_states", DAO, dao_causal_conv1d_ref, _plain(9, (C, K), (C,), (2, C, K - 1)),
             CONV, exact),
    Spelling("dao_causal_conv1d_update_ref_2d", DAO, dao_causal_conv1d_update_ref, _with_state(1, K - 1, two_d=True),
             CONV, exact, mutated_args=(1,)),
    Spelling("fla_causal_conv1d_ref_torch_final_state", FLA, fla_causal_conv1d_ref_torch, _with_state(9, K - 1), CONV,
             exact, why="float32 conv of bf16 inputs; the cat stays for the final state's F.pad"),
    Spelling("vllm_cpu_causal_conv1d_update_torch", VLLM_CPU, vllm_cpu_conv_update,
             _with_state(3, K, token_major=False), CONV, exact, mutated_args=(1,)),
    Spelling("dilated_conv", "near-miss of " + DAO, dilated_conv, _plain(9, (C, K)), {}, INDUCTOR,
             why="a dilated conv is not the op's"),
    Spelling("strided_conv", "near-miss of " + DAO, strided_conv, _plain(9, (C, K)), {}, INDUCTOR),
    Spelling("wide_conv", "near-miss of " + DAO, wide_conv, _plain(9, (C, 9)), {}, INDUCTOR,
             why="kernel width 9 > the op's 8"),
    Spelling("grouped_conv", "near-miss of " + DAO, grouped_conv, _plain(9, (C, 2, K)), {}, INDUCTOR,
             why="two channels per group: not depthwise"),
    Spelling("same_padded_conv", "near-miss of " + DAO, same_padded_conv, _plain(9, (C, K)), {}, INDUCTOR,
             why="every output of a both-sides padded conv: not causal"),
    Spelling("conv_read_before_silu", "near-miss of " + DAO, conv_read_before_silu, _plain(9, (C, K)), CONV, exact,
             why="the conv alone is rewritten; the silu stays with Inductor"),
    Spelling("hf_qwen3_next_conv_cat_read_elsewhere", "near-miss of " + HF + "qwen3_next/modeling_qwen3_next.py",
             CatReadElsewhere(), _qkvz(4, 7), CONV, exact, graph_check=reads_the_cat,
             why="the cat is also returned: written anyway, the single-source op reads it"),
    Spelling("bias_added_after_conv", "near-miss of " + DAO, bias_added_after, _plain(9, (C, K), (1, C, 1)), CONV,
             INDUCTOR, why="the conv alone is rewritten; the add (another rounding than F.conv1d's bias=) stays"),
]
