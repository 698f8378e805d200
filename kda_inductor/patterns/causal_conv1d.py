"""``causal_conv1d``: a GDN / KDA layer's depthwise causal short conv (+ silu, + its conv state)
-> one ``kda::causal_conv1d`` (prefill) or ``kda::causal_conv1d_update`` (the state in place).

What it finds (post-grad graph): a 1-D depthwise ``aten.convolution(inp, w [C, 1, K], bias, stride
1, padding p, dilation 1, groups C)`` whose input is ``x [B, C, T]``, possibly behind a cast to the
weight's dtype, a zero ``F.pad(x, (P, 0))`` or a ``torch.cat([state, x], -1)`` (``state [B, C, S]``,
``S >= K - 1``), and whose used outputs are the ``T`` causal ones (slices of the time dim before
and after the activation compose: transformers' ``[:, :, :T]``, its cache path's ``[:, :, -T:]``,
the decode form's ``padding=0`` conv on ``[state | x]``); then casts, the silu (``F.silu``, ``x *
sigmoid(x)``, ``x / (1 + exp(-x))``), a cast and unit-dim views. The spellings: transformers'
``causal_conv1d_fn`` / ``causal_conv1d_update`` (qwen3_next, qwen3_5, kimi_linear, olmo_hybrid,
bailing_hybrid, lara_mini; 5.17 and 5.24), Dao's ``causal_conv1d_ref`` / ``_update_ref`` (vLLM's
tests), FLA's ``causal_conv1d_ref_torch`` and vLLM's CPU ``causal_conv1d_update_torch``.

The decode form: when the ``cat``'s state is a graph input that the graph writes back with the
cat's last ``S`` columns (``conv_state.copy_(new[:, :, -S:])``), the write is fused too, and the
op shifts the state in place (``auto_functionalized``, re-inplaced by Inductor).

The op takes ``x`` where it lies (the projection's token-major memory) and writes its result
token-major, so the consumers' ``transpose(1, 2)`` and split into q / k / v are views. The cat
form: where ``x`` is ``cat(parts, -1).transpose(1, 2)`` (Qwen3-Next's ``cat((q, k, v))`` of
reshaped views of its ``qkvz`` projection; Kimi Linear's and Bailing's of three projections), the
``_cat`` ops read the parts' sources (``src`` of a part ``view(clone(src))``) and the cat, clones
and views go: no concatenated copy. Other readers of ``x``'s last tokens (the cache's state write
of a first prefill: ``x[..., -K:]`` or ``F.pad(x, (K - T, 0))``) are rebuilt from the sources'
last tokens; where the cat is read otherwise, the single-source op reads it (a miss at the cat).

Where the silu cannot be fused (the conv's output is also read before it, or a bias is added
after the conv), the conv is still rewritten alone (``part`` says so) and the miss says why. Not
matched, with the reason at the user's line: a dilated or strided conv, a kernel wider than
``MAX_WIDTH``, groups that are not one per channel, outputs that are not the causal window, a
state narrower than ``K - 1`` columns or written through a narrowing cast. Varlen convs written
as gathers (``examples/gdn_layers.py``'s ``causal_conv_varlen``) and sums of shifted products are
no ``aten.convolution``: Inductor fuses them into one pointwise kernel already.

Speed rule (``speed_rule``): on CUDA every size (``CUDA_MIN_TOKENS = 1``): aten runs the conv as
``conv_depthwise2d_forward_kernel_generic`` at about ten times the copy floor, with Inductor's
layout copies around it, where the op reads and writes each byte once; measured on an H200 at
Qwen3-Next's 8192 channels, faster than stock at every T from 1 to 4096 (0.34-0.54x), 840 us of
the 10,510 us Qwen3-Next prefill-4096 step saved (``benchmarks/results/causal_conv1d.md``,
``hf_models.md``; the history: ``docs/speed-rules.md``). On CPU never: the op's CPU
implementation is aten's own conv with the activation unfused.

Replacement (:func:`conv`, :func:`conv_update`): the op (``_cat`` for the cat form), viewed as the
user's output was. Off: ``options={"kda": {"disable": ["causal_conv1d"]}}``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch.fx.experimental.symbolic_shapes import is_concrete_int
from torch.fx.experimental.symbolic_shapes import statically_known_true as definitely

from kda_inductor.lowerings import causal_conv1d as _lowering  # registers the ops
from kda_inductor.patterns._graph import copy_into, downstream
from kda_inductor.patterns.base import (
    SHAPE_VIEWS,
    VIEWS,
    Match,
    Rewrite,
    Stage,
    aten,
    cuda_min_count_rule,
    in_graph_order,
    is_op,
    live_users,
    prims,
    replace_by_function,
    val,
)
from kda_inductor.patterns.canonical import Canon, Term

CUDA_MIN_TOKENS = 1
"""Tokens per conv (``B * T``, static) from which the op runs on CUDA: 1, the crossover
``benchmarks/bench_causal_conv1d.py`` measured on the H200 (faster at every size); a symbolic
count is rewritten as long as this is 1 (then no size is slower)."""
_CASTS = (prims.convert_element_type, aten._to_copy)
_TIME = 2
_MAX_SILU_DEPTH = 6
"""Nodes between the conv's value and its silu (the decomposed ``x / (1 + exp(-x))`` and casts)."""


@dataclasses.dataclass
class _Input:
    """The conv's input read back: ``x [B, C, T]``, the state in front (or None) and the number
    of columns in front of ``x`` (a state's width or zero padding)."""

    x: fx.Node
    state: fx.Node | None
    prefix: Any
    cat: fx.Node | None  # the cat of [state, x] (cast or not) where there is one
    nodes: set[fx.Node]
    # the cat form: the sources the op reads (:func:`_cat_sources`), the transpose, cat, clones and
    # views they replace (in ``nodes``), the other readers of x's last tokens -> (n, zeros) (:func:`_tail`)
    sources: list[fx.Node] | None = None
    cat_nodes: set[fx.Node] = dataclasses.field(default_factory=set)
    tails: dict[fx.Node, tuple[int, int]] = dataclasses.field(default_factory=dict)

    def drop_cat_form(self) -> None:
        """Read ``x`` itself (its cat stays): the single-source op."""
        self.nodes -= self.cat_nodes
        self.sources, self.cat_nodes, self.tails = None, set(), {}


@dataclasses.dataclass
class _Chain:
    """What follows the conv: the node whose value the op replaces, the window of the conv's
    outputs it holds, the activation and dtypes."""

    output: fx.Node
    start: Any
    end: Any
    activation: str
    act_dtype: torch.dtype
    out_dtype: torch.dtype
    nodes: set[fx.Node]


@dataclasses.dataclass
class _StateWrite:
    """The decode form's write of the new state: ``copy`` (functional ``aten.copy`` or the
    final ``copy_``) of ``value`` (the cat's last S columns) into the state input."""

    value: fx.Node
    copy: fx.Node
    nodes: set[fx.Node]

    @property
    def functional(self) -> bool:
        return is_op(self.copy, aten.copy)

    @property
    def output(self) -> fx.Node:
        """The node whose readers get the new state: the functional copy, or (read by the
        user's ``copy_``) the value."""
        return self.copy if self.functional else self.value


@dataclasses.dataclass(frozen=True)
class ConvMatch(Match):
    conv: fx.Node
    weight: fx.Node
    bias: fx.Node | None
    input: _Input
    chain: _Chain
    write: _StateWrite | None

    @property
    def part(self) -> str:
        what = "conv + state update" if self.write is not None else "conv"
        return what + (" + silu" if self.chain.activation == "silu" else "")

    @property
    def anchor(self) -> fx.Node:
        return self.conv


def _dtype(n: Any) -> torch.dtype | None:
    return getattr(val(n), "dtype", None)


def _widens(src: torch.dtype | None, dst: torch.dtype | None) -> bool:
    """Every ``src`` value is exactly a ``dst`` value."""
    return src == dst or (dst == torch.float32 and src in (torch.bfloat16, torch.float16))


def _uncast(n: Any, dtype: torch.dtype | None) -> Any:
    """``n`` without one cast to ``dtype`` in front of it (the op converts its inputs itself)."""
    if is_op(n, *_CASTS) and _dtype(n) == dtype and set(n.kwargs) <= {"dtype"}:
        return n.args[0]
    return n


def _kept_inputs(nodes: set[fx.Node], region: set[fx.Node]) -> set[fx.Node]:
    """The input's cat / pad / casts that only the region reads (erased with it); the others
    stay for their other readers (the op reads ``x`` and the state, not them)."""
    kept = set(nodes)
    changed = True
    while changed:
        changed = False
        for n in list(kept):
            if any(u not in region and u not in kept for u in live_users(n)):
                kept.discard(n)
                changed = True
    return kept


def _time_slice(n: fx.Node, length: Any) -> tuple[Any, Any] | None:
    """``(start, end)`` of ``n``, a step-1 slice of the time dim of a value ``length`` long,
    normalized as Python slicing does; else None."""
    if not (is_op(n, aten.slice) and n.target is aten.slice.Tensor):
        return None
    src = val(n.args[0])
    dim = n.args[1] if len(n.args) > 1 else 0
    start = n.args[2] if len(n.args) > 2 else 0
    end = n.args[3] if len(n.args) > 3 else None
    step = n.args[4] if len(n.args) > 4 else 1
    if src is None or dim % src.dim() != _TIME or step != 1:
        return None
    start, end = (val(a) if isinstance(a, fx.Node) else a for a in (start, end))
    start = 0 if start is None else start
    if definitely(start < 0):  # counted from the end (symbolic too: x[..., -seq_len:])
        start = length + start
    if end is None or (isinstance(end, int) and end >= 2**62) or definitely(end >= length):
        end = length
    elif definitely(end < 0):
        end = length + end
    return start, end


def _rounding(prev: torch.dtype, cast: torch.dtype) -> torch.dtype | None:
    """The one rounding of a float32 sum rounded to ``prev`` and then cast to ``cast``, or None
    when the two roundings are not one (bf16 <-> fp16)."""
    if prev == torch.float32 or prev == cast:
        return cast
    return prev if cast == torch.float32 else None


class CausalConv1d(Rewrite):
    name = "causal_conv1d"
    finds = ("a GDN / KDA layer's depthwise causal short conv (`F.conv1d(..., padding=K - 1, groups=C)[..., :T]`, "
             "prefill and the cached decode update) with its silu and casts")
    spellings = (
        "a depthwise causal short conv (`F.conv1d(x, w, bias, padding=K - 1, groups=C)[..., :T]`, or on `torch.cat(["
        "state, x], -1)` / `F.pad(x, (P, 0))`, K <= 8) with its silu and casts, as transformers' GDN / KDA layers (and "
        "Mamba's `nn.Conv1d`), Dao's causal-conv1d references (vLLM's tests), FLA's `causal_conv1d_ref_torch` and "
        "vLLM's CPU fallback spell it; the decode form's `conv_state.copy_(new[:, :, -S:])` too; on `torch.cat((q, k, "
        "v), -1).transpose(1, 2)` (Qwen3-Next's reshaped views of its `qkvz` projection, Kimi Linear's and Bailing's "
        "three projections) the op reads q / k / v without the cat, a first prefill's state write (`x[..., -K:]`, "
        "`F.pad(x, (K - T, 0))`) from their last tokens")
    becomes = ("`kda::causal_conv1d` / `kda::causal_conv1d_update` (one Triton kernel reading x where it lies, "
               "token-major output; the state shifted in place; `_cat`: q / k / v read without their cat)")
    # it touches only convolutions and the values around them; the split's speed rule (do a gather's
    # readers fuse it as an indirect load?) must see the fused op that reads a gathered mixed_qkv
    runs_before = ("gdn_spec_split",)

    def find(self, graph: fx.Graph) -> list[Match]:
        canon = Canon()
        convs = [n for n in graph.nodes if n.target is aten.convolution.default]
        return [m for m in (self._match(n, canon) for n in convs) if m is not None]

    def speed_rule(self, match: ConvMatch) -> str | None:
        if match.device == "cuda":
            tokens = val(match.input.x).shape[0] * val(match.input.x).shape[_TIME]
            return cuda_min_count_rule(tokens, CUDA_MIN_TOKENS, "tokens", "causal_conv1d.py", faster_than="aten's conv")
        return (f"on {match.device} the op's implementation is aten's conv (the one Inductor calls) with the "
                "activation unfused: no faster than Inductor's code (see patterns/causal_conv1d.py)")

    # ------------------------------------------------------------------ matching
    def _match(self, conv: fx.Node, canon: Canon) -> ConvMatch | None:
        form = self._form(conv)
        if form is None:
            return None
        weight, bias, padding, width = form
        inp = self._input(conv, _dtype(weight))
        chain = None if inp is None else self._chain(conv, canon)
        if chain is None or not self._causal(conv, inp, chain, padding, width):
            return None
        write = self._state_write(conv, inp)
        if write is False or not self._validated(conv, inp, weight, bias, chain, write):
            return None
        region = {conv} | chain.nodes | (write.nodes if write else set())
        region |= self._input_region(inp, region)
        outputs = [chain.output] + ([write.output] if write else []) + list(inp.tails)
        if not self.region_closed(region, outputs, at=conv, what="a value between the conv and its output"):
            return None
        return ConvMatch(nodes=in_graph_order(region), conv=conv, weight=weight, bias=bias, input=inp,
                         chain=chain, write=write or None)

    def _form(self, conv: fx.Node):
        """``(weight, bias, padding, K)`` of a 1-D depthwise conv the op computes; else None,
        with a ``Stage.FORM`` miss for short-conv candidates (1-D, grouped or causally padded)."""
        x, w, bias, stride, padding, dilation, transposed, output_padding, groups = conv.args
        xv, wv = val(x), val(w)
        if xv is None or wv is None or xv.dim() != 3 or transposed:
            return None  # not a 1-D conv (or a transposed one): no short conv
        channels, width = xv.shape[1], wv.shape[-1]
        causal_look = list(padding) == [width - 1] or groups > 1
        if not causal_look:
            return None
        why = None
        if not (groups == channels and wv.shape[0] == channels and wv.shape[1] == 1):
            why = f"not depthwise: {groups} groups over {channels} channels, weight {list(wv.shape)}"
        elif list(dilation) != [1]:
            why = f"a dilated conv (dilation {list(dilation)[0]})"
        elif list(stride) != [1]:
            why = f"a strided conv (stride {list(stride)[0]})"
        elif not isinstance(width, int):
            why = f"the kernel width {width} is symbolic (the op needs it static: torch._dynamo.mark_static)"
        elif width > _lowering.MAX_WIDTH:
            why = f"kernel width {width} is wider than the op's {_lowering.MAX_WIDTH}"
        elif any(p != 0 for p in output_padding) or len(padding) != 1:
            why = "output padding"
        if why:
            return self.miss(conv, Stage.FORM, why)
        return w, bias, padding[0], width

    def _input(self, conv: fx.Node, dtype: torch.dtype) -> _Input | None:
        """The conv's input (:class:`_Input`): ``[prefix | x]``, and ``x``'s sources where it is their cat."""
        inp = self._prefixed(conv, dtype)
        cat_form = None if inp is None else _cat_sources(inp.x)
        if cat_form is not None:
            inp.sources, inp.cat_nodes = cat_form
            inp.nodes |= inp.cat_nodes
        return inp

    def _prefixed(self, conv: fx.Node, dtype: torch.dtype) -> _Input | None:
        """The conv's input as ``[prefix | x]``: a state's cat, a zero pad or ``x`` itself."""
        inp = conv.args[0]
        base = _uncast(inp, dtype)
        nodes = {inp} if base is not inp else set()
        if is_op(base, aten.cat) and len(base.args[0]) == 2 and base.args[1] % 3 == _TIME:
            state, x = (_uncast(a, dtype) for a in base.args[0])
            nodes |= {base} | {a for a in base.args[0] if a is not _uncast(a, dtype)}
            return _Input(x, state, val(state).shape[_TIME], base, nodes)
        if is_op(base, aten.constant_pad_nd):
            pad = list(base.args[1])
            value = base.args[2] if len(base.args) > 2 else 0
            if len(pad) != 2 or pad[1] != 0 or value != 0:
                return self.miss(conv, Stage.FORM, f"the input is padded {pad} with {value}: not a causal pad")
            return _Input(_uncast(base.args[0], dtype), None, pad[0], None, nodes | {base})
        return _Input(base, None, 0, None, nodes)

    def _chain(self, conv: fx.Node, canon: Canon) -> _Chain | None:
        """Walk the conv's value forward (see :class:`_Chain`): time slices, casts, the silu,
        one cast after it, unit-dim views."""
        cur, (start, end) = conv, (0, val(conv).shape[_TIME])
        rounding, act, out_dtype, nodes = _dtype(conv), "none", None, set()
        while True:
            silu = self._silu_of(cur, canon) if act == "none" else None
            if silu is not None:
                act, cur = "silu", silu[0]
                nodes |= silu[1]
                continue
            step = self._step(cur, start, end, rounding, act, out_dtype)
            if step is None:
                break
            cur, start, end, rounding, out_dtype = step
            nodes.add(cur)
        if act == "none":
            self._silu_left(cur, canon)
        return _Chain(cur, start, end, act, rounding, out_dtype or _dtype(cur), nodes)

    def _step(self, cur, start, end, rounding, act, out_dtype):
        """The one user of ``cur`` that continues the chain: ``(node, start, end, rounding,
        out_dtype)``, or None."""
        users = live_users(cur)
        if len(users) != 1 or out_dtype is not None and not is_op(users[0], aten.slice, *SHAPE_VIEWS):
            return None
        u = users[0]
        window = _time_slice(u, val(cur).shape[_TIME] if val(cur).dim() == 3 else None)
        if window is not None:
            return u, start + window[0], start + window[1], rounding, out_dtype
        if is_op(u, *SHAPE_VIEWS) and _keeps_time(cur, u):
            return u, start, end, rounding, out_dtype
        if is_op(u, *_CASTS) and _dtype(u) in _lowering.FLOATS:
            if act == "silu":
                return u, start, end, rounding, _dtype(u)
            r = _rounding(rounding, _dtype(u))
            return None if r is None else (u, start, end, r, None)
        return None

    def _silu_of(self, cur: fx.Node, canon: Canon) -> tuple[fx.Node, set[fx.Node]] | None:
        """The silu of ``cur``'s value (through its float32 cast) when it is ``cur``'s only
        reader: ``(silu node, its nodes)``."""
        users = live_users(cur)
        if len(users) != 1:
            return None
        me = canon(cur)
        for n in downstream(cur, _MAX_SILU_DEPTH):
            t = canon(n)
            if isinstance(t, Term) and t.op == "silu" and _reads(t.args[0], me):
                region = canon.region(t, stop=lambda s: s == me) | {n}
                if all(u in region or u is n for r in region - {n} for u in live_users(r)) and \
                        all(a in region or a is cur for r in region for a in r.all_input_nodes if a is not cur):
                    return n, region
        return None

    def _silu_left(self, cur: fx.Node, canon: Canon) -> None:
        """A miss where a silu reads the conv's output (or the conv's output plus something)
        but could not be fused."""
        me = canon(cur)
        for n in downstream(cur, _MAX_SILU_DEPTH):
            t = canon(n)
            if not (isinstance(t, Term) and t.op == "silu"):
                continue
            users = live_users(cur)
            if _reads(t.args[0], me):
                why = (f"the conv's output is also read elsewhere ({users[-1].name}) before the activation"
                       if len(users) > 1 else "an intermediate of the activation is read elsewhere")
            elif len(users) == 1 and is_op(users[0], aten.add, aten.sub) and n in downstream(users[0], 4):
                other = [a for a in users[0].args if isinstance(a, fx.Node) and a is not cur]
                shape = list(val(other[0]).shape) if other else "a scalar"
                why = (f"a bias ({shape}) is added after the conv: it rounds after the conv's sum, unlike "
                       "F.conv1d's bias=")
            else:
                continue
            self.miss(n, Stage.REGION, f"the silu is not fused into kda.causal_conv1d: {why} (the conv alone is)")
            return

    def _causal(self, conv: fx.Node, inp: _Input, chain: _Chain, padding: Any, width: int) -> bool:
        """The chain's window is ``x``'s ``T`` causal outputs: output ``t`` ends at token ``t``."""
        tokens = val(inp.x).shape[_TIME]
        first = inp.prefix + padding - (width - 1)
        if definitely(chain.start == first) and definitely(chain.end - chain.start == tokens):
            return True
        self.miss(conv, Stage.LAYOUT, f"not a causal conv: the outputs used are [{chain.start}, {chain.end}) of the "
                  f"conv (padding {padding}, width {width}), not the {tokens} whose windows end at x's tokens "
                  f"(from {first})")
        return False

    def _state_write(self, conv: fx.Node, inp: _Input):
        """The decode form's state write (:class:`_StateWrite`), None where there is none, False
        (a miss) where it cannot be fused."""
        state = inp.state
        if state is None or state.op not in ("placeholder", "get_attr"):
            return None
        for src in (inp.cat, *[u for u in inp.cat.users if is_op(u, *_CASTS)]):
            for s in src.users:
                copy = copy_into(s, state)
                if copy is None:
                    continue
                length = val(src).shape[_TIME]
                window = _time_slice(s, length)
                if window is None or not (definitely(window[0] == length - val(state).shape[_TIME])
                                          and definitely(window[1] == length)):
                    return self.miss(copy, Stage.ADDRESSING, "the state is written with other columns than "
                                     "the last S of [state | x]")
                if not all(_widens(_dtype(a), _dtype(src)) for a in (state, inp.x)):
                    return self.miss(copy, Stage.VALUES, f"the state is written through a narrowing cast to {_dtype(src)}")
                return _StateWrite(s, copy, {s} | ({copy} if is_op(copy, aten.copy) else set()))
        return None

    def _input_region(self, inp: _Input, region: set[fx.Node]) -> set[fx.Node]:
        """:func:`_kept_inputs` of the input. The cat form's other readers of ``x`` that take its
        last tokens (the cache's state write of a first prefill) join the region, rebuilt from the
        sources; where the cat is read otherwise, the single-source op reads it (it is written
        anyway), with a miss at the cat's line: the concatenated copy stays."""
        kept = _kept_inputs(inp.nodes, region)
        cat = None if inp.sources is None else inp.x.args[0]
        if cat is None or {inp.x, cat} <= kept:
            return kept
        others = [u for n in (cat, inp.x) for u in live_users(n) if u not in region | kept | {inp.x}]
        tails = {u: _tail(u, inp.x) for u in others}
        if all(tails.values()):
            inp.tails = tails
            return _kept_inputs(inp.nodes, region | set(tails)) | set(tails)
        reader = next(u for u, t in tails.items() if t is None)
        self.miss(cat, Stage.REGION, f"the cat of the conv's {len(inp.sources)} inputs stays (kda.causal_conv1d "
                  f"reads it, not its parts): it is also read elsewhere ({reader.name})")
        inp.drop_cat_form()
        return _kept_inputs(inp.nodes, region)

    def _validated(self, conv, inp: _Input, weight, bias, chain: _Chain, write) -> bool:
        options = (val(weight), val(bias), val(inp.state), None, chain.activation, chain.act_dtype, chain.out_dtype)
        state_arg = "conv_state" if write else "initial_state"
        if inp.sources is not None:
            try:
                _lowering.validate_sources([val(s) for s in inp.sources], *options, state_arg=state_arg)
            except (ValueError, TypeError) as exc:
                self.miss(inp.x.args[0], Stage.VALIDATED, f"kda.causal_conv1d_cat rejects the cat's parts ({exc}): "
                          "the cat stays, kda.causal_conv1d reads it")
                inp.drop_cat_form()
        try:
            _lowering.validate(val(inp.x), *options, state_arg=state_arg)
        except (ValueError, TypeError) as exc:
            self.miss(conv, Stage.VALIDATED, f"kda.causal_conv1d rejects these inputs: {exc}")
            return False
        return True

    # ------------------------------------------------------------------ replacing
    def replace(self, graph: fx.Graph, match: ConvMatch) -> None:
        m, c = match, match.chain
        x = m.input.x if m.input.sources is None else list(m.input.sources)
        inputs = [n for n in (*(x if isinstance(x, list) else [x]), m.weight, m.bias, m.input.state)
                  if isinstance(n, fx.Node)]
        options = (c.activation, c.act_dtype, c.out_dtype, list(val(c.output).shape), list(m.input.tails.values()))
        if m.write is None:
            fn, args, outputs = conv, (x, m.weight, m.bias, m.input.state, *options), [c.output]
        else:
            fn, args = conv_update, (x, m.input.state, m.weight, m.bias, *options)
            outputs = [c.output, m.write.output]
        outputs += list(m.input.tails)
        made = replace_by_function(graph, fn, args, outputs=outputs, before=in_graph_order(inputs)[-1].next,
                                   region=m.nodes, origin=m.conv)
        _drop_layout_copy(graph, made[0])


def _drop_layout_copy(graph: fx.Graph, n: fx.Node) -> None:
    """The user's ``.transpose(1, 2).contiguous()`` of the output, a no-op on the op's layout: the
    views' values recomputed, the clone erased (one chain of single users: no output aliases)."""
    with detect_fake_mode([val(n)]):
        while len(n.users) == 1 and is_op(u := next(iter(n.users)), aten.permute, *SHAPE_VIEWS):
            u.meta["val"], n = u.target(val(n), *fx.node.map_arg(u.args[1:], val), **u.kwargs), u
    a, u = val(n), next(iter(n.users), None)
    if len(n.users) == 1 and is_op(u, aten.clone) and a.dtype == val(u).dtype and all(
            definitely(p == q) for p, q in zip(a.stride() + a.shape, val(u).stride() + val(u).shape)):
        u.replace_all_uses_with(n)
        graph.erase_node(u)


def conv(x, weight, bias, initial_state, activation, act_dtype, out_dtype, shape, tails):
    """The replacement (prefill): the conv and its activation in one op, viewed as the user's
    output was. ``x``: the conv's input ``[B, C, T]``, or (the cat form) the sources it is the cat
    of, with the cat's other readers (``tails``) rebuilt from their last tokens."""
    op = torch.ops.kda.causal_conv1d_cat if isinstance(x, list) else torch.ops.kda.causal_conv1d
    y = op(x, weight, bias, initial_state, None, activation, act_dtype, out_dtype)
    return y.reshape(shape), [last_tokens(x, n, zeros) for n, zeros in tails]


def conv_update(x, conv_state, weight, bias, activation, act_dtype, out_dtype, shape, tails):
    """The replacement (decode): the conv continuing ``conv_state``, which the op shifts in place;
    returns the output and the new state. ``x`` and ``tails`` as :func:`conv`'s."""
    op = torch.ops.kda.causal_conv1d_update_cat if isinstance(x, list) else torch.ops.kda.causal_conv1d_update
    y = op(x, conv_state, weight, bias, activation, act_dtype, out_dtype)
    return y.reshape(shape), conv_state, [last_tokens(x, n, zeros) for n, zeros in tails]


def last_tokens(xs, n, zeros):
    """``F.pad(x[:, :, -n:], (zeros, 0))`` of the cat form's ``x``, from its sources' last ``n``
    tokens (a cat of ``n`` tokens, not of all)."""
    x = torch.cat([s[:, -n:].flatten(2) for s in xs], -1).transpose(1, 2)
    return torch.constant_pad_nd(x, [zeros, 0]) if zeros else x


def _cat_sources(x: fx.Node) -> tuple[list[fx.Node], set[fx.Node]] | None:
    """``(sources, nodes)`` where ``x [B, C, T]`` is ``cat(parts, -1).transpose(1, 2)`` of token-major
    parts ``[B, T, C_i]`` (the q / k / v of a GDN layer): each part's source (:func:`_source`) and
    the transpose, the cat and the clones and views the sources make unneeded; else None."""
    if not (is_op(x, aten.permute) and list(x.args[1]) == [0, 2, 1]):
        return None
    cat = x.args[0]
    if not is_op(cat, aten.cat) or val(cat) is None or val(cat).dim() != 3:
        return None
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    if dim % 3 != _TIME:
        return None
    found = [_source(p) for p in cat.args[0]]
    return [s for s, _ in found], {x, cat}.union(*(n for _, n in found))


def _tail(u: fx.Node, x: fx.Node) -> tuple[int, int] | None:
    """``(n, zeros)`` where ``u`` is ``x[..., -n:]`` (transformers 5.24's state write) or ``F.pad(x,
    (K - T, 0))`` (5.17's): ``x``'s last ``n`` tokens (static) after ``zeros`` zero columns."""
    if u.args[0] is not x:
        return None
    tokens, window = val(x).shape[_TIME], _time_slice(u, val(x).shape[_TIME])
    if window is not None and definitely(window[1] == tokens):
        n, zeros = tokens - window[0], 0
    elif is_op(u, aten.constant_pad_nd) and len(u.args[1]) == 2 and u.args[1][1] == 0 and \
            (u.args[2] if len(u.args) > 2 else 0) == 0 and isinstance(u.args[1][0], int):
        n, zeros = (tokens + u.args[1][0], 0) if u.args[1][0] < 0 else (tokens, u.args[1][0])
    else:
        return None
    return (int(n), zeros) if is_concrete_int(n) and int(n) >= 1 else None


def _source(part: fx.Node) -> tuple[fx.Node, set[fx.Node]]:
    """What the cat form reads for one part of the cat: ``src [B, T, ...]`` (3-D or 4-D) where the
    part is views of ``clone(src)`` (the reshape of a strided view: ``q.reshape(B, T, -1)`` of a
    split of the projection), with the clone and views; else the part itself."""
    base, nodes = part, {part}
    while is_op(base, *VIEWS):
        base = base.args[0]
        nodes.add(base)
    src = val(base.args[0]) if is_op(base, aten.clone) else None
    if src is not None and src.dim() in (3, 4) and all(definitely(a == b) for a, b in zip(src.shape, val(part).shape[:2])):
        return base.args[0], nodes
    return part, set()


def _keeps_time(cur: fx.Node, view: fx.Node) -> bool:
    """A view of ``cur [B, C, L]`` that only adds or drops unit dims (``squeeze(-1)`` of one
    decode token)."""
    a, b = val(cur), val(view)
    if a is None or b is None:
        return False
    return [s for s in a.shape if s != 1] == [s for s in b.shape if s != 1] and a.dim() == 3 and \
        all(definitely(s > 1) or s == 1 for s in a.shape)


def _reads(t: Any, me: Term) -> bool:
    """The silu's argument is ``me`` or its float32 cast."""
    return t == me or (isinstance(t, Term) and t.op == "cast" and t.args[0] == me and
                       t.attr("dtype") == torch.float32)
