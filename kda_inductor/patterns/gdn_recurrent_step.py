"""``gdn_recurrent_step``: the gated delta rule's recurrence over a few tokens (decode, a
spec-decode verify window), unrolled in the graph -> one ``kda::gdn_recurrent_step_inplace`` (the
state written back into its cache) or ``kda::gdn_recurrent_step`` (the new state returned).

What it finds (post-grad graph), read as tensors with named axes (:mod:`._axes`: ``b h k v`` of the
state ``S [B, H, K, V]``, ``t`` the token), so that broadcast, view and einsum spellings of one
computation read alike and a transposed one does not: per token ``t``, in float32,

    A = S * exp(g_t)                        # g_t [b, h] (GDN) or [b, h, k] (KDA), log-space
    kv = sum_k(A * k_t)                     # a sum, or a bmm (einsum, matmul); of S * exp(g_t) too
    S' = A + k_t (x) ((v_t - kv) * beta_t)  # broadcast, einsum or matmul outer product, beta anywhere
    o_t = sum_k(S' * q_t)                   # a sum, or a bmm (einsum, matmul)

``T <= MAX_TOKENS`` steps chained through ``S`` (also kept ``[B, H, V, K]``, vLLM's CPU reference),
each ``x_t`` the token ``t`` of one tensor (token-major or head-major), the state's start a float32
tensor or zeros; with the prologue where it is there (float32 upcasts, transposes, contiguous
copies: the op reads by strides; the q / k l2norm, ``rsqrt`` or ``1 / sqrt``, on both; q's scale
after it; the GQA ``repeat_interleave`` of q / k, read by index), the outputs' assembly
(``out[:, :, t] = o_t`` into a zeros buffer, its transpose, the cast to the layer's dtype) and the
state's write-back (``copy_``, or Dynamo's functional copy): the cache is read once and written once,
in place (``auto_functionalized``, re-inplaced by Inductor). Spellings: transformers'
``torch_recurrent_gated_delta_rule`` (qwen3_next, qwen3_5(_moe), olmo_hybrid, lara_mini) and
``recurrent_kimi_delta_attention`` (kimi_linear, bailing_hybrid), FLA's ``naive_recurrent_kda`` and
``recurrent_gated_delta_rule_ref``, vLLM's CPU ``recurrent_gated_delta_rule``. Also a functional
``kda::gdn_recurrent_step`` already in the graph (the fla rule's, ``_dynamo_fixes``) whose new state only
goes back into its initial state's buffer: in place on that buffer, by this rewrite's second stage
(``gdn_recurrent_step_write_back.py``, run right after it: ``patterns.STAGES``; its misses).

Not matched, with the reason at the user's line: a gated linear-attention update (``S * exp(g) + k
v^T``: no delta rule), the decay applied after the update, a state read (``S k``) of another state
than the decayed one, no decay, no beta, a decay that is no float32 ``exp`` of a log-space gate, a
recurrence in 16 bits, a state kept in bf16 / fp16 and cast to float32 here (the op keeps a float32
state: rewriting would add a float32 copy of the cache each way; keep the cache in float32, as
transformers does), more than ``MAX_TOKENS`` tokens. States read elsewhere (transformers'
spec-decode history) split the chain, each part one op. A token count that depends on data
(``range(int(n))``) breaks the graph at the ``.item()``; Dynamo specializes the count in the frame
it resumes, so each count compiles a graph of its own, rewritten as a static count is.

Speed rule (``speed_rule``):

* CUDA: every size (``CUDA_MIN_BATCH = 1``): Inductor's reduction for the unrolled loop runs at 2-8x
  the state's copy floor, its speed changing from compile to compile; the op reads and
  writes the state once. A minimum measured on the H200 (``bench_gdn_recurrent_step.py``) goes in
  ``CUDA_MIN_BATCH``.
* The write-back of a functional op: on every device (one pass over the state fewer).
* CPU: never. The op's CPU implementation is the loop in eager float32 torch; Inductor's C++ for
  transformers' step was 4-12x faster at every size measured (2-core machine, one thread, 2026-12-03:
  B 2 x 4 heads x 16 x 16, T 1 / 4: 76 vs 505 / 48 vs 554 us; Qwen3-Next's 32 x 128 x 128 heads, B 1
  / 8 / 32, T 1: 0.51 vs 5.2 / 38 vs 231 / 238 vs 1002 ms, B 8, T 4: 66 vs 270 ms; docs/speed-rules.md).

Turn it off with ``options={"kda": {"disable": ["gdn_recurrent_step"]}}``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.fx as fx

from kda_inductor.lowerings import gdn_recurrent_step as _lowering  # registers the ops
from kda_inductor.patterns import _gdn_products as products
from kda_inductor.patterns import base
from kda_inductor.patterns._graph import copy_into
from kda_inductor.patterns.base import (Match, Rewrite, Stage, aten, cuda_min_count_rule, in_graph_order, is_op,
                                        live_users, prims, val)
from kda_inductor.patterns._axes import (VALUE_VIEWS, F, arrange, between, broadcast, factors, fresh,
                                          known, labels_of, relabel, repeat, shape, sole_user,
                                          token, unit, upcast, written)
from kda_inductor.patterns.canonical import Canon, const_value, term

MAX_TOKENS = 8
"""The longest chain rewritten: a spec-decode verify window (what the op was measured for)."""
CUDA_MIN_BATCH = 1
"""Sequences (``B``) from which the op runs on CUDA: 1. On the H200 (2026-12-03, ecb9247,
``benchmarks/results/gdn_recurrent_step.md``) the op was faster than stock's code at every batch
measured, 1 to 256."""
_F32 = torch.float32
_16BIT = (torch.bfloat16, torch.float16)
_S = ("b", "h", "k", "v")
_ST = ("b", "h", "v", "k")  # a state kept transposed (vLLM's CPU reference): read as a view of it


# --------------------------------------------------------------------------- one step


@dataclasses.dataclass
class Step:
    """One token of the recurrence: ``new = prev * decay + k (x) ((v - kv) * beta)``, ``out =
    sum_k(new * q)`` (``out_labels``: the output's axis names)."""

    new: fx.Node
    prev: F
    decay: F
    k: F
    v: F
    beta: F
    q: F
    out: fx.Node
    out_labels: tuple
    read: list[F]  # the factors of the state read (S k): the decayed state's and k's own nodes
    labels: tuple  # the state's axis names: _S, or _ST for a state kept [B, H, V, K]
    q_scale: float = 1.0  # numbers multiplied into the output's product

    def frontier(self) -> set:
        return {f.node for f in (self.prev, self.decay, self.k, self.v, self.beta, self.q, *self.read)
                if isinstance(f.node, fx.Node)}


def _names(n: fx.Node, labels: tuple = _S) -> frozenset:
    """The state's axes that are not unit dims."""
    return frozenset(l for l, s in zip(labels, shape(n)) if not unit(s))


def _outer(u: Any, names: frozenset, labels: tuple) -> tuple[F, F, list[F]] | None:
    """``u`` as an outer product over ``k`` and ``v`` of a state named ``labels``: ``(k factor, v
    factor, per-head factors)``."""
    fs = factors(u, labels, (_F32, *_16BIT))
    ks = [f for f in fs if f.sig() == names - {"v"}]
    vs = [f for f in fs if f.sig() == names - {"k"}]
    rest = [f for f in fs if f not in ks and f not in vs]
    if len(ks) != 1 or len(vs) != 1 or any(not f.sig() <= {"b", "h"} for f in rest):
        return None
    return ks[0], vs[0], rest


def _is_exp(f: F) -> bool:
    n = f.node
    while isinstance(n, fx.Node) and is_op(n, aten.select, *base.SHAPE_VIEWS, aten.expand, aten.permute):
        n = n.args[0]
    return is_op(n, aten.exp)


def _update(n: Any) -> tuple[fx.Node, F, F, list[F], tuple] | None:
    """A candidate state update ``n = a + outer(k, v-side)`` of a 4-D state: ``(a, k, v-side, rest,
    the state's axis names)``; the state ``[B, H, K, V]``, or ``[B, H, V, K]`` where that reads the
    v side as the delta rule's ``v - S k`` (the outer product alone does not tell them apart)."""
    if not (is_op(n, aten.add) and n.target is aten.add.Tensor and len(shape(n)) == 4 and not n.kwargs
            and all(isinstance(a, fx.Node) for a in n.args[:2])):
        return None
    names = _names(n)
    if not {"k", "v"} <= names:
        return None
    found = []
    for labels in (_S, _ST):
        for a, u in (n.args[:2], n.args[1::-1]):
            got = _outer(u, names, labels)
            if got is not None and known(shape(a)[-1] == shape(n)[-1]):
                found.append((a, *got, labels))
    return next((f for f in found if is_op(f[2].node, aten.sub)), found[0] if found else None)


def _output(n: fx.Node, labels: tuple) -> tuple[fx.Node, tuple, F, float] | None:
    """``(o, its axis names, q, c)`` where ``o = sum_k(n * q * c)`` reads the new state ``n`` (``c``
    the numbers among the product's factors: a scale of q)."""
    for u, names in products.readers(n, labels):
        big = frozenset(l for l, s in zip(names, shape(u)) if l and not unit(s))
        for m, q in products.dot(u, names) or ():
            nums = [const_value(f.node) for f in m if not isinstance(f.node, fx.Node)]
            state = [f for f in m if isinstance(f.node, fx.Node)]
            if len(state) == 1 and state[0].node is n and state[0].labels == labels and None not in nums \
                    and _names(n) - {"k"} == big:
                return u, names, q, math.prod(nums)
    return None


# --------------------------------------------------------------------------- what the op reads


@dataclasses.dataclass(frozen=True)
class Read:
    """What the op reads for one input of one step: ``node`` (axis names ``labels``, ``t`` the
    token axis), the token, and the prologue folded into the op (l2norm ``eps``, q's ``scale``, the
    GQA ``group`` of a ``repeat_interleave``)."""

    node: fx.Node
    labels: tuple
    token: Any = None
    eps: float | None = None
    scale: float = 1.0
    group: int = 1
    exp: bool = False

    def same(self, other: Read, canon: Canon) -> bool:
        """Reads of one tensor on the same axes with the same prologue (the tokens aside)."""
        return canon(self.node) == canon(other.node) and dataclasses.replace(self, node=other.node, token=None) \
            == dataclasses.replace(other, token=None)


def _scale(n: fx.Node) -> tuple[fx.Node, float] | None:
    """``x * c`` / ``c * x`` / ``x / c`` of float32 ``x`` and a number: ``(x, the factor)``."""
    if val(n).dtype != _F32 or not is_op(n, aten.mul, aten.div) or len(n.args) != 2:
        return None
    for x, c in ((n.args[0], n.args[1]), (n.args[1], n.args[0])) if is_op(n, aten.mul) else [n.args]:
        c = const_value(c)
        if isinstance(x, fx.Node) and c is not None and c != 0:
            return x, (float(c) if is_op(n, aten.mul) else 1.0 / float(c))
    return None


def _l2norm(n: fx.Node, labels: tuple, canon: Canon) -> tuple[fx.Node, float] | None:
    """``x * rsqrt(sum(x * x, -1, keepdim) + eps)`` or ``x / sqrt(...)`` over the last (``k``) axis,
    in float32 (the op's ``rsqrt``: within float32 rounding of ``1 / sqrt``): ``(x, eps)``."""
    if val(n).dtype != _F32 or labels[-1:] != ("k",) or len(n.args) != 2:
        return None
    if is_op(n, aten.div) and is_op(n.args[1], aten.sqrt):
        x, inner = n.args[0], canon(n.args[1].args[0])
    else:
        pairs = [(x, canon(r)) for x, r in (n.args, n.args[::-1]) if is_op(n, aten.mul) and isinstance(r, fx.Node)]
        x, inner = next(((x, r.args[0]) for x, r in pairs if r.op in ("rsqrt", "recip_sqrt")), (None, None))
    if not (isinstance(x, fx.Node) and inner.op == "add" and len(inner.args) == 2 and not inner.attrs):
        return None
    sq, eps = inner.args if const_value(inner.args[1]) is not None else inner.args[::-1]
    rank = len(shape(x))
    if not (sq.op == "sum" and const_value(eps) is not None and len(sq.args) >= 3 and sq.args[2] is True
            and tuple(d % rank for d in sq.args[1]) == (rank - 1,) and sq.args[0] == term("square", canon(x))):
        return None
    return x, float(const_value(eps))


def _read(f: F, role: str, canon: Canon, prologue: bool) -> Read | None:
    """What the op reads for ``f`` (a step's factor, role ``q k v g beta``): down through views and
    the token's ``select`` (and ``exp`` for the decay) to the tensor of every token; with
    ``prologue``, also through the casts to float32, the l2norm (q / k), the scale (q, outside the
    l2norm) and the GQA repeat (q / k). None: a decay that is no float32 ``exp`` of its gate."""
    n, labels, got, phase = f.node, f.labels, {}, 0
    for _ in range(32):
        n, labels = relabel(n, labels, groups=False)  # a reshape that splits tokens from requests stays
        if not (isinstance(n, fx.Node) and n.op == "call_function" and isinstance(val(n), torch.Tensor)):
            break
        if "token" not in got and (tok := token(n, labels)):
            n, labels, got["token"] = tok
        elif role == "g" and "exp" not in got and is_op(n, aten.exp) and val(n).dtype == _F32:
            n, got["exp"] = n.args[0], True
        elif not prologue:
            break
        elif role == "q" and phase == 0 and (sc := _scale(n)):
            (n, got["scale"]), phase = sc, 1
        elif role in ("q", "k") and phase <= 1 and (l2 := _l2norm(n, labels, canon)):
            (n, got["eps"]), phase = l2, 2
        elif upcast(n):
            n, phase = n.args[0], 3
        elif role in ("q", "k") and "group" not in got and (rep := repeat(n, labels)) and rep[2]:
            n, labels, got["group"] = rep
        else:
            break
    if role == "g" and "exp" not in got:
        return None
    return Read(n, labels, **got)


def _assembly(seg: list[Step]) -> tuple[fx.Node, tuple, torch.dtype] | None:
    """The outputs written token by token into a fresh buffer (``out[:, :, t] = o_t``), then
    views and one cast to 16 bits: ``(the node the op's output replaces, its names, its dtype)``."""
    buf, names = None, None
    for t, s in enumerate(seg):
        got = written(s.out, s.out_labels, buf, t)
        if got is None or (names is not None and got[1] != names):
            return None
        if buf is None and not (fresh(got[0].args[0]) and known(shape(got[0])[got[1].index("t")] == len(seg))):
            return None
        buf, names = got
    n = buf
    while (u := sole_user(n)) is not None and is_op(u, *VALUE_VIEWS):
        n = u
    if u is not None and is_op(u, prims.convert_element_type) and val(u).dtype in _16BIT:
        return u, labels_of(n, buf, names), val(u).dtype
    return buf, names, _F32


def _chains(steps: dict[fx.Node, Step]) -> list[list[Step]]:
    """The steps chained through the state (each step's ``prev`` the last one's ``new``)."""
    readers: dict[fx.Node, list[Step]] = {}
    for s in steps.values():
        readers.setdefault(s.prev.node, []).append(s)
    nxt = {s.new: readers[s.new][0] for s in steps.values() if len(readers.get(s.new, ())) == 1}
    followed = {id(s) for s in nxt.values()}
    chains = []
    for s in steps.values():
        if id(s) not in followed:
            chain = [s]
            while chain[-1].new in nxt:
                chain.append(nxt[chain[-1].new])
            chains.append(chain)
    return chains


def _segments(chain: list[Step], canon: Canon) -> list[list[Step]]:
    """``chain`` cut after each state that is read elsewhere (transformers' spec-decode history):
    each part is one op, the next continuing from the state the last wrote."""
    inside = set().union(*((between([s.new, s.out], s.frontier(), canon) or set()) for s in chain))
    out, cur = [], []
    for s in chain:
        cur.append(s)
        if s is not chain[-1] and any(u not in inside for u in live_users(s.new)):
            out.append(cur)
            cur = []
    return out + [cur]


_WANT = {"q": ("b", "t", "h", "k"), "k": ("b", "t", "h", "k"), "v": ("b", "t", "h", "v"), "beta": ("b", "t", "h"),
         "g": ("b", "t", "h"), "g_k": ("b", "t", "h", "k")}
_OUT = ("b", "t", "h", "v")


def _want(role: str, r: Read) -> tuple:
    return _WANT["g_k" if role == "g" and "k" in r.labels else role]


@dataclasses.dataclass(frozen=True)
class StepMatch(Match):
    steps: list[Step]
    reads: dict[str, Read]
    initial: fx.Node | None
    inplace: bool
    state_out: fx.Node  # whose readers get the final state: the last update, or its functional copy
    outs: list[tuple[fx.Node, tuple]]  # what the op's output replaces, with its axis names
    out_dtype: torch.dtype
    assembled: bool

    @property
    def anchor(self) -> fx.Node:
        return self.steps[-1].new

    @property
    def part(self) -> str:
        return "state in place" if self.inplace else "state returned"

    def op_args(self) -> dict[str, Any]:
        q = self.reads["q"]
        return dict(scale=q.scale, use_qk_l2norm=q.eps is not None, eps=1e-6 if q.eps is None else q.eps,
                    out_dtype=self.out_dtype)

    def tokens(self, x: Any, role: str) -> Any:
        """``x`` (what the op reads for ``role``, a tensor or its fake) as the op's argument: the
        chain's tokens (a part of the loop, where intermediate states split it), axes in order."""
        r = self.reads[role]
        if "t" in r.labels and not (r.token in (0, None) and known(x.shape[r.labels.index("t")] == len(self.steps))):
            x = x.narrow(r.labels.index("t"), r.token or 0, len(self.steps))
        return arrange(x, r.labels, _want(role, r))

    def state(self, x: Any) -> Any:
        """The initial state as the op reads it, ``[B, H, K, V]`` (a view of one kept transposed)."""
        return None if x is None else arrange(x, self.steps[0].labels, _S)

    def fn(self):
        """The replacement: a plain function of the op's inputs (``q k v g beta state``)."""
        m, kw = self, self.op_args()

        def fn(q, k, v, g, beta, state):
            xs = [m.tokens(x, r) for x, r in zip((q, k, v, g, beta), ("q", "k", "v", "g", "beta"))]
            # v's dtype is the op's default: no dtype argument for a package to misread (base.aot_refusal)
            opts = {**kw, "out_dtype": None} if kw["out_dtype"] == xs[2].dtype else kw
            if m.inplace:
                out = torch.ops.kda.gdn_recurrent_step_inplace(*xs, state, **opts)
                new = state
            elif state is not None and m.steps[0].labels != _S:
                # a state kept transposed: the op continues a copy of it in place (the functional op's
                # CPU implementation returns its final state in the initial state's strides, which its
                # fake does not say: reported to gdnkernel)
                new = m.state(state).clone()
                out = torch.ops.kda.gdn_recurrent_step_inplace(*xs, new, **opts)
                new = arrange(new, _S, m.steps[0].labels)
            else:
                out, new = torch.ops.kda.gdn_recurrent_step(*xs, m.state(state), **opts)
                new = arrange(new, _S, m.steps[0].labels)
            if m.assembled:
                outs = [arrange(out, _OUT, names) for _, names in m.outs]
            else:
                outs = [arrange(out.select(1, t), ("b", "h", "v"), names) for t, (_, names) in enumerate(m.outs)]
            return (*outs, new)

        return fn


class GdnRecurrentStep(Rewrite):
    name = "gdn_recurrent_step"
    finds = ("the gated delta rule's recurrence over a few tokens (decode, spec-decode verify) with its q / k "
             "l2norm, scale, GQA repeat, output cast and the state's write-back")
    spellings = (
        "the gated delta rule unrolled over T <= 8 tokens (`S = S * exp(g_t)`; `S += k_t (x) ((v_t - sum_k(S * k_t))"
        " * beta_t)`; `o_t = sum_k(S * q_t)`), scalar decay (GDN) or per key channel (KDA), sum, bmm, matmul or "
        "einsum contractions and outer products, token-major or head-major, the state [B, H, K, V] or [B, H, V, K]: "
        "transformers' `torch_recurrent_gated_delta_rule` (qwen3_next, qwen3_5, olmo_hybrid, lara_mini) and "
        "`recurrent_kimi_delta_attention` (kimi_linear, bailing_hybrid), FLA's `naive_recurrent_kda` and its tests' "
        "`recurrent_gated_delta_rule_ref`, vLLM's CPU `recurrent_gated_delta_rule`; with the float32 upcasts, the q / "
        "k l2norm (`rsqrt` or `1 / sqrt`), the scale, the GQA `repeat_interleave`, the outputs written into a zeros "
        "buffer and cast, and the state's `copy_` back into its cache; intermediate states read elsewhere split it"
    )
    becomes = ("`kda::gdn_recurrent_step_inplace` (the cache updated in place, through auto_functionalized) or "
               "`kda::gdn_recurrent_step` (one Triton kernel: the state read once and written once)")
    # the gated norms read this op's output: their speed rules (what produces the norm's input?) and
    # gated_norms' reading (shared by both) must see the op, not the unrolled loop it replaces
    runs_before = ("gated_norm_quant",)  # and so before gated_norm_merge, which runs after gated_norm_quant

    def find(self, graph: fx.Graph) -> list[Match]:
        canon = Canon()
        steps = {}
        for n in graph.nodes:
            s = self._step(n, canon)
            if s is not None:
                steps[n] = s
        out = []
        for chain in _chains(steps):
            for seg in _segments(chain, canon):
                m = self._match(seg, canon)
                if m is not None:
                    out.append(m)
        return out

    def speed_rule(self, match: StepMatch) -> str | None:
        if match.device == "cuda":
            return cuda_min_count_rule(shape(match.anchor)[0], CUDA_MIN_BATCH, "sequences", "gdn_recurrent_step.py")
        return (f"on {match.device} the op's implementation (the loop in eager float32 torch) is slower than "
                "the C++ Inductor generates for it (measured, see patterns/gdn_recurrent_step.py)")

    # ------------------------------------------------------------------ one step
    def _step(self, n: fx.Node, canon: Canon) -> Step | None:
        got = _update(n)
        if got is None:
            return None
        a, k, vside, rest, labels = got
        if val(n).dtype != _F32:
            return self.miss(n, Stage.VALUES, f"the recurrence is computed in {val(n).dtype} (the state update "
                             "here): the op's math is float32, so its precision would differ")
        fa = factors(a, labels)
        prev = [f for f in fa if isinstance(f.node, fx.Node) and f.sig() == _names(n)]
        decay = [f for f in fa if f not in prev]
        if len(prev) != 1:
            return self.miss(n, Stage.FORM, "the update adds k (x) (...) to something not recognised as the state "
                             "(times its decay)")
        if not decay:
            after = any(_is_exp(f) for u in live_users(n) if is_op(u, aten.mul) for f in factors(u, labels))
            return self.miss(n, Stage.FORM, "the decay is applied after the update (S = (S + k delta^T) * exp(g)): "
                             "the gated delta rule decays the state before it reads it" if after else
                             "the state is not decayed (the delta rule without a gate): the op decays it by exp(g)"
                             if products.plain(prev[0].node) else "no decay of the state (S * exp(g)) before the update "
                             "was recognised")
        if len(decay) != 1 or not decay[0].sig() <= {"b", "h", "k"} or not _is_exp(decay[0]):
            return self.miss(n, Stage.FORM, "the state's factor before the update is not recognised as one exp(g) per "
                             "head (or per key channel)")
        return self._delta(n, canon, prev[0], decay[0], fa, k, vside, rest, labels)

    def _delta(self, n, canon, prev, decay, fa, k, vside, rest, labels) -> Step | None:
        """The delta rule's side of the update: ``(v - sum_k(A * k)) * beta``, and the output."""
        sub = vside.node
        if not (is_op(sub, aten.sub) and sub.target is aten.sub.Tensor and not sub.kwargs
                and all(isinstance(a, fx.Node) for a in sub.args)):
            return self.miss(n, Stage.FORM, "a gated linear-attention update (S * exp(g) + k v^T): no delta rule "
                             "((v - S k) * beta), which the op computes")
        read, why = products.state_read(sub.args[1], broadcast(sub.args[1], sub, vside.labels), k, fa, prev, canon)
        if read is None:
            return self.miss(sub.args[1], Stage.FORM, why)  # at the state read's line
        betas = [f for f in rest if isinstance(f.node, fx.Node)]
        if len(betas) != 1 or len(rest) != 1:
            return self.miss(n, Stage.FORM, "no single beta (the update's per-head step size): the op computes "
                             "(v - S k) * beta")
        out = _output(n, labels)
        if out is None:
            return self.miss(n, Stage.PIECES, "no output sum_k(S q) of the updated state was recognised among its "
                             "readers (read: a sum over k of a broadcast product, einsum, matmul or bmm)")
        v = F(sub.args[0], broadcast(sub.args[0], sub, vside.labels))
        return Step(n, prev, decay, k, v, betas[0], out[2], out[0], out[1], read, labels, out[3])

    # ------------------------------------------------------------------ the chain
    def _match(self, seg: list[Step], canon: Canon) -> StepMatch | None:
        last = seg[-1].new
        if len(seg) > MAX_TOKENS:
            return self.miss(last, Stage.LAYOUT, f"{len(seg)} tokens in one unrolled recurrence: more than the "
                             f"{MAX_TOKENS} the op is rewritten for (decode and spec-decode verify windows)")
        initial = self._initial(seg[0])
        if initial is False:
            return None
        for prologue in (True, False):
            reads = self._reads(seg, canon, prologue)
            m = self._assemble(seg, reads, initial, canon, quiet=prologue) if reads is not None else None
            if m is not None:
                return m
        return None

    def _initial(self, s: Step) -> fx.Node | None | bool:
        """The state the chain starts from: a float32 tensor, None for zeros; False (a miss) else."""
        n = s.prev.node
        if s.prev.labels != s.labels:
            self.miss(s.new, Stage.LAYOUT, "the state's axes are not [B, H, K, V] in order (K the axis k is "
                      "summed over): the op reads that layout")
            return False
        if (is_op(n, aten.full) and n.args[1] == 0) or is_op(n, aten.zeros):
            return None
        if is_op(n, prims.convert_element_type, aten._to_copy) and val(n.args[0]).dtype in _16BIT:
            self.miss(n, Stage.VALUES, f"the state is kept in {val(n.args[0]).dtype} and cast to float32 here: the op "
                      "reads and writes a float32 state, so rewriting would add a float32 copy of the cache each way "
                      "(keep the cache in float32, as transformers does)")
            return False
        return n

    def _reads(self, seg: list[Step], canon: Canon, prologue: bool) -> dict[str, Read] | None:
        """What the op reads per input (one tensor for every step); None where the steps disagree
        (a miss once the prologue is not folded in either)."""
        out = {}
        for role, attr in (("q", "q"), ("k", "k"), ("v", "v"), ("g", "decay"), ("beta", "beta")):
            rs = [_read(getattr(s, attr), role, canon, prologue) for s in seg]
            if role == "q":  # a scale inside the output's product is q's
                rs = [r and dataclasses.replace(r, scale=r.scale * s.q_scale) for r, s in zip(rs, seg)]
            why = _disagree(rs, role, len(seg), canon)
            if why is not None:
                return None if prologue else self.miss(seg[-1].new, Stage.INDEXING, why)
            out[role] = rs[0]
        q, k = out["q"], out["k"]
        if (q.eps is None) != (k.eps is None) or (q.eps != k.eps) or q.group != k.group:
            return None  # the op normalizes and repeats both or neither: read without the prologue
        return out

    def _assemble(self, seg: list[Step], reads: dict[str, Read], initial, canon: Canon, *,
                  quiet: bool) -> StepMatch | None:
        """The match: outputs (assembled or per token), the state's write, the region and the
        op's own validation (misses unless ``quiet``: a first try with the prologue folded in)."""
        asm = _assembly(seg)
        outs = [asm[:2]] if asm else [(s.out, s.out_labels) for s in seg]
        inplace, state_out = _state_route(seg[-1].new, initial if seg[0].labels == _S else None)
        outputs = [n for n, _ in outs] + [state_out]
        stops = {r.node for r in reads.values()} | ({initial} if initial is not None else set())
        region = between(outputs, stops, canon)
        if region is None:
            return None
        leaking = base.escaping(region, outputs)
        if leaking:
            return None if quiet else self.miss(seg[-1].new, Stage.REGION, "an intermediate of the recurrence is "
                                                f"read elsewhere ({leaking[0].name})")
        m = StepMatch(nodes=in_graph_order(region), steps=seg, reads=reads, initial=initial, inplace=inplace,
                      state_out=state_out, outs=outs, out_dtype=asm[2] if asm else _F32, assembled=asm is not None)
        try:
            xs = [m.tokens(val(r.node), role) for role, r in reads.items()]
            _lowering.validate(*xs, m.state(val(initial)), **m.op_args(),
                               state_arg="state" if inplace else "initial_state")
        except (ValueError, TypeError, RuntimeError) as exc:
            return self.miss(seg[-1].new, Stage.VALIDATED, f"kda.gdn_recurrent_step rejects these inputs: {exc}")
        return m

    # ------------------------------------------------------------------ replacing
    def replace(self, graph: fx.Graph, match: StepMatch) -> dict[fx.Node, fx.Node]:
        # a part of a split chain continues the state the part before it left: replaced by then,
        # the pass manager hands this match that part's new state (base.remap)
        m = match
        args = [m.reads[r].node for r in ("q", "k", "v", "g", "beta")] + [m.initial]
        before = in_graph_order([a for a in args if a is not None])[-1].next
        outputs = [n for n, _ in m.outs] + [m.state_out]
        new = base.replace_by_function(graph, m.fn(), args, outputs=outputs, before=before, region=m.nodes,
                                       origin=m.anchor)
        return base.moved(outputs, new)


def _state_route(last: fx.Node, initial: fx.Node | None) -> tuple[bool, fx.Node]:
    """``(in place?, the node whose readers get the final state)`` of an unrolled chain: in place
    where it starts from a graph input and writes its last state back into it, else the functional
    op returning the new state."""
    if initial is not None and initial.op in ("placeholder", "get_attr"):
        w = copy_into(last, initial)
        if w is not None:
            return True, (w if is_op(w, aten.copy) else last)
    return False, last


def _disagree(rs: list[Read | None], role: str, T: int, canon: Canon) -> str | None:
    """Why the steps' reads of ``role`` are not tokens 0..T-1 of one tensor, or None."""
    if any(r is None for r in rs):
        return "the decay is not exp() of a float32 log-space gate (the op takes g and computes exp(g))"
    if not all(r.same(rs[0], canon) for r in rs):
        return f"the steps read {role} from different tensors (or along other axes)"
    tokens = [r.token for r in rs]
    first = tokens[0] if isinstance(tokens[0], int) else 0
    if tokens != list(range(first, first + T)) and not (T == 1 and tokens == [None]):
        return f"the steps read tokens {tokens} of {role}, not consecutive ones in order"
    r, want = rs[0], _want(role, rs[0])
    if any(l not in want and not unit(s) for l, s in zip(r.labels, shape(r.node))):
        return f"{role} has axes the op does not read ({r.labels})"
    return None

