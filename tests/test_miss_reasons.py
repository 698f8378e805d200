"""Every miss a user sees is true: the words of ``gated_norm_merge``'s misses in the
code real models put around a norm, and which misses ``explain()`` shows.

Each module here is a small hand-written copy of what transformers' hybrid models compile
(``benchmarks/hf_models.py``; ``integration/test_hf_models.py`` runs the models themselves): a
plain RMSNorm whose input holds the previous MLP's ``silu(g) * u`` and a sigmoid-gated shared
expert (through their matmuls and the residual add) is no candidate at all; the gated norms a
user writes after such a layer get the reason that is true of them; a MoE's routing gathers
are no spec split, so their miss is logged at DEBUG only.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from kda_inductor import explain, logs
from kda_inductor.patterns.base import Stage
from kda_inductor.testing import compile_for_test, fresh_compile

C, D = 32, 16  # hidden width; head dim of the norms
EPS = 1e-6


def _weights(seed=0):
    g = torch.Generator().manual_seed(seed)

    def mat(*shape):
        return (torch.randn(*shape, generator=g) / shape[0] ** 0.5).bfloat16()

    return {"gate": mat(C, 2 * C), "up": mat(C, 2 * C), "down": mat(2 * C, C), "shared_gate": mat(C, 1),
            "shared": mat(C, C), "w": (1 + 0.1 * torch.randn(D, generator=g)).bfloat16()}


def _mlp_residual(h, p):
    """The previous layer's tail: a SwiGLU MLP (``silu(gate) * up``, then ``down``) and a
    sigmoid-gated shared expert, added to the residual (Qwen3-Next's MoE block, in small)."""
    mlp = (F.silu(h @ p["gate"]) * (h @ p["up"])) @ p["down"]
    shared = torch.sigmoid(h @ p["shared_gate"]) * (h @ p["shared"])
    return h + mlp + shared


def _hf_rmsnorm(x, w):
    """transformers' plain RMSNorm."""
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


def plain_norm_after_mlp(h, z, p):
    """The next layer's input norm, then rotary-like products of its output (the overrun of the
    products reached from the rstd): no gate anywhere near the norm."""
    y = _hf_rmsnorm(_mlp_residual(h, p).view(-1, C // D, D), p["w"])
    return y * 0.5 + y.flip(-1) * 0.25


def bf16_silu_after_norm(h, z, p):
    """A gated norm after the layer, its gate F.silu of the bf16 ``z`` (rounded to bf16)."""
    xf = _mlp_residual(h, p).view(-1, C // D, D).float()
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * p["w"].float()
    return (n * F.silu(z.view(-1, C // D, D))).bfloat16()


def gelu_after_norm(h, z, p):
    xf = _mlp_residual(h, p).view(-1, C // D, D).float()
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * p["w"].float()
    return (n * F.gelu(z.view(-1, C // D, D).float())).bfloat16()


def gate_before_norm(h, z, p):
    """norm_before_gate=False after the layer: the gate inside the mean."""
    xf = _mlp_residual(h, p).view(-1, C // D, D).float() * F.silu(z.view(-1, C // D, D).float())
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * p["w"].float()).bfloat16()


def _inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(6, C, generator=g).bfloat16(), torch.randn(6, C, generator=g).bfloat16()


def _norm_misses(fn):
    h, z = _inputs()
    p = _weights()
    with fresh_compile():
        c = compile_for_test(lambda h, z: fn(h, z, p), options={"kda": {"strict": True}})
        c(h, z)
    assert c.matches["gated_norm_merge"] == 0
    return [m for r in c.records for m in r.misses["gated_norm_merge"]]


def test_plain_rmsnorm_after_a_gated_mlp_is_no_candidate():
    """The plain norm's input holds silu(g) * u and sigmoid(s) * e (through matmuls and adds),
    and its output runs into more products: no miss at all (before: "the gate is applied
    before the norm", at the RMSNorm's line of every layer of Qwen3-Next, Qwen3.5, Kimi and
    DeepSeek-V3.2)."""
    assert _norm_misses(plain_norm_after_mlp) == []


@pytest.mark.parametrize("fn, words, precision", [
    (bf16_silu_after_norm, "the gate's activation is rounded to bfloat16", True),
    (gelu_after_norm, "the gate's activation is gelu", False),
    (gate_before_norm, "the gate is applied before the norm", False),
], ids=["bf16_silu_after_norm", "gelu_after_norm", "gate_before_norm"])
def test_gated_norm_after_a_gated_mlp_gets_its_own_reason(fn, words, precision):
    """The gated norm a user writes after such a layer: the miss names what differs in the norm
    itself, at this file's line, whatever gates the layer before it."""
    misses = _norm_misses(fn)
    assert len({(m.location, m.check) for m in misses}) == 1, misses
    miss = misses[0]
    assert miss.shown and words in miss.check, miss
    assert ("precision differs" in miss.check) == precision, miss
    assert "test_miss_reasons.py:" in (miss.location or ""), miss


def test_float32_gated_norm_with_no_merge_says_why():
    """A norm-then-gate of a float32 tensor no merge wrote is a candidate the op leaves (the
    merge-free kernel takes 16-bit tensors): shown, with that reason (before: no miss at all)."""
    def fn(x, z, w):
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w
        return n * F.silu(z)

    x, z = (t.float().view(-1, C // D, D) for t in _inputs())
    with fresh_compile():
        c = compile_for_test(fn, options={"kda": {"strict": True}})
        c(x, z, _weights()["w"].float())
    misses = [m for r in c.records for m in r.misses["gated_norm_merge"]]
    assert c.matches["gated_norm_merge"] == 0 and len(misses) == 1, misses
    assert misses[0].shown and "the normalized tensor is float32 and no merge wrote it" in misses[0].check


def moe_combine(h, logits, w1, w2):
    """transformers' grouped MoE (integrations/moe.py), in small: tokens sorted by expert,
    ``hidden[perm // k]`` gathered, weighted, put back in order by ``out[inv_perm]``."""
    k = 2
    weights, experts = torch.topk(logits.softmax(-1), k, dim=-1)
    ids, perm = torch.sort(experts.reshape(-1))
    x = h[perm // k]
    out = F.silu(x @ w1) @ w2 * weights.reshape(-1)[perm].unsqueeze(-1).to(x.dtype)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel())
    return out[inv].view(h.shape[0], k, -1).sum(1) + ids.sum()


def _moe_inputs():
    g = torch.Generator().manual_seed(3)
    return (torch.randn(5, C, generator=g), torch.randn(5, 4, generator=g), torch.randn(C, C, generator=g),
            torch.randn(C, C, generator=g))


def test_moe_routing_gathers_are_logged_at_debug_only():
    """The routing gathers are lone row gathers (no other gather shares their index or reads
    their source): recorded as Stage.INCIDENTAL, absent from explain()'s report and its
    misses, present in the DEBUG log (TORCH_LOGS=+kda_inductor)."""
    report = explain(moe_combine, *_moe_inputs(), options={"kda": {"force": True}})
    assert report.matches["gdn_spec_split"] == 0
    everything = [m for g in report.graphs for m in g.all_misses.get("gdn_spec_split", [])]
    assert len(everything) == 2 and all(m.stage is Stage.INCIDENTAL and not m.shown for m in everything), everything
    assert not any(g.misses.get("gdn_spec_split") for g in report.graphs)
    assert not any("gdn_spec_split" in line for line in report.misses_text())
    assert "a lone row gather" not in str(report) and "not rewritten" not in str(report)
    lines = _debug_log(report.graphs[0].record)
    hidden = [ln for ln in lines if "gdn_spec_split" in ln and "a lone row gather" in ln]
    assert len(hidden) == 2 and all("DEBUG only" in ln and "test_miss_reasons.py:" in ln for ln in hidden), lines


def test_a_split_cut_into_lone_gathers_is_still_shown():
    """Two gathers of one index whose launch cannot be shared (one's output is the other's
    source) are a split the user wrote: that miss stays shown, with its reason. (Before, the two
    went into one launch that read its own output: the pass broke the graph.)"""
    def fn(x, s):
        a = x.index_select(0, s)
        return a.index_select(0, s) * 2

    x, s = torch.randn(6, C), torch.tensor([3, 1, 0, 2, 5, 4])
    with fresh_compile():
        c = compile_for_test(fn, options={"kda": {"strict": True}})
        out = c(x, s)
    assert c.matches["gdn_spec_split"] == 0
    assert torch.equal(out, fn(x, s))
    report = explain(fn, x, s, options={"kda": {"force": True}})
    assert report.matches["gdn_spec_split"] == 0
    shown = [m for g in report.graphs for m in g.misses.get("gdn_spec_split", [])]
    assert shown and all(m.shown and "no other gather of this index can share its launch" in m.check
                         for m in shown), shown


def _debug_log(record) -> list[str]:
    """What ``TORCH_LOGS=+kda_inductor`` logs for ``record``."""
    got: list[str] = []

    class Keep(logging.Handler):
        def emit(self, r):
            got.extend(r.getMessage().splitlines())

    handler, level = Keep(logging.DEBUG), logs.log.level
    logs.log.addHandler(handler)
    logs.log.setLevel(logging.DEBUG)
    try:
        logs.graph_done(record)
    finally:
        logs.log.removeHandler(handler)
        logs.log.setLevel(level)
    return got
