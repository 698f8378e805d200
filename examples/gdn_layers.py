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

**Prefill batches.** As in vLLM, the non-spec set is every request that does not verify draft
tokens: decode requests (one token) and prefill requests (many), in one varlen set described by
``non_spec_cu_seqlens`` (int32 ``[R + 1]``, offsets into the non-spec tokens) and
``max_query_len`` (the longest non-spec request, a Python int as in vLLM's metadata: the
torch core pads to it, the fla core does not need it). Without ``non_spec_cu_seqlens`` every
non-spec request has one token (the decode fast path). A pure prefill batch has an empty
spec set: ``spec_idx`` of size 0 and zero spec states. Dynamo specializes sizes 0 and 1, so
such a batch compiles a graph of its own once (the spec gathers and their recurrence vanish
from it); mixed batches share one dynamic graph.

**The recurrent core** (``core=``): ``"torch"`` (the default here: the plain-torch loop
below, the reference and the CPU path), ``"fla"`` (flash-linear-attention's Triton kernels
as custom ops, ``examples/fla_core.py``: fused recurrent for fixed-length sets, chunked for
varlen prefill), ``"auto"`` (fla on CUDA tensors when installed, torch otherwise). The conv
and everything the rewrites target are the same torch code with either core.

    python examples/gdn_layers.py            # runs both layers eager and compiled, checks them
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))
import fla_core  # noqa: E402  (registers the fla_core:: ops; imports fla itself only when one runs)

CORES = ("torch", "fla", "auto")


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
    request (``num_spec_tokens + 1`` each), ``non_spec_idx`` the other requests' tokens
    (decode: one each; prefill: many), request by request; together a permutation of
    ``range(num_tokens)``. ``non_spec_cu_seqlens`` (None: every non-spec request has one
    token) and ``max_query_len`` describe a varlen non-spec set (see the module docstring)."""

    num_tokens: int
    num_spec_tokens: int
    spec_idx: torch.Tensor  # int32 [num_spec_reqs * (num_spec_tokens + 1)]
    non_spec_idx: torch.Tensor  # int32 [non-spec tokens]
    token_request: list[int]  # request of every token, in batch order (for the reference)
    request_is_spec: list[bool]
    non_spec_cu_seqlens: torch.Tensor | None = None  # int32 [non-spec requests + 1]
    max_query_len: int = 1

    def step_kwargs(self) -> dict:
        """The layers' keyword arguments for a varlen non-spec set (empty for decode only)."""
        if self.non_spec_cu_seqlens is None:
            return {}
        return {"non_spec_cu_seqlens": self.non_spec_cu_seqlens, "max_query_len": self.max_query_len}


def make_spec_batch(num_spec_reqs: int, num_decode_reqs: int, num_spec_tokens: int = 3, *,
                    seed: int = 0, device="cpu", prefill_lens: Sequence[int] = (),
                    varlen: bool | None = None) -> SpecBatch:
    """Requests in a random order, each request's tokens contiguous (as a scheduler lays them out).

    ``prefill_lens``: prefill requests (at least one token each), in the non-spec set with
    the decode requests; ``varlen`` (default: when there are prefill requests) describes the
    non-spec set by ``non_spec_cu_seqlens`` even if every request in it has one token."""
    if any(n < 1 for n in prefill_lens):
        raise ValueError(f"prefill_lens must be >= 1 token each, got {list(prefill_lens)}")
    g = torch.Generator().manual_seed(seed)
    lens = [num_spec_tokens + 1] * num_spec_reqs + [1] * num_decode_reqs + list(prefill_lens)
    kinds = [True] * num_spec_reqs + [False] * (num_decode_reqs + len(prefill_lens))
    order = torch.randperm(len(kinds), generator=g).tolist()
    spec, non_spec, token_request = [], [], []
    pos = 0
    for r in order:
        n = lens[r]
        (spec if kinds[r] else non_spec).append(list(range(pos, pos + n)))
        token_request += [r] * n
        pos += n
    # spec requests' states are indexed in order of appearance; non-spec requests' likewise
    spec_idx = torch.tensor([t for toks in spec for t in toks], dtype=torch.int32, device=device)
    non_spec_idx = torch.tensor([t for toks in non_spec for t in toks], dtype=torch.int32, device=device)
    batch = SpecBatch(pos, num_spec_tokens, spec_idx, non_spec_idx, token_request, kinds)
    if varlen if varlen is not None else bool(prefill_lens):
        cu = [0]
        for toks in non_spec:
            cu.append(cu[-1] + len(toks))
        batch.non_spec_cu_seqlens = torch.tensor(cu, dtype=torch.int32, device=device)
        batch.max_query_len = max((len(t) for t in non_spec), default=1)
    return batch


# --------------------------------------------------------------------------- the core
def causal_conv(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv + silu over ``x [R, L, C]`` continuing ``state [R, C, K-1]``.

    The K taps as a sum of shifted products (in float32, tap 0 first), not ``F.conv1d``,
    whose shape checks guard on the batch size (``16 <= R`` on CPU) and would recompile a
    dynamic-shape step whenever the number of requests crosses them."""
    seq = torch.cat([state, x.transpose(1, 2)], dim=2).float()  # [R, C, K-1+L]
    K, L = weight.shape[1], x.shape[1]
    w = weight.float()
    out = seq[:, :, 0:L] * w[:, 0:1]
    for j in range(1, K):
        out = out + seq[:, :, j:j + L] * w[:, j:j + 1]  # [R, C, L]
    return F.silu(out).transpose(1, 2).to(x.dtype), seq[:, :, -(K - 1):].to(state.dtype)


def varlen_positions(cu_seqlens: torch.Tensor, num_tokens) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's request and position in it, for ``num_tokens`` tokens laid out by
    ``cu_seqlens`` (on the device, no host sync)."""
    tok = torch.arange(num_tokens, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    req = torch.searchsorted(cu_seqlens, tok, right=True) - 1
    return req, tok - cu_seqlens[req]


def causal_conv_varlen(x, state, weight, cu_seqlens, token_req, token_pos):
    """:func:`causal_conv` for a varlen set: ``x [n, C]`` holds ``R`` requests' tokens back to
    back (``cu_seqlens``), each continuing its ``state [R, C, K-1]``; no padding, no sync.

    Window element ``j`` of token ``t`` (position ``p``) is the input ``K-1-j`` tokens back:
    ``x[t - (K-1-j)]`` when that is still in the request, else the state's column."""
    n, km1 = x.shape[0], weight.shape[1] - 1
    tok = torch.arange(n, device=x.device)
    acc = torch.zeros(n, x.shape[1], device=x.device, dtype=torch.float32)
    for j in range(km1 + 1):
        back = km1 - j
        p = token_pos - back
        from_x = x[(tok - back).clamp(min=0)]
        from_state = state[token_req, :, (p + km1).clamp(0, km1 - 1)]
        acc = acc + torch.where((p >= 0)[:, None], from_x, from_state).float() * weight[:, j].float()
    # the new state: each request's last K-1 inputs (older ones from its old state)
    starts, lens = cu_seqlens[:-1], cu_seqlens[1:] - cu_seqlens[:-1]
    cols = []
    for i in range(km1):
        p = lens - km1 + i
        from_x = x[(starts + p).clamp(min=0)]  # < n: every request has a token
        idx = (p + km1).clamp(0, km1 - 1).long()[:, None, None].expand(-1, state.shape[1], 1)
        cols.append(torch.where((p >= 0)[:, None], from_x, state.gather(2, idx).squeeze(2)))
    new_state = torch.stack(cols, dim=2) if cols else state
    return F.silu(acc).to(x.dtype), new_state.to(state.dtype)


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


def all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    """Sum ``x`` over the ranks of ``group`` (functional collective: traceable by Dynamo); ``x``
    itself without a group."""
    if group is None:
        return x
    from torch.distributed import _functional_collectives as fc

    return fc.wait_tensor(fc.all_reduce(x, "sum", group))


# --------------------------------------------------------------------------- FP8 output projection
class Fp8Linear(nn.Module):
    """A block-wise fp8 linear in plain torch, as FP8 checkpoints of Qwen3-Next / Qwen3.5 hold
    their output projection: e4m3 weights with one float32 scale per ``group x group`` block, the
    activations quantized per token group of ``group`` by vLLM's dynamic ``QuantFP8`` formula
    (``forward_native``), then a dequantized matmul (the quantization is what matters here: it is
    what ``gated_norm_quant`` fuses with the norm before it). ``Fp8Linear.from_linear(lin)``."""

    FP8_MAX, MIN_SCALE = 448.0, 1.0 / (448.0 * 512.0)

    def __init__(self, weight_q: torch.Tensor, weight_scale: torch.Tensor, group: int, out_dtype: torch.dtype):
        super().__init__()
        self.register_buffer("weight_q", weight_q)
        self.register_buffer("weight_scale", weight_scale)
        self.group, self.out_dtype = group, out_dtype

    @classmethod
    def from_linear(cls, lin: nn.Linear, group: int = 128) -> Fp8Linear:
        w = lin.weight.detach().float()
        o, i = w.shape
        blocks = w.view(o // group, group, i // group, group)
        s = (blocks.abs().amax(dim=(1, 3), keepdim=True) / cls.FP8_MAX).clamp(min=cls.MIN_SCALE)
        q = (blocks / s).clamp(-cls.FP8_MAX, cls.FP8_MAX).to(torch.float8_e4m3fn).view(o, i)
        return cls(q, s.view(o // group, i // group), group, lin.weight.dtype)

    def quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM's ``QuantFP8._quantize_group_native`` (no padding: the width is a multiple)."""
        xg = x.view(-1, x.shape[-1] // self.group, self.group)
        s = (xg.abs().max(dim=-1, keepdim=True)[0].float() / self.FP8_MAX).clamp(min=self.MIN_SCALE)
        q = (xg / s).clamp(-self.FP8_MAX, self.FP8_MAX).to(torch.float8_e4m3fn)
        return q.view(x.shape), s.squeeze(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, s = self.quantize(x)
        g = self.group
        xd = q.float() * s.repeat_interleave(g, dim=-1)
        wd = self.weight_q.float() * self.weight_scale.repeat_interleave(g, 0).repeat_interleave(g, 1)
        return (xd @ wd.t()).to(self.out_dtype)


# --------------------------------------------------------------------------- layers
class _SpecDecodeLayer(nn.Module):
    """What GDN and KDA share: split, per-set conv + recurrence, merge, norm, out_proj."""

    activation = "silu"
    heads: int
    head_k: int
    head_v: int

    fla_kind = "gdn"
    core_kind = "torch"
    tp_group = None  # tensor parallel: this rank holds some heads, out_proj is row-parallel

    def forward(self, hidden, spec_idx, non_spec_idx, spec_state, non_spec_state,
                spec_conv_state, non_spec_conv_state, non_spec_cu_seqlens=None,
                max_query_len: int | None = None):
        """One step. ``non_spec_cu_seqlens``/``max_query_len``: a varlen non-spec set
        (prefill), see the module docstring; without them each non-spec request has one token."""
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
        if non_spec_cu_seqlens is None:
            o_non_spec, non_spec_state, non_spec_conv_state = self.core(
                qkv_non_spec, g_non_spec, beta_non_spec, non_spec_state, non_spec_conv_state, 1)
        else:
            o_non_spec, non_spec_state, non_spec_conv_state = self.core_varlen(
                qkv_non_spec, g_non_spec, beta_non_spec, non_spec_state, non_spec_conv_state,
                non_spec_cu_seqlens, max_query_len)

        # merge
        out = torch.empty(1, T, self.heads, self.head_v, dtype=hidden.dtype, device=hidden.device)
        out.index_copy_(1, spec_idx.long(), o_spec)  # index_copy_ takes int64 indices only
        out.index_copy_(1, non_spec_idx.long(), o_non_spec)
        y = gated_rmsnorm(out.reshape(-1, self.head_v), z.reshape(-1, self.head_v),
                          self.norm_weight, self.eps, self.activation)
        y = all_reduce(self.out_proj(y.reshape(T, -1)), self.tp_group)
        return y, spec_state, non_spec_state, spec_conv_state, non_spec_conv_state

    def uses_fla(self, x: torch.Tensor) -> bool:
        """Whether this call runs fla's kernels (``core="fla"``, or ``"auto"`` on CUDA with fla)."""
        return self.core_kind == "fla" or (self.core_kind == "auto" and x.is_cuda and self.fla_installed)

    def set_core(self, core: str) -> None:
        """Choose the recurrent core: ``"torch"``, ``"fla"`` or ``"auto"`` (module docstring)."""
        if core not in CORES:
            raise ValueError(f"core must be one of {CORES}, got {core!r}")
        if core == "fla" and not fla_core.available():
            raise ImportError("core='fla' needs flash-linear-attention: pip install 'kda-inductor[fla]'")
        self.core_kind = core
        self.fla_installed = fla_core.available()  # looked up once: Dynamo must not trace importlib

    def core(self, qkv, g, beta, state, conv_state, L):
        """Conv + recurrence for one set: ``R = tokens // L`` requests of ``L`` tokens."""
        n = qkv.shape[0]
        R = n // L
        x, conv_state = causal_conv(qkv.view(R, L, qkv.shape[-1]), conv_state, self.conv_weight)
        g = g.view(R, L, *g.shape[2:])
        beta = beta.view(R, L, beta.shape[-1])  # explicit sizes: R may be 0 (no spec requests)
        if self.uses_fla(qkv):
            q, k, v = self.split_heads(x, grouped=True)  # [R, L, H(k), *]
            op = fla_core.OPS[self.fla_kind]["recurrent"]
            o, state = op(q, k, v, g, beta, state, None, self.head_k ** -0.5)
            return o.reshape(1, n, self.heads, self.head_v), state, conv_state
        q, k, v = self.split_heads(x)  # [R, L, H, *]
        o, state = gated_delta_rule(q, k, v, g, beta, state)
        return o.reshape(1, n, self.heads, self.head_v).to(qkv.dtype), state, conv_state

    def core_varlen(self, qkv, g, beta, state, conv_state, cu_seqlens, max_query_len):
        """Conv + recurrence for a varlen set (prefill): ``R = len(cu_seqlens) - 1`` requests.

        The fla core runs its chunked kernel on the tokens as they are; the torch core pads
        every request to ``max_query_len`` tokens (zero decay and beta past a request's end
        leave its state unchanged) and loops over them."""
        n = qkv.shape[0]
        token_req, token_pos = varlen_positions(cu_seqlens, n)
        x, conv_state = causal_conv_varlen(qkv, conv_state, self.conv_weight, cu_seqlens, token_req, token_pos)
        g, beta = g[0], beta[0]  # [n, H(, K)]
        if self.uses_fla(qkv):
            q, k, v = self.split_heads(x.unsqueeze(0), grouped=True)  # [1, n, H(k), *]
            op = fla_core.OPS[self.fla_kind]["chunk"]
            o, state = op(q, k, v, g.unsqueeze(0), beta.unsqueeze(0), state, cu_seqlens, self.head_k ** -0.5)
            return o.reshape(1, n, self.heads, self.head_v), state, conv_state
        if max_query_len is None:
            raise ValueError("max_query_len (the longest non-spec request, an int) is needed by "
                             "the torch core for a varlen non-spec set")
        R, L = state.shape[0], max_query_len
        flat = token_req.long() * L + token_pos.long()

        def pad(t):  # [n, ...] -> [R, L, ...], zeros past each request's end
            out = t.new_zeros(R * L, *t.shape[1:]).index_put((flat,), t)
            return out.view(R, L, *t.shape[1:])

        q, k, v = self.split_heads(pad(x))
        o, state = gated_delta_rule(q, k, v, pad(g), pad(beta), state)
        o = o.reshape(R * L, self.heads, self.head_v)[flat]
        return o.reshape(1, n, self.heads, self.head_v).to(qkv.dtype), state, conv_state

    def init_states(self, num_requests, device="cpu"):
        ssm = torch.randn(num_requests, self.heads, self.head_k, self.head_v, device=device) * 0.1
        conv = torch.randn(num_requests, self.conv_dim, self.conv_kernel - 1, device=device,
                           dtype=self.dtype) * 0.5
        return ssm, conv


class Qwen3NextGDN(_SpecDecodeLayer):
    """Qwen3-Next Gated DeltaNet: GQA (16 key heads, 32 value heads), scalar decay per head."""

    activation = "silu"

    fla_kind = "gdn"

    def __init__(self, cfg: GDNConfig = GDNConfig(), dtype=torch.bfloat16, core: str = "torch"):
        super().__init__()
        self.set_core(core)
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

    def split_heads(self, x, grouped: bool = False):
        """q, k, v heads; q and k repeated to the value heads unless ``grouped`` (fla's GVA)."""
        c = self.cfg
        q, k, v = x.split([c.num_k_heads * c.head_k_dim] * 2 + [c.num_v_heads * c.head_v_dim], -1)
        rep = 1 if grouped else c.num_v_heads // c.num_k_heads
        q = q.unflatten(-1, (c.num_k_heads, c.head_k_dim)).repeat_interleave(rep, dim=-2)
        k = k.unflatten(-1, (c.num_k_heads, c.head_k_dim)).repeat_interleave(rep, dim=-2)
        return q, k, v.unflatten(-1, (c.num_v_heads, c.head_v_dim))


class KimiKDA(_SpecDecodeLayer):
    """Kimi Linear KDA: 32 heads, decay per key channel, sigmoid-gated output norm."""

    activation = "sigmoid"

    fla_kind = "kda"

    def __init__(self, cfg: KDAConfig = KDAConfig(), dtype=torch.bfloat16, core: str = "torch"):
        super().__init__()
        self.set_core(core)
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

    def split_heads(self, x, grouped: bool = False):
        return tuple(t.unflatten(-1, (self.heads, self.head_k)) for t in x.chunk(3, dim=-1))


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
                num_spec_tokens: int = 3, *, seed: int = 0, device="cpu", prefill_lens: Sequence[int] = (),
                varlen: bool | None = None):
    """``(hidden, batch, states...)`` for one step; with ``prefill_lens``, call the layer with
    ``**batch.step_kwargs()`` too."""
    batch = make_spec_batch(num_spec_reqs, num_decode_reqs, num_spec_tokens, seed=seed, device=device,
                            prefill_lens=prefill_lens, varlen=varlen)
    g = torch.Generator(device=device).manual_seed(seed)
    hidden = torch.randn(batch.num_tokens, layer.cfg.hidden_size, generator=g, device=device).to(layer.dtype)
    spec_state, spec_conv = layer.init_states(num_spec_reqs, device)
    non_spec_state, non_spec_conv = layer.init_states(num_decode_reqs + len(prefill_lens), device)
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
