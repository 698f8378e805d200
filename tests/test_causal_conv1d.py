"""``causal_conv1d`` compiled: transformers' own conv functions (the torch fallbacks every GDN /
KDA family calls), its cache paths, the references of Dao's causal-conv1d and FLA, each rewritten
once and bit-exact with eager on fresh inputs (the op's CPU kernel is aten's conv); the cat form
(transformers' own Qwen3-Next layer: its conv reads q / k / v, no cat) and its fallbacks; the near
misses, each with its reason at this file's line; the speed rule, ``disable`` and a symbolic
token count. The op itself: ``tests/test_lowering_causal_conv1d.py``; the corpus:
``tests/spellings/cases_causal_conv1d.py``; CUDA: ``tests/test_causal_conv1d_cuda.py``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kda_inductor.testing import assert_close_in_range, assert_close_to_eager, compile_for_test, fresh_compile, op_counts
from tests.helpers import clones, eager

C, K = 48, 4
BF = torch.bfloat16
CAT, UPDATE_CAT = "kda.causal_conv1d_cat.default", "kda.causal_conv1d_update_cat.default"


def _run(fn, *args, **options):
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(fn, **options)
        out = c(*args)
    return out, c


def _parts(c) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in c.records:
        for part, n in r.parts.get("causal_conv1d", {}).items():
            out[part] = out.get(part, 0) + n
    return out


def _misses(c) -> list:
    return [m for r in c.records for m in r.misses.get("causal_conv1d", [])]


def _read_by(c, op) -> list[str]:
    """The ops whose outputs ``op`` reads in the compiled graphs (after our pass)."""
    rows = [r for rec in c.records for r in rec.after_nodes]
    by_name = {r.name: r for r in rows}
    return [by_name[i].target for r in rows if r.target == op for i in r.inputs]


def _hf():
    M = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    unwrap = lambda f: getattr(f, "__wrapped__", f)  # noqa: E731  (the hub wrapper keeps the torch fn)
    return unwrap(M.causal_conv1d_fn), unwrap(M.causal_conv1d_update)


def _weights(seed, bias=False, dtype=BF):
    g = torch.Generator().manual_seed(seed)
    w = (0.5 * torch.randn(C, K, generator=g)).to(dtype)
    return g, w, ((0.5 * torch.randn(C, generator=g)).to(dtype) if bias else None)


# --------------------------------------------------------------------------- transformers


def test_transformers_prefill_and_decode():
    """Qwen3-Next's layer around the conv: ``cat(q, k, v).transpose(1, 2)``, transformers'
    ``causal_conv1d_fn`` (prefill) / ``causal_conv1d_update`` (decode, the state in place),
    ``.transpose(1, 2)`` and the split. One rewrite each, outputs and state bit-exact."""
    conv_fn, conv_update = _hf()
    g, w, _ = _weights(0)

    def prefill(q, k, v):
        x = torch.cat((q, k, v), -1).transpose(1, 2)
        return torch.split(conv_fn(x, w, None, activation="silu").transpose(1, 2), [16, 16, 16], -1)

    def decode(x, state):
        return conv_update(x.transpose(1, 2), state, w, None, "silu").transpose(1, 2)

    qkv = [torch.randn(2, 9, 16, generator=g).to(BF) for _ in range(3)]
    out, c = _run(prefill, *qkv)
    assert c.matches["causal_conv1d"] == 1 and _parts(c) == {"conv + silu": 1}
    assert op_counts(c).after[CAT] == 1 and op_counts(c).after["aten.cat.default"] == 0  # the cat form
    assert_close_to_eager(list(out), list(eager(prefill, *qkv)), exact=True)
    x, state = torch.randn(2, 1, C, generator=g).to(BF), torch.randn(2, C, K, generator=g).to(BF)
    want_state = state.clone()
    want = eager(decode, x, want_state)
    out, c = _run(decode, x, state)
    assert c.matches["causal_conv1d"] == 1 and _parts(c) == {"conv + state update + silu": 1}
    assert_close_to_eager([out, state], [want, want_state], exact=True)
    assert "aten.convolution" not in c.records[0].after and "aten.cat" not in c.records[0].after


# --------------------------------------------------------------------------- the cat form


def _qwen3_next_layer(monkeypatch):
    """transformers' own ``Qwen3NextGatedDeltaNet`` (2 key heads, 4 value heads, head dims 8: 64
    conv channels), its torch paths (the hub / fla wrappers keep the torch function as
    ``__wrapped__``)."""
    M = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                 "causal_conv1d_update", "causal_conv1d_forward"):
        if hasattr(M, name):
            monkeypatch.setattr(M, name, getattr(getattr(M, name), "__wrapped__", getattr(M, name)))
    cfg = M.Qwen3NextConfig(hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                            linear_value_head_dim=8, linear_conv_kernel_dim=K, num_hidden_layers=1,
                            layer_types=["linear_attention"])
    torch.manual_seed(10)
    return M.Qwen3NextGatedDeltaNet(cfg, 0).to(BF).eval(), cfg


@pytest.mark.parametrize("step", ["prefill", "cached_prefill", "decode"])
def test_transformers_qwen3_next_layer_reads_q_k_v_without_the_cat(step, monkeypatch):
    """transformers' Qwen3-Next layer: its conv of ``cat((q, k, v)).transpose(1, 2)`` becomes
    ``kda.causal_conv1d_cat`` (decode: ``_update_cat``, the state shifted in place) on the split
    views of the ``qkvz`` projection: no cat feeds it; a first prefill with a cache writes the state
    from a cat of the last K tokens only. The conv state is bit-exact, the layer's output close to
    eager (its recurrence is compiled too)."""
    import copy

    from transformers.cache_utils import DynamicCache

    layer, cfg = _qwen3_next_layer(monkeypatch)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 6, 32, generator=g).to(BF)
    cache = None if step == "prefill" else DynamicCache(config=cfg)
    if step == "decode":
        eager(layer, x, cache)
        x = torch.randn(2, 1, 32, generator=g).to(BF)
    want_cache = copy.deepcopy(cache)
    want = eager(layer, x, want_cache)
    state = cache.get_conv_state(0) if step == "decode" else None
    old = None if state is None else state.clone()
    out, c = _run(layer, x, cache)
    op, counts = (UPDATE_CAT if step == "decode" else CAT), op_counts(c)
    assert c.matches["causal_conv1d"] == 1 and counts.after[op] == 1 and not counts.after["aten.convolution"]
    assert "aten.cat.default" not in _read_by(c, op), _read_by(c, op)
    cats = [r.meta for rec in c.records for r in rec.after_nodes if r.target == "aten.cat.default"]
    assert cats == ([f"bfloat16[2, {K}, 64]"] if step == "cached_prefill" else []), cats
    assert_close_in_range([out], [want])
    if cache is not None:
        assert_close_to_eager(cache.get_conv_state(0), want_cache.get_conv_state(0), exact=True)
    if state is not None:  # written in place: the cache's own tensor holds the new state
        assert cache.get_conv_state(0) is state and not torch.equal(state, old)


def cat_read_elsewhere(q, k, v, w):
    mixed = torch.cat((q, k, v), -1)  # also returned: the cat stays, the single-source op reads it
    out = F.silu(F.conv1d(mixed.transpose(1, 2), w.unsqueeze(1), padding=K - 1, groups=C)[..., :q.shape[1]])
    return out, mixed


def five_parts(q, k, v, w):
    mixed = torch.cat((q[..., :8], q[..., 8:], k, v[..., :8], v[..., 8:]), -1)  # more parts than the op reads
    return F.silu(F.conv1d(mixed.transpose(1, 2), w.unsqueeze(1), padding=K - 1, groups=C)[..., :q.shape[1]])


@pytest.mark.parametrize("fn,stage,words", [
    (cat_read_elsewhere, "REGION", "the cat of the conv's 3 inputs stays (kda.causal_conv1d reads it, not its parts): "
                                   "it is also read elsewhere"),
    (five_parts, "VALIDATED", "kda.causal_conv1d_cat rejects the cat's parts (xs: expected a list of 1 to 4"),
], ids=["read_elsewhere", "five_parts"])
def test_a_cat_the_cat_form_cannot_drop_is_read_by_the_single_source_op(fn, stage, words):
    """Where the cat is also read elsewhere (it is written anyway) or the ``_cat`` op rejects its
    parts, ``kda.causal_conv1d`` reads the cat, bit-exact, and the miss says why at the cat's line
    (shown: the concatenated copy is what the cat form saves)."""
    g, w, _ = _weights(12)
    args = [torch.randn(2, 7, 16, generator=g).to(BF) for _ in range(3)] + [w]
    out, c = _run(fn, *args)
    counts = op_counts(c)
    assert c.matches["causal_conv1d"] == 1 and counts.after["kda.causal_conv1d.default"] == 1 and not counts.after[CAT]
    assert_close_to_eager(list(out) if isinstance(out, tuple) else out, eager(fn, *args), exact=True)
    found = [m for m in _misses(c) if words in m.check]
    assert len(found) == 1 and found[0].stage.name == stage and found[0].shown, _misses(c)
    assert found[0].code.startswith("mixed = torch.cat(") and found[0].location.startswith(__file__), found[0]


def test_cat_form_cached_first_prefill_at_a_symbolic_token_count():
    """transformers 5.24's first prefill with a cache (``conv_state.copy_(x[..., -K:])`` of the
    cat) at a symbolic T: one graph, the cat form, the state written from the last K tokens of q /
    k / v; exact at two sizes."""
    conv_fn, _ = _hf()
    g, w, b = _weights(13, bias=True)

    def fn(q, k, v, state):
        x = torch.cat((q, k, v), -1).transpose(1, 2)
        state.copy_(x[..., -K:])
        return conv_fn(x, w, b, activation="silu").transpose(1, 2)

    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(fn)
        for T in (5, 9):
            qkv = [torch.randn(2, T, 16, generator=g).to(BF) for _ in range(3)]
            for t in qkv:
                torch._dynamo.mark_dynamic(t, 1)
            state, want_state = torch.randn(2, C, K, generator=g).to(BF), None
            want_state = state.clone()
            want = fn(*qkv, want_state)
            assert_close_to_eager([c(*qkv, state), state], [want, want_state], exact=True)
    assert len(c.records) == 1 and c.matches["causal_conv1d"] == 1 and op_counts(c).after[CAT] == 1
    assert "aten.cat.default" not in _read_by(c, CAT)


def _cache_prefill(conv_fn, w, b, T):
    """transformers 5.24's cached prefill (``LinearAttentionLayer.update_conv_state``): a first
    prefill shorter than the kernel is zero-padded to it; a prefill continuing a state
    concatenates it; either way the last K columns are cached and the output's last T kept."""

    def fn(x, state, has_previous):
        x = x.transpose(1, 2)
        full = torch.cat([state, x], -1) if has_previous else (F.pad(x, (K - T, 0)) if T < K else x)
        state.copy_(full[..., -K:])
        return conv_fn(full, w, b, activation="silu")[:, :, -T:].transpose(1, 2)

    return fn


@pytest.mark.parametrize("T,has_previous", [(2, False), (6, True)], ids=["padded", "continued"])
def test_transformers_cached_prefill(T, has_previous):
    """Padded: the conv is rewritten (the pad's zeros are the sequence start), the state copy
    stays with Inductor (it reads the pad). Continued: the state write is fused (update op)."""
    conv_fn, _ = _hf()
    g, w, b = _weights(1, bias=True)
    fn = _cache_prefill(conv_fn, w, b, T)
    x, state = torch.randn(2, T, C, generator=g).to(BF), torch.randn(2, C, K, generator=g).to(BF)
    want_state = state.clone()
    want = eager(fn, x, want_state, has_previous)
    out, c = _run(fn, x, state, has_previous)
    assert _parts(c) == {("conv + state update + silu" if has_previous else "conv + silu"): 1}
    assert_close_to_eager([out, state], [want, want_state], exact=True)


# --------------------------------------------------------------------------- the references


def dao_ref(x, weight, bias, initial_states):
    """Dao's ``causal_conv1d_ref`` (vLLM's kernel tests), with initial states."""
    dtype_in = x.dtype
    x = x.to(weight.dtype)
    seqlen, (dim, width) = x.shape[-1], weight.shape
    x = torch.cat([initial_states, x], dim=-1)
    out = F.conv1d(x, weight.unsqueeze(1), bias, padding=0, groups=dim)[..., :seqlen]
    return F.silu(out).to(dtype=dtype_in)


def fla_ref(x, weight, bias, initial_state):
    """FLA's ``causal_conv1d_ref_torch`` with ``output_final_state``: a float32 conv of the
    bf16 inputs, the final state a ``F.pad`` of ``[state | x]`` (so the cat is read elsewhere)."""
    dtype_in, width = x.dtype, weight.shape[1]
    x_full = torch.cat([initial_state, x], dim=-1)
    out = F.conv1d(x_full.to(torch.float32), weight.float().unsqueeze(1), bias.float(), padding=0,
                   groups=weight.shape[0])[..., :x.shape[-1]]
    final = F.pad(x_full, (width - 1 - x_full.shape[-1], 0)).to(dtype_in)
    return F.silu(out).to(dtype_in), final


def vllm_cpu_update(x, conv_state, weight, bias):
    """vLLM's CPU ``causal_conv1d_update_torch`` on a 2-D decode batch (unsqueezed): the cast
    before the silu, no cast after."""
    x = x.unsqueeze(-1)
    state_len = conv_state.shape[-1]
    x_new = torch.cat([conv_state, x], dim=-1).to(weight.dtype)
    conv_state.copy_(x_new[:, :, -state_len:])
    out = F.conv1d(x_new, weight.unsqueeze(1), bias, padding=0, groups=x.shape[1])[:, :, -1:]
    return F.silu(out).squeeze(-1)


@pytest.mark.parametrize("ref", [dao_ref, fla_ref, vllm_cpu_update], ids=lambda f: f.__name__)
def test_reference_spellings(ref):
    g, w, b = _weights(2, bias=True)
    if ref is vllm_cpu_update:
        args = [torch.randn(3, C, generator=g).to(BF), torch.randn(3, C, K - 1, generator=g).to(BF), w, b]
    else:
        args = [torch.randn(2, C, 7, generator=g).to(BF), w, b, torch.randn(2, C, K - 1, generator=g).to(BF)]
    want_args = clones(args)
    want = eager(ref, *want_args)
    out, c = _run(ref, *args)
    assert c.matches["causal_conv1d"] == 1, c.diff()
    assert_close_to_eager([out, args], [want, want_args], exact=True)


# --------------------------------------------------------------------------- near misses


def form_misses(x, w, w9, wg):
    """Convs the op does not compute (each line is where its miss points)."""
    T = x.shape[-1]
    out = [F.silu(F.conv1d(x, w.unsqueeze(1), padding=6, dilation=2, groups=C)[..., :T])]  # dilated
    out.append(F.silu(F.conv1d(x, w.unsqueeze(1), padding=3, stride=2, groups=C)))  # strided
    out.append(F.silu(F.conv1d(x, w9.unsqueeze(1), padding=8, groups=C)[..., :T]))  # too wide
    out.append(F.silu(F.conv1d(x, wg, padding=3, groups=C // 2)[..., :T]))  # not depthwise
    return out


def not_causal(x, w):
    return F.silu(F.conv1d(x, w.unsqueeze(1), padding=3, groups=C))  # all T + 3 outputs ("same"-like)


def silu_not_fused(x, w8, w, b):
    """Two convs rewritten without their silu: one read before it elsewhere, one with a bias of
    another shape added after it."""
    T = x.shape[-1]
    pre = F.conv1d(x, w8.unsqueeze(1), padding=7, groups=C)[..., :T]
    biased = F.conv1d(x, w.unsqueeze(1), padding=3, groups=C)[..., :T] + b.view(1, 1, T)
    return F.silu(pre), pre * 2, F.silu(biased)


def _checks(c) -> dict[str, str]:
    """Each miss's reason -> its location, for the misses at this file's lines."""
    return {m.check: m.location for m in _misses(c) if m.location and m.location.startswith(__file__)}


def test_near_misses_are_named_at_the_users_line():
    g, w, b = _weights(3)
    x = torch.randn(2, C, 9, generator=g).to(BF)
    w8, w9 = torch.randn(C, 8, generator=g).to(BF), torch.randn(C, 9, generator=g).to(BF)
    args = [x, w, w9, torch.randn(C, 2, K, generator=g).to(BF)]
    out, c = _run(form_misses, *args)
    assert c.matches["causal_conv1d"] == 0
    assert_close_to_eager(out, eager(form_misses, *args))  # Inductor's own code
    for words in ("a dilated conv (dilation 2)", "a strided conv (stride 2)", "kernel width 9 is wider than the op's 8",
                  "not depthwise: 24 groups over 48 channels"):
        assert any(words in why for why in _checks(c)), (words, _checks(c))
    out, c = _run(not_causal, x, w)
    assert c.matches["causal_conv1d"] == 0 and any("not a causal conv" in why for why in _checks(c)), _checks(c)


def test_a_silu_that_cannot_be_fused_leaves_the_conv_alone_rewritten():
    g, w, b = _weights(6)
    args = [torch.randn(2, C, 9, generator=g).to(BF), torch.randn(C, 8, generator=g).to(BF), w,
            torch.randn(9, generator=g).to(BF)]
    out, c = _run(silu_not_fused, *args)
    assert c.matches["causal_conv1d"] == 2 and _parts(c) == {"conv": 2}
    want = eager(silu_not_fused, *args)
    assert_close_to_eager(list(out[:2]), list(want[:2]), exact=True)
    assert_close_to_eager(out[2], want[2])  # Inductor adds the bias in float32, eager in bf16
    for words in ("the conv's output is also read elsewhere", "a bias ([1, 1, 9]) is added after the conv"):
        assert any(words in why for why in _checks(c)), (words, _checks(c))


# --------------------------------------------------------------------------- rules and options


def _plain(x, w):
    return F.silu(F.conv1d(x, w.unsqueeze(1), padding=K - 1, groups=C)[..., :x.shape[-1]])


def test_cpu_speed_rule_and_disable():
    """On CPU the default rules leave the conv to Inductor and say why; ``disable`` turns the
    rewrite off (the whole-step A/B switch of ``benchmarks/hf_models.py``)."""
    g, w, _ = _weights(4)
    x = torch.randn(1, C, 9, generator=g).to(BF)
    _, c = _run(_plain, x, w, force=False)
    assert c.matches["causal_conv1d"] == 0
    assert any("aten's conv" in m.check and m.stage.name == "SPEED_RULE" for m in _misses(c)), _misses(c)
    _, c = _run(_plain, x, w, options={"kda": {"disable": ["causal_conv1d"]}})
    assert c.matches["causal_conv1d"] == 0 and not _misses(c)


def test_cuda_speed_rule(monkeypatch):
    """On CUDA (the match's device reported as cuda here) every size is rewritten by default;
    a ``CUDA_MIN_TOKENS`` filled in from the benchmark leaves smaller convs to Inductor, saying so."""
    from kda_inductor.patterns import causal_conv1d as pattern

    monkeypatch.setattr(pattern.ConvMatch, "device", "cuda")
    g, w, _ = _weights(9)
    x = torch.randn(1, C, 9, generator=g).to(BF)
    out, c = _run(_plain, x, w, force=False)
    assert c.matches["causal_conv1d"] == 1
    assert_close_to_eager(out, _plain(x, w), exact=True)
    monkeypatch.setattr(pattern, "CUDA_MIN_TOKENS", 64)
    _, c = _run(_plain, x, w, force=False)
    assert c.matches["causal_conv1d"] == 0
    assert any("from 64 tokens (this one: 9" in m.check for m in _misses(c)), _misses(c)


def test_symbolic_token_count():
    """A symbolic token count (``mark_dynamic``): one graph for every T, rewritten, exact at two
    sizes."""
    g, w, _ = _weights(5)
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(_plain)
        for T in (5, 11):
            x = torch.randn(2, C, T, generator=g).to(BF)
            torch._dynamo.mark_dynamic(x, 2)
            assert_close_to_eager(c(x, w), _plain(x, w), exact=True)
    assert c.matches["causal_conv1d"] == len(c.records) >= 1


def test_symbolic_token_count_cached_prefill():
    """transformers' continued prefill at a symbolic T: its ``[:, :, -seq_len:]`` counts from a
    symbolic end; the state write is fused; one graph, exact at two sizes."""
    conv_fn, _ = _hf()
    g, w, b = _weights(7, bias=True)

    def fn(x, state):
        return _cache_prefill(conv_fn, w, b, x.shape[1])(x, state, True)

    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(fn)
        for T in (5, 9):
            x, state = torch.randn(2, T, C, generator=g).to(BF), torch.randn(2, C, K, generator=g).to(BF)
            torch._dynamo.mark_dynamic(x, 1)
            want_state = state.clone()
            want = fn(x, want_state)
            assert_close_to_eager([c(x, state), state], [want, want_state], exact=True)
    assert len(c.records) == 1 and _parts(c) == {"conv + state update + silu": 1}


def test_benchmark_smoke(capsys):
    """``benchmarks/bench_causal_conv1d.py --smoke``: every variant checked against eager on
    CPU (kda forced bit-exact), the decode row too; timings not meaningful."""
    import importlib.util
    import pathlib
    import sys

    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "bench_causal_conv1d.py"
    spec = importlib.util.spec_from_file_location("bench_causal_conv1d", path)
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_causal_conv1d"] = bench
    spec.loader.exec_module(bench)
    with torch._inductor.config.patch(force_disable_caches=True):
        rows = bench.main(["--smoke", "--T", "5"])
    assert [(r["case"], r["T"], r["B"]) for r in rows] == [("smoke proj", 5, 1), ("smoke decode", 1, 2)]
    assert all(r["exact"].startswith("kda yes") and r["forced_us"] for r in rows), rows
    assert "NOT meaningful" in capsys.readouterr().out


def test_the_examples_convs_are_gathers_and_sums_not_convolutions():
    """``examples/gdn_layers.py`` writes its conv as a sum of shifted products (fixed-length
    sets) and, for a varlen set, as row gathers of ``x`` by shifted token indices: no
    ``aten.convolution``, so causal_conv1d takes neither. Forced, ``gdn_spec_split`` takes the
    varlen taps' gathers (three launches: they pair up by source), as today; by default (CUDA)
    its rule leaves them to Inductor, which fuses the whole conv into one pointwise kernel."""
    import gdn_layers as G

    g = torch.Generator().manual_seed(8)
    w = (0.3 * torch.randn(C, K, generator=g)).to(BF)
    state = torch.randn(3, C, K - 1, generator=g).to(BF)
    cu = torch.tensor([0, 1, 5, 9], dtype=torch.int32)

    def varlen(x, state, cu):
        req, pos = G.varlen_positions(cu, x.shape[0])
        return G.causal_conv_varlen(x, state, w, cu, req, pos)

    x = torch.randn(9, C, generator=g).to(BF)
    out, c = _run(varlen, x, state, cu)
    assert c.matches["causal_conv1d"] == 0 and c.matches["gdn_spec_split"] == 3
    assert_close_to_eager(list(out), list(eager(varlen, x, state, cu)))
    fixed = torch.randn(3, 2, C, generator=g).to(BF)
    out, c = _run(lambda x, s: G.causal_conv(x, s, w), fixed, state)
    assert c.matches["causal_conv1d"] == 0 and not _misses(c)


def test_the_layers_contiguous_copy_of_the_output_is_dropped():
    """The layer's ``conv(...).transpose(1, 2).contiguous()`` (prefill, T static and symbolic;
    decode) copies nothing after the rewrite: the op writes token-major, so the clone Inductor
    would run as a copy kernel (the gap between the op and the compiled layer) is erased, the
    output contiguous and bit-exact. A copy whose source is read elsewhere too stays;
    every output has eager's strides (a channel-first one too)."""
    g, w, _ = _weights(31)

    def layer(x, w):  # x [B, T, C]
        T = x.shape[1]
        y = F.conv1d(x.transpose(1, 2), w.unsqueeze(1), None, padding=K - 1, groups=C)[:, :, :T]
        return F.silu(y).transpose(1, 2).contiguous()

    def channel_first(x, w):  # no clone left to the pass (Inductor drops eager's): the output in eager's layout
        T = x.shape[1]
        return F.silu(F.conv1d(x.transpose(1, 2), w.unsqueeze(1), None, padding=K - 1, groups=C)[:, :, :T]).clone()

    def read_twice(x, w):
        T = x.shape[1]
        y = F.silu(F.conv1d(x.transpose(1, 2), w.unsqueeze(1), None, padding=K - 1, groups=C)[:, :, :T])
        return y.transpose(1, 2).contiguous(), y.sum()

    state = torch.randn(2, C, K, generator=g).to(BF)

    def decode(x, state, w):  # transformers' update: the state in place
        new = torch.cat([state, x.transpose(1, 2)], -1)
        state.copy_(new[:, :, -K:])
        return F.silu(F.conv1d(new, w.unsqueeze(1), None, groups=C)[:, :, -1:]).transpose(1, 2).contiguous()

    x = torch.randn(2, 9, C, generator=g).to(BF)
    for fn, dynamic, clones in ((layer, False, 0), (layer, True, 0), (channel_first, False, 0), (read_twice, False, 1)):
        x = x.clone()
        if dynamic:
            torch._dynamo.mark_dynamic(x, 1)
        with torch.inference_mode(), fresh_compile():
            c = compile_for_test(fn, force=True)
            out = c(x, w)
        assert c.matches["causal_conv1d"] == 1 and op_counts(c).after["aten.clone.default"] == clones, fn.__name__
        want = eager(fn, x, w)
        assert_close_to_eager(out, want, exact=True)
        for got, ref in zip(out if isinstance(out, tuple) else [out], want if isinstance(want, tuple) else [want]):
            assert got.stride() == ref.stride(), fn.__name__
    want_state = state.clone()
    want = eager(decode, x[:, :1], want_state, w)
    out, c = _run(decode, x[:, :1], state, w, force=True)
    assert c.matches["causal_conv1d"] == 1 and op_counts(c).after["aten.clone.default"] == 0
    assert_close_to_eager([out, state], [want, want_state], exact=True)
