"""Qwen3-Next Gated DeltaNet and Kimi Linear KDA layers serving a speculative-decoding step,
in plain PyTorch, shaped like vLLM's implementation (the code `gdn_spec_split` and
`gated_norm_merge` target).

A step's batch mixes requests that verify draft tokens (``num_spec_tokens + 1`` tokens
each, the *spec* set) with plain decode requests (one token each, the *non-spec* set),
in any order. The layer

1. projects all tokens (``in_proj_qkvz``/``in_proj_ba`` for GDN; q/k/v/gate/beta/decay
   projections for KDA),
2. splits the tokens in two sets: ``mixed_qkv.index_select(0, spec_idx)`` and
   ``(0, non_spec_idx)``, then, after the gating, ``g``/``beta`` ``[1, T, H]`` (``[1, T, H, K]``
   decay for KDA) with ``index_select(1, ...)``: six gathers, three sources,
3. runs a causal short convolution and the gated delta rule recurrence per set from each
   request's state (plain torch, vectorized over requests: no host syncs),
4. merges the two outputs back with ``index_copy_`` into a fresh ``[1, T, H, D]`` buffer,
5. applies the gated RMSNorm (norm before gate; silu gate for GDN, sigmoid for KDA) and the
   output projection.

Defaults are the real models' head counts and dims (Qwen3-Next-80B-A3B at TP1, Kimi-Linear-
48B-A3B); ``GDNConfig.tiny()`` / ``KDAConfig.tiny()`` are for tests.
:func:`reference_step` recomputes a step token by token in the original order, without any
split or merge, to check the layers.

    python examples/gdn_layers.py            # runs both layers eager and compiled, checks them
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn


# --------------------------------------------------------------------------- configs
@dataclasses.dataclass(frozen=True)
class GDNConfig:
    """Qwen3-Next-80B-A3B linear-attention layer at TP1 (conv_dim 8192, 32 value heads)."""

    hidden_size: int = 2048
    num_k_heads: int = 16
    num_v_heads: int = 32
    head_k_dim: int = 128
    head_v_dim: int = 128
    conv_kernel: int = 4
    eps: float = 1e-6

    @property
    def conv_dim(self) -> int:
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    @classmethod
    def tiny(cls) -> GDNConfig:
        return cls(hidden_size=64, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16)


@dataclasses.dataclass(frozen=True)
class KDAConfig:
    """Kimi-Linear-48B-A3B KDA layer: 32 heads of 128, per-channel decay, sigmoid output gate."""

    hidden_size: int = 2304
    num_heads: int = 32
    head_dim: int = 128
    conv_kernel: int = 4
    eps: float = 1e-6

    @property
    def conv_dim(self) -> int:
        return 3 * self.num_heads * self.head_dim

    @classmethod
    def tiny(cls) -> KDAConfig:
        return cls(hidden_size=64, num_heads=4, head_dim=16)


# --------------------------------------------------------------------------- batches
@dataclasses.dataclass
class SpecBatch:
    """One step's token layout: ``spec_idx`` lists the spec requests' tokens request by
    request (``num_spec_tokens + 1`` each), ``non_spec_idx`` the decode tokens; together a
    permutation of ``range(num_tokens)``."""

    num_tokens: int
    num_spec_tokens: int
    spec_idx: torch.Tensor  # int32 [num_spec_reqs * (num_spec_tokens + 1)]
    non_spec_idx: torch.Tensor  # int32 [num_decode_reqs]
    token_request: list[int]  # request of every token, in batch order (for the reference)
    request_is_spec: list[bool]


def make_spec_batch(num_spec_reqs: int, num_decode_reqs: int, num_spec_tokens: int = 3, *,
                    seed: int = 0, device="cpu") -> SpecBatch:
    """Requests in a random order, each request's tokens contiguous (as a scheduler lays them out)."""
    g = torch.Generator().manual_seed(seed)
    kinds = [True] * num_spec_reqs + [False] * num_decode_reqs
    order = torch.randperm(len(kinds), generator=g).tolist()
    spec, non_spec, token_request = [], [], []
    pos = 0
    for r in order:
        n = num_spec_tokens + 1 if kinds[r] else 1
        (spec if kinds[r] else non_spec).append(list(range(pos, pos + n)))
        token_request += [r] * n
        pos += n
    # spec requests' states are indexed in order of appearance; decode requests' likewise
    spec_idx = torch.tensor([t for toks in spec for t in toks], dtype=torch.int32, device=device)
    non_spec_idx = torch.tensor([t for toks in non_spec for t in toks], dtype=torch.int32, device=device)
    return SpecBatch(pos, num_spec_tokens, spec_idx, non_spec_idx, token_request, kinds)


# --------------------------------------------------------------------------- the core
def causal_conv(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv + silu over ``x [R, L, C]`` continuing ``state [R, C, K-1]``."""
    seq = torch.cat([state, x.transpose(1, 2)], dim=2)  # [R, C, K-1+L]
    out = F.conv1d(seq.float(), weight.float().unsqueeze(1), groups=weight.shape[0])  # [R, C, L]
    return F.silu(out).transpose(1, 2).to(x.dtype), seq[:, :, -(weight.shape[1] - 1):]


def gated_delta_rule(q, k, v, g, beta, state):
    """The recurrence for ``R`` requests of ``L`` tokens, in float32.

    ``q, k [R, L, H, K]`` (l2-normalized here), ``v [R, L, H, V]``, ``g`` log-decay
    ``[R, L, H]`` (GDN) or ``[R, L, H, K]`` (KDA), ``beta [R, L, H]``, ``state [R, H, K, V]``.
    Returns outputs ``[R, L, H, V]`` and the new state.
    """
    q = F.normalize(q.float(), dim=-1) / math.sqrt(q.shape[-1])
    k = F.normalize(k.float(), dim=-1)
    v, g, beta, h = v.float(), g.float(), beta.float(), state.float()
    outs = []
    for t in range(q.shape[1]):
        decay = g[:, t].exp()
        h = h * (decay[..., None, None] if decay.dim() == 2 else decay[..., None])
        kt = k[:, t]
        delta = (v[:, t] - (h * kt[..., None]).sum(-2)) * beta[:, t, :, None]
        h = h + kt[..., None] * delta[..., None, :]
        outs.append((h * q[:, t, ..., None]).sum(-2))
    return torch.stack(outs, 1), h


def gated_rmsnorm(x, gate, weight, eps, activation):
    """Norm before gate, in float32, weight applied in float32 (flash-linear-attention)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    act = F.silu(gate.float()) if activation == "silu" else torch.sigmoid(gate.float())
    return (y * act).to(x.dtype)


# --------------------------------------------------------------------------- layers
class _SpecDecodeLayer(nn.Module):
    """What GDN and KDA share: split, per-set conv + recurrence, merge, norm, out_proj."""

    activation = "silu"
    heads: int
    head_k: int
    head_v: int

    def forward(self, hidden, spec_idx, non_spec_idx, spec_state, non_spec_state,
                spec_conv_state, non_spec_conv_state):
        T = hidden.shape[0]
        L = spec_idx.shape[0] // spec_state.shape[0] if spec_state.shape[0] else 1
        mixed_qkv, z, gate_inputs = self.project(hidden)
        # split 1/2: mixed_qkv (before the gating)
        qkv_spec = mixed_qkv.index_select(0, spec_idx)
        qkv_non_spec = mixed_qkv.index_select(0, non_spec_idx)
        g, beta = self.gating(*gate_inputs)  # [1, T, H] (KDA: g [1, T, H, K])
        # split 2/2: g and beta along the token dim
        g_spec, g_non_spec = g.index_select(1, spec_idx), g.index_select(1, non_spec_idx)
        beta_spec, beta_non_spec = beta.index_select(1, spec_idx), beta.index_select(1, non_spec_idx)

        o_spec, spec_state, spec_conv_state = self.core(
            qkv_spec, g_spec, beta_spec, spec_state, spec_conv_state, L)
        o_non_spec, non_spec_state, non_spec_conv_state = self.core(
            qkv_non_spec, g_non_spec, beta_non_spec, non_spec_state, non_spec_conv_state, 1)

        # merge
        out = torch.empty(1, T, self.heads, self.head_v, dtype=hidden.dtype, device=hidden.device)
        out.index_copy_(1, spec_idx.long(), o_spec)  # index_copy_ takes int64 indices only
        out.index_copy_(1, non_spec_idx.long(), o_non_spec)
        y = gated_rmsnorm(out.reshape(-1, self.head_v), z.reshape(-1, self.head_v),
                          self.norm_weight, self.eps, self.activation)
        y = self.out_proj(y.reshape(T, -1))
        return y, spec_state, non_spec_state, spec_conv_state, non_spec_conv_state

    def core(self, qkv, g, beta, state, conv_state, L):
        """Conv + recurrence for one set: ``R = tokens // L`` requests of ``L`` tokens."""
        n = qkv.shape[0]
        R = n // L
        x, conv_state = causal_conv(qkv.view(R, L, -1), conv_state, self.conv_weight)
        q, k, v = self.split_heads(x)  # [R, L, H, *]
        g = g.view(R, L, *g.shape[2:])
        beta = beta.view(R, L, -1)
        o, state = gated_delta_rule(q, k, v, g, beta, state)
        return o.reshape(1, n, self.heads, self.head_v).to(qkv.dtype), state, conv_state

    def init_states(self, num_requests, device="cpu"):
        ssm = torch.randn(num_requests, self.heads, self.head_k, self.head_v, device=device) * 0.1
        conv = torch.randn(num_requests, self.conv_dim, self.conv_kernel - 1, device=device,
                           dtype=self.dtype) * 0.5
        return ssm, conv


class Qwen3NextGDN(_SpecDecodeLayer):
    """Qwen3-Next Gated DeltaNet: GQA (16 key heads, 32 value heads), scalar decay per head."""

    activation = "silu"

    def __init__(self, cfg: GDNConfig = GDNConfig(), dtype=torch.bfloat16):
        super().__init__()
        self.cfg, self.dtype, self.eps = cfg, dtype, cfg.eps
        self.heads, self.head_k, self.head_v = cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim
        self.conv_dim, self.conv_kernel = cfg.conv_dim, cfg.conv_kernel
        qkvz = cfg.conv_dim + cfg.num_v_heads * cfg.head_v_dim
        self.in_proj_qkvz = nn.Linear(cfg.hidden_size, qkvz, bias=False, dtype=dtype)
        self.in_proj_ba = nn.Linear(cfg.hidden_size, 2 * cfg.num_v_heads, bias=False, dtype=dtype)
        self.conv_weight = nn.Parameter(torch.randn(cfg.conv_dim, cfg.conv_kernel, dtype=dtype) * 0.3)
        self.A_log = nn.Parameter(torch.empty(cfg.num_v_heads).uniform_(0, 2.7))  # float32
        self.dt_bias = nn.Parameter(torch.randn(cfg.num_v_heads) * 0.5)
        self.norm_weight = nn.Parameter(1 + 0.1 * torch.randn(cfg.head_v_dim))
        self.out_proj = nn.Linear(cfg.num_v_heads * cfg.head_v_dim, cfg.hidden_size, bias=False, dtype=dtype)

    def project(self, hidden):
        qkvz = self.in_proj_qkvz(hidden)
        mixed_qkv, z = qkvz.split([self.conv_dim, self.heads * self.head_v], dim=-1)
        b, a = self.in_proj_ba(hidden).chunk(2, dim=-1)
        return mixed_qkv, z, (a, b)

    def gating(self, a, b):
        g = -self.A_log.exp() * F.softplus(a.float() + self.dt_bias)  # float32 [T, H]
        beta = torch.sigmoid(b)  # bf16 [T, H]
        return g.unsqueeze(0), beta.unsqueeze(0)

    def split_heads(self, x):
        c = self.cfg
        q, k, v = x.split([c.num_k_heads * c.head_k_dim] * 2 + [c.num_v_heads * c.head_v_dim], -1)
        rep = c.num_v_heads // c.num_k_heads
        q = q.unflatten(-1, (c.num_k_heads, c.head_k_dim)).repeat_interleave(rep, dim=-2)
        k = k.unflatten(-1, (c.num_k_heads, c.head_k_dim)).repeat_interleave(rep, dim=-2)
        return q, k, v.unflatten(-1, (c.num_v_heads, c.head_v_dim))


class KimiKDA(_SpecDecodeLayer):
    """Kimi Linear KDA: 32 heads, decay per key channel, sigmoid-gated output norm."""

    activation = "sigmoid"

    def __init__(self, cfg: KDAConfig = KDAConfig(), dtype=torch.bfloat16):
        super().__init__()
        self.cfg, self.dtype, self.eps = cfg, dtype, cfg.eps
        H, D = cfg.num_heads, cfg.head_dim
        self.heads, self.head_k, self.head_v = H, D, D
        self.conv_dim, self.conv_kernel = cfg.conv_dim, cfg.conv_kernel
        self.qkv_proj = nn.Linear(cfg.hidden_size, 3 * H * D, bias=False, dtype=dtype)
        self.f_proj = nn.Sequential(  # low-rank decay projection
            nn.Linear(cfg.hidden_size, D, bias=False, dtype=dtype),
            nn.Linear(D, H * D, bias=False, dtype=dtype),
        )
        self.b_proj = nn.Linear(cfg.hidden_size, H, bias=False, dtype=dtype)
        self.g_proj = nn.Linear(cfg.hidden_size, H * D, bias=False, dtype=dtype)  # output gate
        self.conv_weight = nn.Parameter(torch.randn(cfg.conv_dim, cfg.conv_kernel, dtype=dtype) * 0.3)
        self.A_log = nn.Parameter(torch.empty(H).uniform_(0, 2.7))
        self.dt_bias = nn.Parameter(torch.randn(H * D) * 0.5)
        self.norm_weight = nn.Parameter(1 + 0.1 * torch.randn(D))
        self.out_proj = nn.Linear(H * D, cfg.hidden_size, bias=False, dtype=dtype)

    def project(self, hidden):
        return self.qkv_proj(hidden), self.g_proj(hidden), (self.f_proj(hidden), self.b_proj(hidden))

    def gating(self, f, b):
        H, D = self.heads, self.head_k
        g = -self.A_log.exp()[:, None] * F.softplus(f.float() + self.dt_bias).unflatten(-1, (H, D))
        return g.unsqueeze(0), torch.sigmoid(b).unsqueeze(0)  # [1, T, H, K] f32, [1, T, H] bf16

    def split_heads(self, x):
        return (t.unflatten(-1, (self.heads, self.head_k)) for t in x.chunk(3, dim=-1))


# --------------------------------------------------------------------------- reference
@torch.no_grad()
def reference_step(layer: _SpecDecodeLayer, hidden, batch: SpecBatch, spec_state, non_spec_state,
                   spec_conv_state, non_spec_conv_state):
    """The same step token by token in batch order, with no split and no merge."""
    mixed_qkv, z, gate_inputs = layer.project(hidden)
    g, beta = layer.gating(*gate_inputs)
    # which state slot each request uses: order of appearance within its set
    slot, seen = {}, {True: 0, False: 0}
    for r in dict.fromkeys(batch.token_request):
        kind = batch.request_is_spec[r]
        slot[r] = (kind, seen[kind])
        seen[kind] += 1
    ssm = {True: spec_state.clone(), False: non_spec_state.clone()}
    conv = {True: spec_conv_state.clone(), False: non_spec_conv_state.clone()}
    outs = []
    for t, r in enumerate(batch.token_request):
        kind, i = slot[r]
        x, conv_i = causal_conv(mixed_qkv[t].view(1, 1, -1), conv[kind][i : i + 1], layer.conv_weight)
        conv[kind][i] = conv_i[0]
        q, k, v = layer.split_heads(x)
        o, h = gated_delta_rule(q, k, v, g[:, t : t + 1], beta[:, t : t + 1], ssm[kind][i : i + 1])
        ssm[kind][i] = h[0]
        outs.append(o.reshape(1, layer.heads, layer.head_v).to(hidden.dtype))
    out = torch.cat(outs).reshape(-1, layer.head_v)
    y = gated_rmsnorm(out, z.reshape(-1, layer.head_v), layer.norm_weight, layer.eps, layer.activation)
    return layer.out_proj(y.reshape(hidden.shape[0], -1)), ssm[True], ssm[False], conv[True], conv[False]


def make_inputs(layer: _SpecDecodeLayer, num_spec_reqs: int, num_decode_reqs: int,
                num_spec_tokens: int = 3, *, seed: int = 0, device="cpu"):
    """``(hidden, batch, states...)`` for one step."""
    batch = make_spec_batch(num_spec_reqs, num_decode_reqs, num_spec_tokens, seed=seed, device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    hidden = torch.randn(batch.num_tokens, layer.cfg.hidden_size, generator=g, device=device).to(layer.dtype)
    spec_state, spec_conv = layer.init_states(num_spec_reqs, device)
    non_spec_state, non_spec_conv = layer.init_states(num_decode_reqs, device)
    return hidden, batch, (spec_state, non_spec_state, spec_conv, non_spec_conv)


def build_gdn():
    """``kda-inductor graph-diff examples/gdn_layers.py:build_gdn``: a tiny GDN step."""
    torch.manual_seed(0)
    layer = Qwen3NextGDN(GDNConfig.tiny()).eval()
    hidden, batch, states = make_inputs(layer, 3, 4)
    return layer, (hidden, batch.spec_idx, batch.non_spec_idx, *states)


def build_kda():
    """``kda-inductor graph-diff examples/gdn_layers.py:build_kda``: a tiny KDA step."""
    torch.manual_seed(0)
    layer = KimiKDA(KDAConfig.tiny()).eval()
    hidden, batch, states = make_inputs(layer, 3, 4)
    return layer, (hidden, batch.spec_idx, batch.non_spec_idx, *states)


def main() -> None:
    for build in (build_gdn, build_kda):
        layer, args = build()
        with torch.no_grad():
            eager = layer(*args)
            compiled = torch.compile(layer, backend="kda_inductor")(*args)
        err = (compiled[0].float() - eager[0].float()).abs().max().item()
        print(f"{type(layer).__name__}: {args[0].shape[0]} tokens, compiled vs eager max |diff| {err:.3g}")


if __name__ == "__main__":
    main()
