"""gqa_decode_attention: a one-token decode's grouped-query attention folds the group into the
query rows instead of repeating K / V (CPU: the post-grad op is
``_scaled_dot_product_flash_attention_for_cpu``).

Numerics: the folded attention runs the same backend on ``n_rep`` query rows per kv head
instead of one row per head; every row is the same dot products, softmax and weighted sum, but
the kernel blocks and accumulates the rows of one launch differently from eager's (rows of 1
query): results agree within the dtype's rounding, not bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kda_inductor.patterns.base import Stage
from kda_inductor.testing import assert_close_to_eager, compile_for_test, fresh_compile, op_counts

NAME = "gqa_decode_attention"
CPU_OP = "aten._scaled_dot_product_flash_attention_for_cpu.default"


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """transformers' ``repeat_kv`` (models/llama): [B, Hkv, S, D] -> [B, Hkv * n_rep, S, D]."""
    b, h, s, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


class GQAAttention(nn.Module):
    """A decoder's attention written like transformers' sdpa path: projections, a KV cache the
    new token is appended to, ``repeat_kv``, sdpa with the given mask, the output projection."""

    def __init__(self, hidden=64, heads=8, kv_heads=2, head_dim=16, repeat=repeat_kv, causal=False):
        super().__init__()
        self.h, self.hkv, self.d, self.repeat, self.causal = heads, kv_heads, head_dim, repeat, causal
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

    def forward(self, x, k_cache, v_cache, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.d).transpose(1, 2)
        k = torch.cat([k_cache, self.k_proj(x).view(b, t, self.hkv, self.d).transpose(1, 2)], dim=2)
        v = torch.cat([v_cache, self.v_proj(x).view(b, t, self.hkv, self.d).transpose(1, 2)], dim=2)
        n_rep = self.h // self.hkv
        out = F.scaled_dot_product_attention(q, self.repeat(k, n_rep), self.repeat(v, n_rep), attn_mask=mask,
                                             is_causal=self.causal, scale=self.d ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.h * self.d))


def _inputs(layer: GQAAttention, mask: str, *, batch=3, context=11, tokens=1, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = context + tokens
    x = torch.randn(batch, tokens, layer.q_proj.in_features, generator=g)
    kc, vc = (torch.randn(batch, layer.hkv, context, layer.d, generator=g) for _ in range(2))
    m = {"none": None, "float": torch.randn(batch, 1, tokens, s, generator=g),
         "bool": torch.rand(batch, 1, tokens, s, generator=g) > 0.3,
         "per_head": torch.randn(batch, layer.h, tokens, s, generator=g),
         "keys": torch.randn(1, s, generator=g)}[mask]  # "keys": [1, S], broadcast over batch and heads
    if mask == "bool":
        m[..., 0] = True  # every row sees a key (a fully masked row is NaN in eager and in the fold)
    cast = (lambda t: t.to(dtype) if t is not None and t.is_floating_point() else t)
    return cast(x), cast(kc), cast(vc), cast(m)


def _run(layer, args, **kw):
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(layer, **kw)
        return c(*args), layer(*args), c


def _misses(c):
    return [m for r in c.records for m in r.misses.get(NAME, [])]


@pytest.fixture
def layer():
    torch.manual_seed(0)
    return GQAAttention().eval()


@pytest.mark.parametrize("mask", ["float", "bool", "none", "per_head", "keys"])
def test_decode_attention_folds(layer, mask):
    got, want, c = _run(layer, _inputs(layer, mask))
    assert c.matches[NAME] == 1
    counts = op_counts(c)
    # the two repeats are gone; one fused attention, on the un-repeated K / V
    assert counts.before["aten.expand.default"] == 2 and counts.after["aten.expand.default"] == 0
    assert counts.after["aten.clone.default"] == 0
    assert counts.before[CPU_OP] == counts.after[CPU_OP] == 1
    assert_close_to_eager(got, want)


def test_bf16_within_rounding(layer):
    layer = layer.to(torch.bfloat16)
    got, want, c = _run(layer, _inputs(layer, "float", dtype=torch.bfloat16))
    assert c.matches[NAME] == 1
    assert_close_to_eager(got, want)


def test_per_head_mask_regroups_heads(layer):
    """A mask that hides a different key from each query head: head ``h * n_rep + r`` must read
    its own row (a mask regrouped the other way round, or broadcast, would differ)."""
    x, kc, vc, _ = _inputs(layer, "none")
    mask = torch.zeros(3, layer.h, 1, kc.shape[2] + 1)
    for head in range(layer.h):
        mask[:, head, 0, : head + 1] = float("-inf")
    got, want, c = _run(layer, (x, kc, vc, mask))
    assert c.matches[NAME] == 1
    assert_close_to_eager(got, want)


def test_repeat_interleave_spelling():
    torch.manual_seed(0)
    layer = GQAAttention(repeat=lambda x, n: x.repeat_interleave(n, dim=1)).eval()
    got, want, c = _run(layer, _inputs(layer, "float"))
    assert c.matches[NAME] == 1
    assert_close_to_eager(got, want)


def test_symbolic_batch_and_context(layer):
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(layer, dynamic=True)
        for batch, context in ((3, 11), (5, 17)):
            args = _inputs(layer, "float", batch=batch, context=context)
            assert_close_to_eager(c(*args), layer(*args))
    assert c.matches[NAME] >= 1


@pytest.mark.parametrize("mask", ["bool", "per_head"])
def test_fold_calls_our_kernel_once_measured(layer, mask, monkeypatch):
    """With ``KERNEL_MEASURED`` the fold attends through ``kda::gqa_decode_attention`` (on CPU:
    torch's sdpa inside the op) instead of the fused sdpa op; the step is eager's."""
    from kda_inductor.patterns import gqa_decode_attention as pattern

    monkeypatch.setitem(pattern.KERNEL_MEASURED, "cpu", True)
    got, want, c = _run(layer, _inputs(layer, mask, seed=5))
    assert c.matches[NAME] == 1
    counts = op_counts(c)
    assert counts.after["kda.gqa_decode_attention.default"] == 1 and counts.after[CPU_OP] == 0
    assert counts.after["aten.expand.default"] == 0
    assert_close_to_eager(got, want)


# --------------------------------------------------------------------------- what must not match
def test_prefill_is_no_candidate_shown(layer):
    """Two query tokens: the group cannot fold into one row per head; the miss is logged at
    DEBUG only (a prefill's attention is nothing a user expects folded)."""
    got, want, c = _run(layer, _inputs(layer, "float", tokens=2))
    assert c.matches[NAME] == 0
    assert [m.stage for m in _misses(c)] == [Stage.INCIDENTAL]
    assert "2 query tokens" in str(_misses(c)[0])
    assert_close_to_eager(got, want)


def test_multi_head_attention_is_no_candidate():
    torch.manual_seed(0)
    layer = GQAAttention(kv_heads=8).eval()  # n_rep = 1: repeat_kv returns its input
    _, _, c = _run(layer, _inputs(layer, "float"))
    assert c.matches[NAME] == 0 and _misses(c) == []


def test_key_not_repeated(layer):
    """The value repeated, the key already at H heads: both must be un-repeated to fold."""
    def f(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, repeat_kv(v, 4), attn_mask=mask)

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 8, 1, 16, generator=g), torch.randn(2, 8, 9, 16, generator=g), \
        torch.randn(2, 2, 9, 16, generator=g)
    got, want, c = _run(f, (q, k, v, None))
    assert c.matches[NAME] == 0
    assert "only one of key and value" in str(_misses(c))
    assert_close_to_eager(got, want)


def test_causal_is_not_folded():
    torch.manual_seed(0)
    layer = GQAAttention(causal=True).eval()
    got, want, c = _run(layer, _inputs(layer, "none"))
    assert c.matches[NAME] == 0
    assert "is_causal=True" in str(_misses(c)) and "test_gqa_decode_attention.py:" in str(_misses(c))
    assert_close_to_eager(got, want)


def test_tiled_repeat_is_no_repeat_kv():
    """``k.repeat(1, n_rep, 1, 1)``: head ``r * Hkv + h`` reads kv head ``h`` (tiled, not
    interleaved): another grouping, left alone."""
    torch.manual_seed(0)
    layer = GQAAttention(repeat=lambda x, n: x.repeat(1, n, 1, 1)).eval()
    got, want, c = _run(layer, _inputs(layer, "float"))
    assert c.matches[NAME] == 0
    assert_close_to_eager(got, want)


# ------------------------------------------------------- the fused ops, as post-grad graphs hold them
# On CPU torch lowers sdpa to its CPU flash op only (dropout goes to the math path: no fused op),
# so the CUDA ops' argument lists, dropout and a read logsumexp are checked on graphs traced with
# fake tensors (the ops' meta kernels); the replacement, traced on CPU, then runs for real.
aten = torch.ops.aten
FUSED = {
    "cudnn": lambda q, k, v, m: aten._scaled_dot_product_cudnn_attention(q, k, v, m, False, scale=0.25)[0],
    "efficient": lambda q, k, v, m: aten._scaled_dot_product_efficient_attention(q, k, v, m, False, scale=0.25)[0],
    "flash": lambda q, k, v, m: aten._scaled_dot_product_flash_attention(q, k, v, scale=0.25)[0],
    "cpu": lambda q, k, v, m: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=m, scale=0.25)[0],
}


def _traced(fn, n_rep=4, mask_shape=(2, 1, 1, 9)):
    from torch.fx.experimental.proxy_tensor import make_fx

    from kda_inductor.patterns.gqa_decode_attention import GqaDecodeAttention

    g = torch.Generator().manual_seed(1)
    args = (torch.randn(2, 2 * n_rep, 1, 16, generator=g), torch.randn(2, 2, 9, 16, generator=g),
            torch.randn(2, 2, 9, 16, generator=g), torch.randn(*mask_shape, generator=g))
    gm = make_fx(lambda q, k, v, m: fn(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), m), tracing_mode="fake")(*args)
    rewrite = GqaDecodeAttention()
    return gm, rewrite, rewrite.find(gm.graph), args


@pytest.mark.parametrize("op", sorted(FUSED))
def test_each_fused_op(op):
    gm, rewrite, matches, (q, k, v, m) = _traced(FUSED[op])
    assert len(matches) == 1 and rewrite.misses == []
    rewrite.replace(gm.graph, matches[0])
    gm.recompile()
    assert not any(n.target is aten.expand.default for n in gm.graph.nodes)
    mask = None if op == "flash" else m
    want = F.scaled_dot_product_attention(q, repeat_kv(k, 4), repeat_kv(v, 4), attn_mask=mask, scale=0.25)
    assert_close_to_eager(gm(q, k, v, m), want)


def test_dropout_is_not_folded():
    _, rewrite, matches, _ = _traced(
        lambda q, k, v, m: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.5, attn_mask=m)[0])
    assert matches == [] and "dropout" in str(rewrite.misses)


def test_mask_that_does_not_regroup_is_not_folded():
    """A mask whose head dim is neither 1 nor H (here Hkv: no valid sdpa broadcast, which the
    ops' meta kernels do not check) has no per-group form: a miss naming it."""
    _, rewrite, matches, _ = _traced(FUSED["cpu"], mask_shape=(2, 2, 1, 9))
    assert matches == [] and [m.stage for m in rewrite.misses] == [Stage.LAYOUT]
    assert "does not regroup per kv head" in str(rewrite.misses)


def test_read_logsumexp_is_not_folded():
    _, rewrite, matches, _ = _traced(
        lambda q, k, v, m: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=m)[:2])
    assert matches == [] and [m.stage for m in rewrite.misses] == [Stage.REGION]
    assert "logsumexp" in str(rewrite.misses)


# --------------------------------------------------------------------------- the speed rule
def test_forced_only(layer):
    """Measured on CUDA only: on the CPU, without ``force``, it is left to Inductor, and the miss
    says so with the bytes the fold would save."""
    got, want, c = _run(layer, _inputs(layer, "float"), force=False)
    assert c.matches[NAME] == 0
    (miss,) = _misses(c)
    assert miss.stage == Stage.SPEED_RULE and "forced only" in str(miss) and "CUDA only" in str(miss)
    saved = 2 * 3 * 8 * 12 * 16 * 4  # K and V, B x H x S x D float32 each
    assert f"{saved / 1e6:.1f} MB" in str(miss)
    assert_close_to_eager(got, want)


def test_can_be_disabled(layer):
    _, _, c = _run(layer, _inputs(layer, "float"), options={"kda": {"disable": [NAME], "force": True}})
    assert c.matches[NAME] == 0


# --------------------------------------------------------------------------- transformers' own step
@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_next", "olmo_hybrid"])
def test_transformers_decode_step(family):
    """transformers' decode step (tiny dims: 4 query heads, 2 kv heads; one linear and one full
    attention layer) of a left-padded batch: its sdpa call gets a materialized mask, so
    transformers does not ask sdpa for GQA (``use_gqa_in_sdpa``: only without a mask) and
    repeats K / V (``repeat_kv``); the fold takes the repeats out. (Without padding transformers
    5.25 passes no mask and ``enable_gqa=True``: no repeat in the graph, nothing to fold.)"""
    pytest.importorskip("transformers")
    from benchmarks import hf_models

    built = hf_models.build(hf_models.BY_NAME[family], tiny=True, device="cpu", dtype=torch.float32,
                            layers=hf_models.SMOKE_LAYERS)
    if built is None:
        pytest.skip(f"{family}: not in the installed transformers")
    model, config = built
    step, reset = hf_models.decode_case(model, config, batch=2, context=8, device="cpu")
    padding = torch.ones(2, 9, dtype=torch.long)
    padding[1, :3] = 0  # the second sequence is 3 tokens shorter, padded on the left

    def run(decoder):
        return decoder(**step.inputs(), attention_mask=padding).last_hidden_state

    with torch.inference_mode(), fresh_compile():
        reset()
        want = run(model.model).clone()
        c = compile_for_test(model.model)
        reset()
        got = run(c)
    assert c.matches[NAME] == 1
    removed = [name for r in c.records for name in r.changes.get(NAME, {}).get("removed", [])]
    assert sum(name.startswith("expand") for name in removed) == 2, removed  # K's and V's repeat
    assert_close_to_eager(got, want, rtol=1e-4, atol=1e-4)


def test_speed_rule_on_cuda():
    """The rule is on for CUDA (measured: docs/speed-rules.md) and off elsewhere."""
    from types import SimpleNamespace

    from kda_inductor.patterns import gqa_decode_attention as mod

    rule = mod.GqaDecodeAttention().speed_rule
    assert mod.MEASURED is True
    assert rule(SimpleNamespace(device="cuda")) is None
    cpu = SimpleNamespace(device="cpu", repeated_bytes=lambda: None)
    assert "not measured on cpu" in rule(cpu)
