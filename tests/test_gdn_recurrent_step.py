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

BF = torch.bfloat16
B, HK, HV, D = 2, 2, 4, 16
FORCED = {"kda": {"force": True, "strict": True}}
NAME = "gdn_recurrent_step"


def _run(fn, *args, options=FORCED, **kw):
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(fn, options=options, **kw)
        out = c(*args)
    return out, c


def _eager(fn, *args):
    with torch.inference_mode():
        return fn(*args)


def _clones(args):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


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
    want_args = _clones(args)
    want = _eager(fn, *want_args)
    out, c = _run(fn, *args)
    assert c.matches[NAME] == matches, (c.matches, _checks(c), c.diff())
    assert_close_to_eager(out, want)
    assert_close_to_eager(args, want_args, exact=exact_state)
    return c


# --------------------------------------------------------------------------- transformers


def _hf(module):
    return pytest.importorskip(f"transformers.models.{module}.modeling_{module}")


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
    core = _hf("qwen3_next").torch_recurrent_gated_delta_rule
    c = _check(hf_decode(core), inputs(T, T))
    assert _parts(c) == {"state in place": 1}
    ops = op_counts(c)
    assert ops.after["kda.gdn_recurrent_step_inplace.default"] == 1
    for op in ("aten.sum.dim_IntList", "aten.exp.default", "aten.select_scatter.default", "aten.expand.default",
               "aten.rsqrt.default", "prims.convert_element_type.default"):
        assert ops.after[op] == 0, (op, ops.changed())
    assert ops.after["aten.copy_.default"] == ops.before["aten.copy_.default"] == 1  # the cache write, re-inplaced


@pytest.mark.parametrize("T", [1, 2])
def test_kimi_decode_per_channel_decay(T):
    """Kimi Linear's ``recurrent_kimi_delta_attention``: token-major, ``g [B, T, H, K]``, the
    ``x / sqrt(sum(x * x) + eps)`` l2norm, ``o[:, i] = ...`` into a zeros buffer."""
    core = _hf("kimi_linear").recurrent_kimi_delta_attention
    c = _check(hf_decode(core), inputs(10 + T, T, hk=HV, kda=True), exact_state=False)
    assert _parts(c) == {"state in place": 1}
    assert op_counts(c).after["aten.sum.dim_IntList"] == 0


def test_state_returned_is_the_functional_op():
    """No write-back: the core's new state is returned (transformers' prefill tail, FLA's
    ``output_final_state``): the functional op, the zeros state of ``initial_state=None`` too."""
    core = _hf("qwen3_next").torch_recurrent_gated_delta_rule

    def fn(q, k, v, g, beta, state):
        o1, s1 = core(q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True,
                      use_qk_l2norm_in_kernel=True)
        o2, s2 = core(q, k, v, g=g, beta=beta, initial_state=None, output_final_state=True)
        return o1, s1, o2, s2

    c = _check(fn, inputs(3, 2), matches=2)
    assert _parts(c) == {"state returned": 2}
    assert op_counts(c).after["kda.gdn_recurrent_step.default"] == 2
