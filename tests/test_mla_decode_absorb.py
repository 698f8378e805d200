"""mla_decode_absorb: a one-token decode's MLA attention (transformers' Kimi Linear / DeepSeek
``expand_kv``) rewritten by weight absorption: the query projected into the latent space, the
scores and the weighted sum taken against the cached latents, the value's projection applied
last (CPU: the post-grad op is ``_scaled_dot_product_flash_attention_for_cpu``).

Numerics: another summation order than eager's (the kv_b_proj weight meets the query and the
output instead of every cached token), so results agree within float32 rounding, not bit for
bit; each case is also checked against a float64 reference of the same attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kda_inductor.patterns.base import Stage
from kda_inductor.testing import assert_close_to_eager, compile_for_test, fresh_compile, op_counts

NAME = "mla_decode_absorb"
CPU_OP = "aten._scaled_dot_product_flash_attention_for_cpu.default"


class MLAAttention(nn.Module):
    """A decoder's MLA attention written like transformers 5.25's ``KimiLinearAttention`` (and
    DeepSeek's): the new token's latents (after ``kv_a_layernorm``) and rope key appended to the
    caches, ``expand_kv`` of the whole cache through ``kv_b_proj``, sdpa, ``o_proj``. ``key``:
    ``"new_empty"`` (5.25's two ``copy_`` into slices) or ``"cat"``; ``returns_key``: the expanded
    key is returned too (a cache of expanded keys)."""

    def __init__(self, hidden=32, heads=4, rank=16, dn=8, dr=4, dv=12, key="new_empty", causal=False,
                 returns_key=False):
        super().__init__()
        self.h, self.r, self.dn, self.dr, self.dv = heads, rank, dn, dr, dv
        self.key, self.causal, self.returns_key = key, causal, returns_key
        self.q_proj = nn.Linear(hidden, heads * (dn + dr), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, rank + dr, bias=False)
        self.kv_a_layernorm = nn.RMSNorm(rank)
        self.kv_b_proj = nn.Linear(rank, heads * (dn + dv), bias=False)
        self.o_proj = nn.Linear(heads * dv, hidden, bias=False)

    def expand_kv(self, kv_nope, k_rot):
        b, _, s, _ = kv_nope.shape
        kv = self.kv_b_proj(kv_nope).view(b, s, -1, self.dn + self.dv).transpose(1, 2)
        k_nope, value = torch.split(kv, [self.dn, self.dv], dim=-1)
        k_rot = k_rot.expand(-1, k_nope.shape[1], -1, -1)
        if self.key == "cat":
            return torch.cat([k_nope, k_rot], dim=-1), value
        key = kv.new_empty(*kv.shape[:-1], self.dn + self.dr)
        key[..., : self.dn].copy_(k_nope)
        key[..., self.dn:].copy_(k_rot)
        return key, value

    def forward(self, x, c_cache, r_cache, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.dn + self.dr).transpose(1, 2)
        kv_nope, k_rot = torch.split(self.kv_a_proj_with_mqa(x), [self.r, self.dr], dim=-1)
        kv_nope = self.kv_a_layernorm(kv_nope).view(b, 1, t, self.r)
        kv_nope = torch.cat([c_cache, kv_nope], dim=2)
        k_rot = torch.cat([r_cache, k_rot.view(b, 1, t, self.dr)], dim=2)
        key, value = self.expand_kv(kv_nope, k_rot)
        out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, is_causal=self.causal,
                                             scale=(self.dn + self.dr) ** -0.5)
        out = self.o_proj(out.transpose(1, 2).reshape(b, t, -1))
        return (out, key) if self.returns_key else out


def _inputs(layer: MLAAttention, mask: str, *, batch=3, context=11, tokens=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = context + tokens
    x = torch.randn(batch, tokens, layer.q_proj.in_features, generator=g)
    c = torch.randn(batch, 1, context, layer.r, generator=g)
    r = torch.randn(batch, 1, context, layer.dr, generator=g)
    m = {"none": None, "float": torch.randn(batch, 1, tokens, s, generator=g),
         "bool": torch.rand(batch, 1, tokens, s, generator=g) > 0.3,
         "per_head": torch.randn(batch, layer.h, tokens, s, generator=g)}[mask]
    if mask == "bool":
        m[..., -1] = True  # every row sees a key (a fully masked row is NaN in eager and here)
    return x, c, r, m


def reference(layer: MLAAttention, x, c, r, mask):
    """The layer in float64 (the same attention, eager's order: K / V expanded): what both eager
    and the absorbed attention approximate in float32."""
    double = MLAAttention(x.shape[-1], layer.h, layer.r, layer.dn, layer.dr, layer.dv, layer.key).double()
    double.load_state_dict(layer.state_dict())
    mask = mask.double() if mask is not None and mask.is_floating_point() else mask
    return double(x.double(), c.double(), r.double(), mask).float()


def _run(layer, args, **kw):
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(layer, **kw)
        return c(*args), layer(*args), c


def _misses(c):
    return [m for r in c.records for m in r.misses.get(NAME, [])]


@pytest.fixture(scope="module")
def compiled():
    """One compile per (key spelling, mask kind), shared by the tests that read it."""
    runs = {}

    def get(key: str, mask: str):
        if (key, mask) not in runs:
            torch.manual_seed(0)
            layer = MLAAttention(key=key).eval()
            with torch.inference_mode(), fresh_compile():
                runs[key, mask] = layer, compile_for_test(layer)
                runs[key, mask][1](*_inputs(layer, mask))  # compiled here, once
        return runs[key, mask]

    return get


@pytest.mark.parametrize("key", ["new_empty", "cat"])
@pytest.mark.parametrize("mask", ["float", "bool", "none", "per_head"])
def test_decode_attention_absorbed(compiled, key, mask):
    layer, c = compiled(key, mask)
    assert c.matches[NAME] == 1
    counts = op_counts(c)
    # the expansion is gone: no mm over the cached latents' kv_b_proj (q, kv_a and o remain), no key build
    assert counts.before["aten.mm.default"] == 4 and counts.after["aten.mm.default"] == 3
    assert counts.before[CPU_OP] == 1 and counts.after[CPU_OP] == 0
    assert counts.after["aten.slice_scatter.default"] == counts.after["aten.cat.default"] - 2 == 0
    args = _inputs(layer, mask, seed=7)  # fresh inputs, not the ones it was compiled on
    with torch.inference_mode():
        got, want = c(*args), layer(*args)
    assert_close_to_eager(got, want, rtol=1e-4, atol=1e-5)
    assert_close_to_eager(got, reference(layer, *args), rtol=1e-4, atol=1e-5)


def test_per_head_mask_reaches_each_head():
    """A mask that hides a different key from each head: head ``h`` must read its own row."""
    torch.manual_seed(0)
    layer = MLAAttention().eval()
    x, c, r, _ = _inputs(layer, "none")
    mask = torch.zeros(3, layer.h, 1, c.shape[2] + 1)
    for head in range(layer.h):
        mask[:, head, 0, : 2 * head + 1] = float("-inf")
    got, want, comp = _run(layer, (x, c, r, mask))
    assert comp.matches[NAME] == 1
    assert_close_to_eager(got, want, rtol=1e-4, atol=1e-5)


def test_bf16_within_rounding():
    torch.manual_seed(0)
    layer = MLAAttention().eval().to(torch.bfloat16)
    args = [t.to(torch.bfloat16) if t is not None else t for t in _inputs(layer, "float")]
    got, want, c = _run(layer, args)
    assert c.matches[NAME] == 1
    step = torch.finfo(torch.bfloat16).eps * float(want.float().abs().max())
    assert_close_to_eager(got, want, rtol=0.02, atol=4 * step)


def test_symbolic_batch_and_cache_length():
    torch.manual_seed(0)
    layer = MLAAttention().eval()
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(layer, dynamic=True)
        for batch, context in ((3, 11), (5, 17)):
            args = _inputs(layer, "float", batch=batch, context=context)
            assert_close_to_eager(c(*args), layer(*args), rtol=1e-4, atol=1e-5)
    assert c.matches[NAME] >= 1


# --------------------------------------------------------------------------- what must not match
def test_prefill_is_no_candidate_shown():
    """Three query tokens: absorbing pays for one; the miss is logged at DEBUG only."""
    torch.manual_seed(0)
    layer = MLAAttention().eval()
    got, want, c = _run(layer, _inputs(layer, "float", tokens=3))
    assert c.matches[NAME] == 0
    assert [m.stage for m in _misses(c)] == [Stage.INCIDENTAL]
    assert "3 query tokens" in str(_misses(c)[0])
    assert_close_to_eager(got, want, rtol=1e-4, atol=1e-5)


def test_key_from_another_projection():
    """The value from kv_b_proj, k_nope from another projection of the same latents: no absorbed
    form with one weight; the miss names it at the user's sdpa line."""
    torch.manual_seed(0)
    layer = MLAAttention(key="cat").eval()
    other = nn.Linear(layer.r, layer.h * layer.dn, bias=False)

    def expand_kv(kv_nope, k_rot):
        b, _, s, _ = kv_nope.shape
        value = layer.kv_b_proj(kv_nope).view(b, s, -1, layer.dn + layer.dv).transpose(1, 2)[..., layer.dn:]
        k_nope = other(kv_nope).view(b, s, -1, layer.dn).transpose(1, 2)
        return torch.cat([k_nope, k_rot.expand(-1, layer.h, -1, -1)], dim=-1), value

    layer.expand_kv = expand_kv
    got, want, c = _run(layer, _inputs(layer, "float"))
    assert c.matches[NAME] == 0
    (miss,) = _misses(c)
    assert miss.stage == Stage.PIECES and "is not the value's kv_b_proj expansion" in str(miss)
    assert "test_mla_decode_absorb.py:" in str(miss)
    assert_close_to_eager(got, want, rtol=1e-4, atol=1e-5)


def test_a_cache_of_expanded_keys_is_not_absorbed():
    """The expanded key is also an output (a cache that stores it): absorbing would not make it."""
    torch.manual_seed(0)
    layer = MLAAttention(returns_key=True).eval()
    got, want, c = _run(layer, _inputs(layer, "float"))
    assert c.matches[NAME] == 0
    (miss,) = _misses(c)
    assert miss.stage == Stage.REGION and "is read elsewhere too" in str(miss)
    assert_close_to_eager(got, want, rtol=1e-4, atol=1e-5)


def test_causal_is_not_absorbed():
    torch.manual_seed(0)
    layer = MLAAttention(causal=True).eval()
    got, want, c = _run(layer, _inputs(layer, "none"))
    assert c.matches[NAME] == 0
    assert "is_causal=True" in str(_misses(c)) and "test_mla_decode_absorb.py:" in str(_misses(c))
    assert_close_to_eager(got, want, rtol=1e-4, atol=1e-5)


def test_bias_is_not_absorbed():
    torch.manual_seed(0)
    layer = MLAAttention().eval()
    layer.kv_b_proj = nn.Linear(layer.r, layer.h * (layer.dn + layer.dv), bias=True)
    got, want, c = _run(layer, _inputs(layer, "float"))
    assert c.matches[NAME] == 0 and "has a bias" in str(_misses(c))
    assert_close_to_eager(got, want, rtol=1e-4, atol=1e-5)


def _traced(fn):
    """A graph of ``fn(q, key, value, mask)`` on an MLA expansion, traced with fake tensors (the
    fused ops' meta kernels: on CPU dropout goes to the math path, no fused op), and the rewrite's
    matches and misses on it."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from kda_inductor.patterns.mla_decode_absorb import MlaDecodeAbsorb

    def f(q, c, r, m, w):  # transformers' expand_kv with torch.cat; heads 4, r 16, dn 8, dr 4, dv 12
        kv = F.linear(c, w).view(2, 9, 4, 20).transpose(1, 2)
        k_nope, value = torch.split(kv, [8, 12], dim=-1)
        return fn(q, torch.cat([k_nope, r.expand(-1, 4, -1, -1)], dim=-1), value, m)

    args = (torch.randn(2, 4, 1, 12), torch.randn(2, 1, 9, 16), torch.randn(2, 1, 9, 4), torch.randn(2, 1, 1, 9),
            torch.randn(80, 16))
    gm = make_fx(f, tracing_mode="fake")(*args)
    rewrite = MlaDecodeAbsorb()
    return rewrite.find(gm.graph), rewrite


def test_dropout_is_not_absorbed():
    aten = torch.ops.aten
    matches, rewrite = _traced(
        lambda q, k, v, m: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.5, attn_mask=m)[0])
    assert matches == [] and "dropout" in str(rewrite.misses)


def test_read_logsumexp_is_not_absorbed():
    aten = torch.ops.aten
    matches, rewrite = _traced(
        lambda q, k, v, m: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=m)[:2])
    assert matches == [] and [m.stage for m in rewrite.misses] == [Stage.REGION]
    assert "logsumexp" in str(rewrite.misses)


# --------------------------------------------------------------------------- the speed rule
def test_forced_only_on_cpu():
    """Measured on CUDA only: on CPU, without ``force``, it is left to Inductor, and the miss says so."""
    torch.manual_seed(0)
    layer = MLAAttention().eval()
    got, want, c = _run(layer, _inputs(layer, "float"), force=False)
    assert c.matches[NAME] == 0
    (miss,) = _misses(c)
    assert miss.stage == Stage.SPEED_RULE and "not measured on cpu: forced only" in str(miss)
    assert "benchmarks/bench_mla_decode_absorb.py" in str(miss)
    assert_close_to_eager(got, want, rtol=1e-4, atol=1e-5)


def test_can_be_disabled():
    torch.manual_seed(0)
    layer = MLAAttention().eval()
    _, _, c = _run(layer, _inputs(layer, "float"), options={"kda": {"disable": [NAME], "force": True}})
    assert c.matches[NAME] == 0


# --------------------------------------------------------------------------- transformers' own step
@pytest.mark.parametrize("family", ["kimi_linear"])
def test_transformers_decode_step(family):
    """transformers' decode step (tiny dims: 4 heads, kv_lora_rank 16; one KDA and one MLA layer)
    of a left-padded batch: its MLA layer's ``expand_kv`` (``new_empty`` + ``copy_``) is absorbed."""
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
    assert_close_to_eager(got, want, rtol=1e-4, atol=1e-4)
