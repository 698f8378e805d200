"""``gdn_recurrent_step`` compiled: transformers' recurrent cores (Qwen3-Next's GDN with its GQA
repeat, Kimi's KDA with a decay per key channel) as a decode step writing its cache, FLA's
references (einsum contractions), the near misses each with its reason at this file's line, the
speed rule, ``disable``, symbolic batch sizes, and what ``gated_norm_merge`` does after the op.
Every compiled run is compared with eager on fresh random inputs (a random, never zero, state),
the state bit for bit where the op's float32 loop is eager's, else within float32 rounding.
The op itself: ``tests/test_lowering_gdn_recurrent_step.py``; the corpus:
``tests/spellings/cases_gdn_recurrent.py``."""

from __future__ import annotations

import pytest
import torch

from kda_inductor.testing import assert_close_to_eager, compile_for_test, fresh_compile, op_counts
from tests.helpers import clones, eager
from tests.spellings.cases_gdn_recurrent import fla_naive_recurrent_kda  # FLA's naive_recurrent_kda

BF = torch.bfloat16
B, HK, HV, D = 2, 2, 4, 16
FORCED = {"kda": {"force": True, "strict": True}}
NAME = "gdn_recurrent_step"


def _run(fn, *args, options=FORCED, **kw):
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(fn, options=options, **kw)
        out = c(*args)
    return out, c


def _parts(c) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in c.records:
        for part, n in r.parts.get(NAME, {}).items():
            out[part] = out.get(part, 0) + n
    return out


def _checks(c) -> dict[str, str]:
    """Each miss's reason -> its location (the user's line)."""
    return {m.check: m.location for r in c.records for m in r.misses.get(NAME, [])}


def inputs(seed, T, *, hk=HK, hv=HV, kda=False, head_major=False, batch=B):
    """Fresh q, k, v (bf16), g (float32, log-space), beta (bf16), state (float32, random)."""
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(batch, T, hk, D, generator=g).to(BF) for _ in range(2))
    v = torch.randn(batch, T, hv, D, generator=g).to(BF)
    gate = -torch.rand(batch, T, hv, *((D,) if kda else ()), generator=g)
    beta = torch.rand(batch, T, hv, generator=g).to(BF)
    state = torch.randn(batch, hv, D, D, generator=g) * 0.5
    xs = [q, k, v, gate, beta]
    if head_major:
        xs = [x.transpose(1, 2).contiguous() for x in xs]
    return [*xs, state]


def _check(fn, args, *, matches=1, exact_state=True):
    """Compile ``fn``, compare outputs and the mutated arguments with eager; returns the compile."""
    want_args = clones(args)
    want = eager(fn, *want_args)
    out, c = _run(fn, *args)
    assert c.matches[NAME] == matches, (c.matches, _checks(c), c.diff())
    assert_close_to_eager(out, want)
    assert_close_to_eager(args, want_args, exact=exact_state)
    return c


# --------------------------------------------------------------------------- transformers


def _hf(module):
    return pytest.importorskip(f"transformers.models.{module}.modeling_{module}")


def torch_core(module: str, name: str):
    """transformers' torch reference core ``name`` itself, never the fla kernel its hub wrapper
    dispatches to where fla-core is installed (the GPU machine): 5.25 wraps it in a module whose
    ``forward`` calls the wrapper (``func``), older versions expose the wrapper, whose
    ``__wrapped__`` is the torch function."""
    import inspect

    fn = getattr(_hf(module), name)
    if isinstance(fn, torch.nn.Module):
        fn = inspect.getclosurevars(type(fn).forward).nonlocals.get("func", fn)
    fn = getattr(fn, "__wrapped__", fn)
    return fn if "repeat_interleave" in inspect.getsource(fn) else _layer_repeats_heads(fn)


def _layer_repeats_heads(core):
    """``core`` behind the GQA repeat its layer does before the call (transformers 5.17: its
    torch_recurrent_gated_delta_rule takes q / k with as many heads as v; 5.25 repeats inside)."""

    def repeated(q, k, v, *args, **kwargs):
        group = v.shape[2] // q.shape[2]
        if group > 1:
            q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
        return core(q, k, v, *args, **kwargs)

    return repeated


def hf_decode(core):
    """A decode step as transformers' layer runs it: the core continues the cache's state and the
    cache takes the new one (``update_recurrent_state``: ``copy_``)."""

    def step(q, k, v, g, beta, cache):
        out, new = core(q, k, v, g=g, beta=beta, initial_state=cache, output_final_state=True,
                        use_qk_l2norm_in_kernel=True)
        cache.copy_(new)
        return out

    return step


@pytest.mark.parametrize("T", [1, 3])
def test_qwen3_next_decode_in_place(T):
    """Qwen3-Next (also qwen3_5, olmo_hybrid, lara_mini: one function): GQA 2 -> 4 heads, the
    l2norm, the 1/sqrt(d) scale, fp32 casts and transposes, the output assembly and its bf16
    cast, the cache's copy_: one in-place op and nothing of the loop left."""
    core = torch_core("qwen3_next", "torch_recurrent_gated_delta_rule")
    c = _check(hf_decode(core), inputs(T, T))
    assert _parts(c) == {"state in place": 1}
    ops = op_counts(c)
    assert ops.after["kda.gdn_recurrent_step_inplace.default"] == 1
    for op in ("aten.sum.dim_IntList", "aten.exp.default", "aten.select_scatter.default", "aten.expand.default",
               "aten.rsqrt.default", "prims.convert_element_type.default"):
        assert ops.after[op] == 0, (op, ops.changed())
    assert ops.after["aten.copy_.default"] == ops.before["aten.copy_.default"] == 1  # the cache write, re-inplaced


def test_the_cache_is_written_in_place_in_the_output_code():
    """Inductor's code for the decode step: the in-place op on the cache argument itself, no
    clone of the state, no copy back (auto_functionalized re-inplaced)."""
    import re

    from torch._inductor.utils import run_and_get_code

    fn, args = hf_decode(torch_core("qwen3_next", "torch_recurrent_gated_delta_rule")), inputs(4, 1)
    want_args = clones(args)
    want = eager(fn, *want_args)
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(fn, options=FORCED)
        out, (code,) = run_and_get_code(c, *args)
    assert_close_to_eager([out, args], [want, want_args])
    call = re.search(r"torch\.ops\.kda\.gdn_recurrent_step_inplace\.default\((.*)\)", code)
    assert call and "arg5_1" in call.group(1).split(", ")[5:6], code
    assert "clone" not in code and not re.search(r"copy_\(|\.copy_", code), code


@pytest.mark.parametrize("T", [1, 2])
def test_kimi_decode_per_channel_decay(T):
    """Kimi Linear's ``recurrent_kimi_delta_attention``: token-major, ``g [B, T, H, K]``, the
    ``x / sqrt(sum(x * x) + eps)`` l2norm, ``o[:, i] = ...`` into a zeros buffer."""
    core = torch_core("kimi_linear", "recurrent_kimi_delta_attention")
    c = _check(hf_decode(core), inputs(10 + T, T, hk=HV, kda=True), exact_state=False)
    assert _parts(c) == {"state in place": 1}
    assert op_counts(c).after["aten.sum.dim_IntList"] == 0


def test_state_returned_is_the_functional_op():
    """No write-back: the core's new state is returned (transformers' prefill tail, FLA's
    ``output_final_state``): the functional op, the zeros state of ``initial_state=None`` too."""
    core = torch_core("qwen3_next", "torch_recurrent_gated_delta_rule")

    def fn(q, k, v, g, beta, state):
        o1, s1 = core(q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True,
                      use_qk_l2norm_in_kernel=True)
        o2, s2 = core(q, k, v, g=g, beta=beta, initial_state=None, output_final_state=True)
        return o1, s1, o2, s2

    c = _check(fn, inputs(3, 2), matches=2)
    assert _parts(c) == {"state returned": 2}
    assert op_counts(c).after["kda.gdn_recurrent_step.default"] == 2


# --------------------------------------------------------------------------- other spellings


def fla_gdn_ref(q, k, v, beta, g, h):
    """FLA's tests' ``recurrent_gated_delta_rule_ref``: head-major after ``transpose(1, 2)``, ``h.clone()``,
    the output an einsum (a ``bmm`` post-grad), the final state returned."""
    q, k, v, beta, g = (x.transpose(1, 2).contiguous().to(torch.float32) for x in (q, k, v, beta, g))
    o = torch.zeros(*v.shape).to(v)
    q = q * (1 / (q.shape[-1] ** 0.5))
    for i in range(q.shape[2]):
        b_q, b_k, b_v = q[:, :, i], k[:, :, i], v[:, :, i].clone()
        h = h.clone() * g[:, :, i].exp()[..., None, None]
        b_v = (b_v - (h.clone() * b_k[..., None]).sum(-2)) * beta[:, :, i][..., None]
        h = h.clone() + b_k.unsqueeze(-1) * b_v.unsqueeze(-2)
        o[:, :, i] = torch.einsum("bhd,bhdm->bhm", b_q, h)
    return o.transpose(1, 2).to(BF), h


def einsum_head_major(q, k, v, g, beta, state):
    """Einsum contractions for the state read, the update and the output; outputs stacked."""
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    q, S, outs = q * D ** -0.5, state, []
    for t in range(q.shape[2]):
        S = S * torch.exp(g[:, :, t])[:, :, None, None]
        kv = torch.einsum("bhk,bhkv->bhv", k[:, :, t], S)
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, :, t], (v[:, :, t] - kv) * beta[:, :, t, None])
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))
    state.copy_(S)
    return torch.stack(outs, 2).to(BF)


@pytest.mark.parametrize("case", ["fla_gdn_ref", "fla_naive_recurrent_kda", "einsum_head_major"])
def test_reference_spellings(case):
    """Each a rewrite, within float32 rounding of eager (the einsums' bmm sums in another order)."""
    if case == "fla_gdn_ref":
        q, k, v, g, beta, state = inputs(20, 3, hk=HV)
        fn, args, part = fla_gdn_ref, [q, k, v, beta, g, state], "state returned"
    elif case == "fla_naive_recurrent_kda":
        fn, args, part = fla_naive_recurrent_kda, inputs(21, 2, kda=True), "state returned"
    else:
        fn, args, part = einsum_head_major, inputs(22, 2, hk=HV, head_major=True), "state in place"
    c = _check(fn, args, exact_state=False)
    assert _parts(c) == {part: 1}


# --------------------------------------------------------------------------- near misses


def gated_linear_attention(q, k, v, g, beta, state):
    S = state * g[:, 0].exp()[..., None, None]
    S = S + k[:, 0].float()[..., None] * v[:, 0].float()[..., None, :]  # GLA: no delta rule
    state.copy_(S)
    return (S * q[:, 0].float()[..., None]).sum(-2)


def decay_after_update(q, k, v, g, beta, state):
    kt = k[:, 0].float()
    delta = (v[:, 0].float() - (state * kt[..., None]).sum(-2)) * beta[:, 0].float()[..., None]
    S = state + kt[..., None] * delta[..., None, :]  # the decay after the update
    S = S * g[:, 0].exp()[..., None, None]
    state.copy_(S)
    return (S * q[:, 0].float()[..., None]).sum(-2)


def delta_rule_step(S, q, k, v, g, beta, t=0):
    """One token of the gated delta rule (token-major, float32 or not): ``(new state, output)``."""
    kt = k[:, t]
    S = S * g[:, t].exp()[..., None, None]
    S = S + kt[..., None] * ((v[:, t] - (S * kt[..., None]).sum(-2)) * beta[:, t][..., None])[..., None, :]
    return S, (S * q[:, t][..., None]).sum(-2)


def bf16_cache(q, k, v, g, beta, cache):
    S, o = delta_rule_step(cache.float(), *(x.float() for x in (q, k, v, g, beta)))  # the bf16 cache's upcast
    cache.copy_(S)
    return o


def bf16_recurrence(q, k, v, g, beta, state):
    S, o = delta_rule_step(state, q, k, v, g, beta)  # every tensor bf16
    state.copy_(S)
    return o


def _miss_at(c, words: str, line_text: str):
    """A miss whose reason holds ``words``, at this file's line holding ``line_text``."""
    import linecache

    hits = [loc for why, loc in _checks(c).items() if words in why]
    assert hits, (words, _checks(c))
    path, line = hits[0].rsplit(":", 1)
    assert path == __file__ and line_text in linecache.getline(path, int(line)), (hits, line_text)


@pytest.mark.parametrize("case", ["gla", "decay_after", "bf16_cache", "bf16_recurrence"])
def test_near_misses_are_named_at_the_users_line(case):
    """Not the op's computation (or not in its precision): nothing rewritten, Inductor's own code
    (compared with eager as stock is), the reason at the user's line."""
    args = inputs(30, 1, hk=HV)
    fn, words, line = {
        "gla": (gated_linear_attention, "a gated linear-attention update (S * exp(g) + k v^T): no delta rule",
                "# GLA: no delta rule"),
        "decay_after": (decay_after_update, "the decay is applied after the update", "# the decay after the update"),
        "bf16_cache": (bf16_cache, "the state is kept in torch.bfloat16 and cast to float32 here", "# the bf16 cache"),
        "bf16_recurrence": (bf16_recurrence, "the recurrence is computed in torch.bfloat16",
                            "S = S + kt[..., None] * ((v[:, t]"),
    }[case]
    if case.startswith("bf16"):
        args[5] = args[5].to(BF)
    if case == "bf16_recurrence":
        args[3] = args[3].to(BF)
    want_args = clones(args)
    want = eager(fn, *want_args)
    out, c = _run(fn, *args)
    assert c.matches[NAME] == 0
    _miss_at(c, words, line)
    if case != "bf16_recurrence":  # stock Inductor's bf16 recurrence rounds otherwise than eager's
        assert_close_to_eager([out, args], [want, want_args])


def test_more_tokens_than_the_limit():
    """Nine tokens (a prefill tail, not a verify window): left to Inductor, saying so."""
    from kda_inductor.patterns import gdn_recurrent_step as pattern

    core = torch_core("qwen3_next", "torch_recurrent_gated_delta_rule")
    T = pattern.MAX_TOKENS + 1

    def fn(q, k, v, g, beta, state):
        return core(q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True)

    out, c = _run(fn, *inputs(31, T))
    assert c.matches[NAME] == 0
    assert any(f"{T} tokens in one unrolled recurrence: more than the {pattern.MAX_TOKENS}" in why for why in _checks(c))


def test_a_data_dependent_token_count_breaks_the_graph():
    """``range(int(n))`` of a tensor: Dynamo breaks the graph at the ``.item()`` and specializes
    the count in the frame it resumes, so each count compiles a graph of its own, rewritten as a
    static count is (what the user sees: one graph break, one recompile per count)."""

    def fn(q, k, v, g, beta, state, n):
        outs = []
        for t in range(int(n)):  # data-dependent: a graph break
            S, o = delta_rule_step(state, *(x.float() for x in (q, k, v, g, beta)), t=t)
            state = S
            outs.append(o)
        return torch.stack(outs, 1), state

    args = inputs(32, 3, hk=HV)
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(fn, options=FORCED)
        for n in (2, 3):
            got = c(*args, torch.tensor(n))
            assert_close_to_eager(list(got), list(eager(fn, *args, torch.tensor(n))))
    assert c.matches[NAME] == 2 and sum(r.matches.get(NAME, 0) for r in c.records) == 2
    assert len([r for r in c.records if r.matches.get(NAME)]) == 2  # one graph per count


def test_intermediate_states_read_elsewhere_split_the_chain():
    """transformers' spec-decode tail keeps every token's state (``intermediate_recurrent_states``):
    a state read elsewhere ends a part; each part is one op continuing the last one's state."""
    core = torch_core("qwen3_next", "torch_recurrent_gated_delta_rule")

    def fn(q, k, v, g, beta, state):
        outs, states = [], []
        for i in range(q.shape[1]):
            o, state = core(q[:, i:i + 1], k[:, i:i + 1], v[:, i:i + 1], g=g[:, i:i + 1], beta=beta[:, i:i + 1],
                            initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True)
            outs.append(o)
            states.append(state)
        return torch.cat(outs, 1), torch.stack(states)

    c = _check(fn, inputs(33, 3), matches=3, exact_state=False)
    assert _parts(c) == {"state returned": 3}


# --------------------------------------------------------------------------- rules and options


def test_speed_rule_and_disable(monkeypatch):
    """CPU: left to Inductor by default, saying why (its C++ was measured faster); CUDA (the match's
    device reported as cuda here): rewritten at every batch until a measured ``CUDA_MIN_BATCH`` is
    set; ``disable`` turns it off (the whole-step A/B switch of ``benchmarks/hf_models.py``)."""
    from kda_inductor.patterns import gdn_recurrent_step as pattern

    core = torch_core("qwen3_next", "torch_recurrent_gated_delta_rule")
    fn, args = hf_decode(core), inputs(34, 1)
    rules = {"kda": {"force": False}}
    _, c = _run(fn, *clones(args), options=rules)
    assert c.matches[NAME] == 0
    assert any("on cpu the op's implementation" in m.check and m.stage.name == "SPEED_RULE"
               for r in c.records for m in r.misses[NAME]), _checks(c)
    _, c = _run(fn, *clones(args), options={"kda": {"force": True, "disable": [NAME]}})
    assert c.matches[NAME] == 0 and not _checks(c)
    monkeypatch.setattr(pattern.StepMatch, "device", "cuda")
    out, c = _run(fn, *clones(args), options=rules)
    assert c.matches[NAME] == 1
    monkeypatch.setattr(pattern, "CUDA_MIN_BATCH", 64)
    _, c = _run(fn, *clones(args), options=rules)
    assert c.matches[NAME] == 0 and any("from 64 sequences (this one: 2" in why for why in _checks(c)), _checks(c)


@pytest.mark.parametrize("mode", ["mark_dynamic", "dynamic"])
def test_symbolic_batch(mode):
    """A symbolic batch (``mark_dynamic`` on dim 0, or ``dynamic=True``): one graph for every
    batch, rewritten, in place, equal to eager at three sizes."""
    fn = hf_decode(torch_core("kimi_linear", "recurrent_kimi_delta_attention"))
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(fn, options=FORCED, dynamic=True if mode == "dynamic" else None)
        for batch in (3, 5, 7):  # not 2 or 4: dynamic=True's duck sizing would tie the batch to the heads
            args = inputs(35 + batch, 1, hk=HV, kda=True, batch=batch)
            if mode == "mark_dynamic":
                for a in args:
                    torch._dynamo.mark_dynamic(a, 0)
            want_args = clones(args)
            want = eager(fn, *want_args)
            assert_close_to_eager([c(*args), args], [want, want_args])
    assert len(c.records) == 1 and _parts(c) == {"state in place": 1}, (len(c.records), _parts(c))


def _producer_of_norm(graph_text: str) -> str:
    """The call that makes the norm's first source, through reshapes and getitems (graph text)."""
    import re

    calls = dict(re.findall(r"%(\w+) : \[[^]]*\] = call_function\[target=(.*)", graph_text))
    name = re.search(r"gated_norm_merge\.default\]\(args = \(\[%(\w+)", calls and graph_text).group(1)
    while re.match(r"(torch\.ops\.aten\.(reshape|view)|operator\.getitem)", calls[name]):
        name = re.search(r"args = \(%(\w+)", calls[name]).group(1)
    return calls[name]


def test_the_gated_norm_after_the_op(monkeypatch):
    """Qwen3-Next's layer after the core: ``Qwen3NextRMSNormGated`` of its output. With CUDA's rules
    (both matches' device reported as cuda), ``gated_norm_merge``'s rule in context reads the norm's
    producer (``base.inline_producer``): the op's output is a buffer of its own, no code Inductor
    would fuse into its norm kernel, so the norm is rewritten too and reads the op's bf16 output;
    nothing of the recurrence is left for Inductor to emit (the reduction that slowed Qwen3.5's decode when the norm left the graph is gone)."""
    from kda_inductor.patterns import gated_norm_merge as norm_pattern
    from kda_inductor.patterns import gdn_recurrent_step as pattern

    M = _hf("qwen3_next")
    norm = M.Qwen3NextRMSNormGated(D, eps=1e-6).to(BF)
    norm.weight.data = (1 + 0.1 * torch.randn(D, generator=torch.Generator().manual_seed(5))).to(BF)

    def layer(q, k, v, g, beta, cache, z):
        out = hf_decode(torch_core("qwen3_next", "torch_recurrent_gated_delta_rule"))(q, k, v, g, beta, cache)
        return norm(out.reshape(-1, D), z.reshape(-1, D))

    monkeypatch.setattr(pattern.StepMatch, "device", "cuda")
    monkeypatch.setattr(norm_pattern.NormMatch, "device", "cuda")
    args = inputs(51, 1) + [torch.randn(B, 1, HV, D, generator=torch.Generator().manual_seed(6)).to(BF)]
    want_args = clones(args)
    want = eager(layer, *want_args)
    out, c = _run(layer, *args, options={"kda": {"force": False}})
    assert c.matches[NAME] == 1 and c.matches["gated_norm_merge"] == 1, (c.matches, _checks(c))
    assert _producer_of_norm(c.records[0].after).startswith("torch.ops.higher_order.auto_functionalized"
                                                          "](args = (kda.gdn_recurrent_step_inplace")
    assert_close_to_eager([out, args], [want, want_args])


# --------------------------------------------------------------------------- the op's state written back
# the functional op as the fla rule traces fla-core's decode kernels (tests/test_dynamo_fixes.py), or
# as a user calls it: where its new state only goes back into the cache it started from, in place


def op_written_back(q, k, v, g, beta, state):
    o, new = torch.ops.kda.gdn_recurrent_step(q, k, v, g, beta, state, D**-0.5, True)
    state.copy_(new)
    return o * 2


def op_state_read_too(q, k, v, g, beta, state):
    o, new = torch.ops.kda.gdn_recurrent_step(q, k, v, g, beta, state, D**-0.5, True)
    state.copy_(new)
    return o, new * 0.5  # the new state read too


def op_into_another(q, k, v, g, beta, state, other):
    o, new = torch.ops.kda.gdn_recurrent_step(q, k, v, g, beta, state, D**-0.5, True)
    other.copy_(new)  # another buffer
    return o


def op_cache_read_after(q, k, v, g, beta, state):
    o, new = torch.ops.kda.gdn_recurrent_step(q, k, v, g, beta, state, D**-0.5, True)
    old = state.sum(-1)  # the old state after the step
    state.copy_(new)
    return o, old


def test_the_functional_ops_state_written_back_goes_in_place():
    """The op, then ``copy_`` of its new state into its initial state (a graph input): the
    in-place op on that buffer, no copy kernel left (Inductor's code reads the argument itself)."""
    import re

    from torch._inductor.utils import run_and_get_code

    args = inputs(40, 1)
    want_args = clones(args)
    want = eager(op_written_back, *want_args)
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(op_written_back, options=FORCED)
        out, (code,) = run_and_get_code(c, *args)
    assert c.matches[NAME] == 1 and _parts(c) == {"op's state in place": 1}, (c.matches, _checks(c))
    assert_close_to_eager([out, args], [want, want_args], exact=True)
    ops = op_counts(c)
    assert (ops.after["kda.gdn_recurrent_step.default"], ops.after["kda.gdn_recurrent_step_inplace.default"]) == (0, 1)
    call = re.search(r"torch\.ops\.kda\.gdn_recurrent_step_inplace\.default\((.*)\)", code)
    assert call and "arg5_1" in call.group(1).split(", ")[5:6], code
    assert "clone" not in code and not re.search(r"copy_\(|\.copy_", code), code


@pytest.mark.parametrize("case", ["read_too", "another", "read_after"])
def test_the_functional_op_stays_where_its_state_cannot_go_in_place(case):
    """The new state read elsewhere too, written into another buffer, the old state read after
    the step: the functional op and its copy stay (the results equal eager's), the reason at the
    op's line."""
    fn, words = {"read_too": (op_state_read_too, "the new state is read elsewhere too"),
                 "another": (op_into_another, "written into another buffer"),
                 "read_after": (op_cache_read_after, "the cache's old state is read after the step")}[case]
    args = inputs(41, 1) + ([torch.randn(B, HV, D, D)] if case == "another" else [])
    want_args = clones(args)
    want = eager(fn, *want_args)
    out, c = _run(fn, *args)
    assert c.matches[NAME] == 0
    _miss_at(c, words, "torch.ops.kda.gdn_recurrent_step(q, k, v, g, beta, state")
    assert op_counts(c).after["kda.gdn_recurrent_step.default"] == 1
    assert_close_to_eager(args, want_args, exact=True)  # the op's and its copy's bytes
    assert_close_to_eager(out, want)  # read_after's sum: Inductor's reduction order
