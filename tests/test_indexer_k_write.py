"""indexer_k_write: the pattern finds norm + fp8 quant + paged-cache writes in compiled code.

Every positive test compiles real code with the backend on a poisoned (random) cache,
asserts the exact match count, that the generated code calls the op on the cache itself
(no clone, no copy) and that the whole cache equals the token-by-token reference byte for
byte (so bytes outside the written slots never change). Negative tests assert 0 matches
and still-correct results (stock Inductor runs them; its CPU fp8 casts may differ from
eager by one fp8 step).
"""

from __future__ import annotations

import re
import traceback

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from kda_inductor import pass_manager
from kda_inductor.reference import (
    QUANT_GROUP,
    dequantize_k,
    fp8_step,
    gather_indexer_k,
    layer_norm_k,
    quantize_k,
    write_indexer_k,
    write_indexer_k_loop,
    write_indexer_k_racy,
    written_cache_mismatch,
)
from kda_inductor.testing import compile_for_test
from tests.helpers import compile_and_run, fresh_compile, stock_inductor_compiles_the_write

ON = {"kda": {"strict": True, "force": True}}  # matching and numerics: the CPU speed rule aside


def _inputs(head_dim=128, block_size=16, num_blocks=6, tokens=11, seed=0, padding=(), int32=False):
    """Random bf16 k, a poisoned cache, slots spread over blocks 1.. (block 0 is the null
    block that masked code clamps padding to), LayerNorm parameters."""
    g = torch.Generator().manual_seed(seed)
    k = (torch.randn(tokens, head_dim, generator=g) * 3).to(torch.bfloat16)
    k[0, :5] = 0  # a few exact zeros, and one all-zero group below
    k[min(1, tokens - 1), :QUANT_GROUP] = 0
    row = head_dim + 4 * (head_dim // QUANT_GROUP)
    cache = torch.randint(0, 256, (num_blocks, block_size, row), dtype=torch.uint8, generator=g)
    slots = torch.randperm((num_blocks - 1) * block_size, generator=g)[:tokens] + block_size
    for t in padding:
        slots[t] = -1
    weight = torch.rand(head_dim, generator=g) + 0.5
    bias = torch.randn(head_dim, generator=g) * 0.1
    return k, cache, slots.to(torch.int32 if int32 else torch.int64), weight, bias


def _reference(k, cache, slots, ue8m0, weight=None, bias=None):
    out = cache.clone()
    write_indexer_k_loop(k, out, slots, ue8m0, weight, bias)
    return out


def _compile_write(fn, cache, *args):
    """Compile ``fn(*args_with_cache)`` (writes ``cache`` in place); returns (matches, code)."""
    with fresh_compile(), pass_manager.observe() as records:
        compiled = torch.compile(fn, backend="kda_inductor", options=ON)
        _, code = run_and_get_code(compiled, *args)
    return pass_manager.total_matches(records), "\n".join(code)


COPY = re.compile(r"copy_\(|aten\.copy_|clone|(?<!_to)_copy_")


def _assert_in_place(code: str) -> None:
    """The op runs on the cache buffer itself: no clone and no copy of the cache (dtype
    casts such as ``fused__to_copy_...`` kernels do not count)."""
    assert "kda.indexer_k_write.default(" in code
    assert not COPY.search(code), COPY.search(code)


# --------------------------------------------------------------------------- spellings


def _put(k, cache, slots, ue8m0):
    """index_put_ into a flat [num_blocks, block_bytes] view; scale bytes via .view(uint8)."""
    nb, bs, row = cache.shape
    t, d = k.shape
    q, scale = quantize_k(k, ue8m0)
    blk, off = slots // bs, slots % bs
    flat = cache.view(nb, -1)
    flat[blk[:, None], off[:, None] * d + torch.arange(d)] = q.view(torch.uint8)
    flat[blk[:, None], bs * d + off[:, None] * (row - d) + torch.arange(row - d)] = scale.view(torch.uint8)


def _view_assign(k, cache, slots, ue8m0):
    """view[blk, off] = ... into the value region [nb, bs, D] and the float32 scale region."""
    nb, bs, row = cache.shape
    t, d = k.shape
    q, scale = quantize_k(k, ue8m0)
    flat = cache.view(nb, -1)
    vals = flat[:, : bs * d].view(nb, bs, d)
    scs = flat[:, bs * d :].view(torch.float32).view(nb, bs, d // QUANT_GROUP)
    blk = torch.div(slots, bs, rounding_mode="floor")
    off = slots - blk * bs
    vals[blk, off] = q.view(torch.uint8)
    scs[blk, off] = scale


def _index_copy(k, cache, slots, ue8m0):
    """index_copy_ of flattened bytes into kv_cache.view(-1); exp2 spelling of ue8m0."""
    nb, bs, row = cache.shape
    t, d = k.shape
    x = k.float().view(t, -1, QUANT_GROUP)
    scale = torch.clamp(x.abs().amax(-1, keepdim=True), min=1e-4) / 448.0
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = torch.clamp(x / scale, -448.0, 448.0).to(torch.float8_e4m3fn).view(t, d)
    base = (slots // bs) * (bs * row)
    off = slots % bs
    vidx = (base + off * d)[:, None] + torch.arange(d)
    sidx = (base + bs * d + off * (row - d))[:, None] + torch.arange(row - d)
    flat = cache.view(-1)
    flat.index_copy_(0, vidx.reshape(-1), q.view(torch.uint8).reshape(-1))
    flat.index_copy_(0, sidx.reshape(-1), scale.view(t, -1).view(torch.uint8).reshape(-1))


def _masked(k, cache, slots, ue8m0):
    """The reference form: padding masked with torch.where, slots clamped to 0 for indexing."""
    write_indexer_k(k, cache, slots, ue8m0)


def _view_masked(k, cache, slots, ue8m0):
    """view[blk, off] = where(slot >= 0, new, old), slots not clamped (a -1 reads and writes
    back the last block's last slot in eager)."""
    nb, bs, row = cache.shape
    t, d = k.shape
    q, scale = quantize_k(k, ue8m0)
    flat = cache.view(nb, -1)
    vals = flat[:, : bs * d].view(nb, bs, d)
    scs = flat[:, bs * d :].view(torch.float32).view(nb, bs, d // QUANT_GROUP)
    valid = (slots >= 0)[:, None]
    blk, off = slots // bs, slots % bs
    vals[blk, off] = torch.where(valid, q.view(torch.uint8), vals[blk, off])
    scs[blk, off] = torch.where(valid, scale, scs[blk, off])


FORMS = {  # form -> (head_dim, block_size, padding tokens)
    _put: (512, 64, ()),
    _view_assign: (128, 64, ()),
    _index_copy: (512, 16, ()),
    _masked: (128, 16, (2, 7)),
    _view_masked: (256, 64, (0, 10)),
}


@pytest.mark.parametrize("ue8m0", [False, True], ids=["plain", "ue8m0"])
@pytest.mark.parametrize("form", list(FORMS), ids=lambda f: f.__name__.strip("_"))
def test_write_forms_match_in_place_and_bit_exact(form, ue8m0):
    head_dim, block_size, padding = FORMS[form]
    k, cache, slots, _, _ = _inputs(head_dim, block_size, seed=head_dim + block_size, padding=padding,
                                    int32=form is _view_assign)
    expected = _reference(k, cache, slots, ue8m0)
    matches, code = _compile_write(lambda k, c, s: form(k, c, s, ue8m0), cache, k, cache, slots)
    assert matches["indexer_k_write"] == 1
    _assert_in_place(code)
    assert torch.equal(cache, expected), f"{int((cache != expected).sum())} cache bytes differ"


@pytest.mark.parametrize("form", list(FORMS), ids=lambda f: f.__name__.strip("_"))
def test_single_token_decode(form):
    """One token: ``x[i] = v`` stores ``v`` reshaped from ``[1, B]`` to ``[B]``; still a match."""
    head_dim, block_size, _ = FORMS[form]
    k, cache, slots, _, _ = _inputs(head_dim, block_size, tokens=1, seed=21)
    expected = _reference(k, cache, slots, True)
    matches, code = _compile_write(lambda k, c, s: form(k, c, s, True), cache, k, cache, slots)
    assert matches["indexer_k_write"] == 1
    _assert_in_place(code)
    assert torch.equal(cache, expected), f"{int((cache != expected).sum())} cache bytes differ"


@pytest.mark.parametrize("form", [_put, _view_assign, _masked, _view_masked], ids=lambda f: f.__name__.strip("_"))
def test_negative_slots_do_what_the_code_does(form):
    """Unmasked code writes slot -1 into the last row of the last block (Python indexing):
    rewritten with ``wrap_negative=True``; masked code skips it: ``wrap_negative=False``.
    The compiled cache equals eager's, byte for byte."""
    k, cache, slots, _, _ = _inputs(128, 16, seed=31, int32=form is _view_assign)
    total = cache.shape[0] * cache.shape[1]
    slots[3], slots[6] = -1, -total + 2  # slots total - 1 and 2: not used by the others
    assert not ((slots == total - 1) | (slots == 2)).any()
    expected = cache.clone()
    form(k, expected, slots, True)
    masked = form in (_masked, _view_masked)
    # eager: skipped (masked) or at s + num_slots (unmasked), per the token-by-token loop
    assert torch.equal(expected, _reference(k, cache, slots if masked else slots % total, True))
    with fresh_compile(), pass_manager.observe() as records:
        torch.compile(lambda k, c, s: form(k, c, s, True), backend="kda_inductor", options=ON)(k, cache, slots)
    assert pass_manager.total_matches(records)["indexer_k_write"] == 1
    assert f"wrap_negative: {not masked}" in records[0].after
    assert torch.equal(cache, expected), f"{int((cache != expected).sum())} cache bytes differ"


def _compile_norm_write_in_place(fn, k, w, b, cache, slots):
    """Compiled ``fn`` on the cache: one match, the op writing the cache buffer itself;
    returns the graph before and after our pass."""
    with fresh_compile(), pass_manager.observe() as records:
        _, code = run_and_get_code(torch.compile(fn, backend="kda_inductor", options=ON), k, w, b, cache, slots)
    assert [r.matches["indexer_k_write"] for r in records] == [1]
    _assert_in_place("\n".join(code))
    return records[0].before, records[0].after


@pytest.mark.parametrize("ue8m0", [False, True], ids=["plain", "ue8m0"])
def test_layer_norm_is_fused(ue8m0):
    k, cache, slots, w, b = _inputs(128, 16, seed=3)
    expected = _reference(k, cache, slots, ue8m0, w, b)

    def fn(k, w, b, c, s):
        write_indexer_k(layer_norm_k(k, w, b), c, s, ue8m0)

    before, after = _compile_norm_write_in_place(fn, k, w, b, cache, slots)
    assert "var_mean" not in after and "weight: %arg1_1, bias: %arg2_1, eps: 1e-06" in after
    if "torch.bfloat16)" not in before:
        # torch 2.9-2.11's Inductor drops the bf16 round trip after the norm before our
        # pass runs: the op then quantizes the float32 norm, as Inductor would (within one
        # fp8 step of eager, which rounds to bf16 first)
        assert "round_norm: False" in after
        why = written_cache_mismatch(cache, expected, slots, 128)
        assert why is None, why
        return
    assert "round_norm: True" in after
    assert torch.equal(cache, expected)


def _run_norm_write(fn, k, w, b, cache, slots):
    """Eager ``fn`` on a copy of the cache, then compiled ``fn`` on the cache itself: one
    match expected; returns (the graph after our pass, the eager cache)."""
    expected = cache.clone()
    fn(k, w, b, expected, slots)
    with fresh_compile(), pass_manager.observe() as records:
        torch.compile(fn, backend="kda_inductor", options=ON)(k, w, b, cache, slots)
    assert [r.matches["indexer_k_write"] for r in records] == [1]
    return records[0].after, expected


@pytest.mark.parametrize("ue8m0", [False, True], ids=["plain", "ue8m0"])
def test_float32_layer_norm_is_fused(ue8m0):
    """The norm kept in float32 up to the quantization (no cast back to bf16): fused with
    ``round_norm=False``, the cache exactly what that code writes, save the LayerNorm's
    reduction order (within one fp8 step)."""
    k, cache, slots, w, b = _inputs(128, 16, seed=6, padding=(3,))

    def fn(k, w, b, c, s):
        kn = torch.nn.functional.layer_norm(k.float(), (k.shape[-1],), w, b, 1e-6)
        write_indexer_k(kn, c, s, ue8m0)

    after, expected = _run_norm_write(fn, k, w, b, cache, slots)
    assert "var_mean" not in after and "round_norm: False" in after
    _assert_cache_close(cache, expected, slots, 128)


def _rotary_first_64(x):
    pe, nope = x[:, :64], x[:, 64:]
    x1, x2 = pe.float().chunk(2, -1)
    return torch.cat([torch.cat([-x2, x1], -1).to(x.dtype), nope], -1)


def test_rotary_between_norm_and_quant_keeps_the_norm_with_inductor():
    """DeepSeek-V3.2's order: LayerNorm -> rotary -> quant + write. Only quant + write fuse."""
    k, cache, slots, w, b = _inputs(128, 64, seed=4)

    def fn(k, w, b, c, s):
        write_indexer_k(_rotary_first_64(layer_norm_k(k, w, b)), c, s, True)

    after, expected = _run_norm_write(fn, k, w, b, cache, slots)
    assert "var_mean" in after and "weight: None, bias: None" in after
    _assert_cache_close(cache, expected, slots, 128)


def test_normalized_k_read_elsewhere_is_not_fused():
    k, cache, slots, w, b = _inputs(128, 16, seed=5)

    def fn(k, w, b, c, s):
        kn = layer_norm_k(k, w, b)
        write_indexer_k(kn, c, s, False)
        return kn * 2

    expected = cache.clone()
    ref_out = fn(k, w, b, expected, slots)
    out, matches = compile_and_run(fn, k, w, b, cache, slots, options=ON)
    assert matches["indexer_k_write"] == 1
    torch.testing.assert_close(out, ref_out, rtol=1.6e-2, atol=1e-2)
    _assert_cache_close(cache, expected, slots, 128)


def test_cpu_speed_rule_small_writes_stay_with_inductor():
    """What a CPU user gets (no force): below ``CPU_MIN_TOKENS`` tokens the write is left to
    Inductor, whose C++ is faster there, and the record says why; at that count the op runs.
    The cache is what eager writes either way. Where stock Inductor cannot compile the write
    (torch 2.9), the small one runs the op too, compiled again (the record's note says why)."""
    import warnings

    from kda_inductor.patterns.indexer_k_write import CPU_MIN_TOKENS
    from kda_inductor.testing import compile_for_test

    def fn(k, c, s):
        write_indexer_k(k, c, s, True)

    stock_ok = stock_inductor_compiles_the_write()
    for tokens, want in ((11, 0), (CPU_MIN_TOKENS, 1)):
        k, cache, slots, _, _ = _inputs(tokens=tokens, num_blocks=tokens // 16 + 2, seed=9)
        expected = _reference(k, cache, slots, True)
        with fresh_compile(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "kda_inductor: Inductor could not compile", RuntimeWarning)
            compiled = compile_for_test(fn, force=False)
            compiled(k, cache, slots)
        retried = want == 0 and not stock_ok
        assert [bool(r.note) for r in compiled.records] == [retried], compiled.records
        assert compiled.matches["indexer_k_write"] == (1 if retried else want), (tokens, compiled.matches)
        why = [m.check for r in compiled.records for m in r.misses["indexer_k_write"]]
        assert (want == 0 and not retried) == any(
            f"below {CPU_MIN_TOKENS} tokens written (this one: {tokens};" in w for w in why), why
        _assert_cache_close(cache, expected, slots, 128)


def _failing_byte_view(monkeypatch):
    """Inductor's lowering of a float32 -> uint8 view fails, as torch 2.9's does on the write's
    scales ("self.stride(-1) must be 1 to view Float as Byte ..., but got 0")."""
    from torch._inductor import lowering as L

    aten, real = torch.ops.aten, L.lowerings[torch.ops.aten.view.dtype]

    def lowering(x, dtype):
        if dtype == torch.uint8 and x.get_dtype() == torch.float32:
            raise RuntimeError("view Float as Byte (simulated)")
        return real(x, dtype)

    monkeypatch.setitem(L.lowerings, aten.view.dtype, lowering)


def test_inductor_failing_on_code_left_to_it_compiles_again_with_the_op(monkeypatch):
    """Where stock Inductor cannot lower the code a speed rule left to it, our op beats a failed
    compile: the backend warns, compiles the graph again with every match rewritten, and
    reports that compile alone (one record, with the reason as its note; counters counted
    once). The cache is what eager writes."""
    from torch._dynamo.utils import counters

    from kda_inductor import explain

    _failing_byte_view(monkeypatch)

    def fn(k, c, s):
        write_indexer_k(k, c, s, True)

    k, cache, slots, _, _ = _inputs(tokens=11, seed=12)  # below CPU_MIN_TOKENS: left to Inductor
    expected = _reference(k, cache, slots, True)
    before = counters[pass_manager.COUNTER_KEY]["indexer_k_write"]
    with fresh_compile(), pytest.warns(RuntimeWarning, match="Inductor could not compile this graph with "
                                       "indexer_k_write left to it by the speed rules .*view Float as Byte"):
        compiled = compile_for_test(fn, force=False)
        compiled(k, cache, slots)
    assert len(compiled.records) == 1 and compiled.matches["indexer_k_write"] == 1, compiled.records
    assert "compiled again with every match rewritten" in compiled.records[0].note
    assert counters[pass_manager.COUNTER_KEY]["indexer_k_write"] - before == 1
    _assert_cache_close(cache, expected, slots, 128)
    with pytest.warns(RuntimeWarning):
        report = explain(fn, *_inputs(tokens=11, seed=13)[:3])
    assert "graph 0: Inductor could not compile this graph" in str(report), str(report)


def test_inductor_failing_elsewhere_is_not_retried(monkeypatch):
    """A lowering failure with nothing left to Inductor by a speed rule (here: forced) is the
    user's error, raised as stock Inductor raises it, with no retry."""
    import warnings

    _failing_byte_view(monkeypatch)

    def fn(k, c, s):
        write_indexer_k(k, c, s, True)
        return k.float().view(torch.uint8)  # no rewrite takes this byte view

    k, cache, slots, _, _ = _inputs(tokens=11, seed=14)
    with fresh_compile(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no retry warning
        compiled = compile_for_test(fn, force=True)
        with pytest.raises(Exception, match="view Float as Byte"):
            compiled(k, cache, slots)


def test_inductor_failing_again_raises_the_first_failure(monkeypatch):
    """Where the compile with every match rewritten fails too (the failing code is outside any
    rewrite), the first failure is raised, after the retry's warning."""
    _failing_byte_view(monkeypatch)

    def fn(k, c, s):
        write_indexer_k(k, c, s, True)  # left to Inductor at 11 tokens, then forced
        return k.float().view(torch.uint8)  # no rewrite takes this byte view

    k, cache, slots, _, _ = _inputs(tokens=11, seed=15)
    with fresh_compile(), pytest.warns(RuntimeWarning, match="Inductor could not compile this graph"):
        compiled = compile_for_test(fn, force=False)
        with pytest.raises(Exception, match="view Float as Byte") as got:
            compiled(k, cache, slots)
    assert "compiling again with every match rewritten failed too" in "".join(
        traceback.format_exception(got.value)), got.value


def test_dynamic_token_count():
    """Serving recompiles once with a symbolic number of tokens; still matched and exact."""
    with fresh_compile(), pass_manager.observe() as records:
        compiled = torch.compile(lambda k, c, s: _masked(k, c, s, True), backend="kda_inductor",
                                 options=ON)
        for tokens in (7, 11, 5):
            k, cache, slots, _, _ = _inputs(128, 16, tokens=tokens, seed=tokens, padding=(1,))
            expected = _reference(k, cache, slots, True)
            compiled(k, cache, slots)
            assert torch.equal(cache, expected)
    assert len(records) >= 2 and all(r.matches["indexer_k_write"] == 1 for r in records)


def _unclamped_write(divisor=448.0, floor=True):
    """The write with the quantization spelled without a clamp: fp8(x / scale)."""
    def fn(k, cache, slots, ue8m0):
        nb, bs, row = cache.shape
        t, d = k.shape
        x = k.float().view(t, d // QUANT_GROUP, QUANT_GROUP)
        amax = x.abs().amax(dim=-1, keepdim=True)
        scale = (amax.clamp(min=1e-4) if floor else amax) / divisor
        if ue8m0:
            scale = torch.pow(2.0, torch.ceil(torch.log2(scale)))
        q = (x / scale).to(torch.float8_e4m3fn).view(t, d)
        blk, off = (slots // bs)[:, None], slots % bs
        flat = cache.view(nb, -1)
        flat[blk, off[:, None] * d + torch.arange(d)] = q.view(torch.uint8)
        flat[blk, bs * d + off[:, None] * 4 + torch.arange(4)] = scale.view(t, 1).view(torch.uint8)
    return fn


@pytest.mark.parametrize("ue8m0", [False, True], ids=["plain", "ue8m0"])
def test_unclamped_quantization_with_the_bounding_scale_matches(ue8m0):
    """fp8(x / scale) with scale = max(amax, 1e-4) / 448 (or its ue8m0 ceiling) needs no clamp:
    |x / scale| <= 448 up to rounding. Matched, and byte-exact against the clamped reference
    (eager's unclamped cast agrees with it too: the clamp was a no-op)."""
    k, cache, slots, _, _ = _inputs(128, 16, tokens=11, seed=33)
    k[2, 7] = 1e4  # one group dominated by a single value: x / scale = 448 exactly there
    expected = _reference(k, cache, slots, ue8m0)
    eager = cache.clone()
    _unclamped_write()(k, eager, slots, ue8m0)
    assert torch.equal(eager, expected)
    _, matches = compile_and_run(lambda k, c, s: _unclamped_write()(k, c, s, ue8m0), k, cache, slots, options=ON)
    assert matches["indexer_k_write"] == 1
    assert torch.equal(cache, expected)


@pytest.mark.parametrize("divisor, floor, why", [
    (240.0, True, "another scale formula"),
    (448.0, False, "another floor"),
], ids=["divisor_240", "no_eps_floor"])
def test_unclamped_quantization_without_the_bound_is_refused(divisor, floor, why):
    """Without the clamp only the exact scale proves the cast safe: another divisor or no eps
    floor is refused, the miss saying the clamp is missing too."""
    k, cache, slots, _, _ = _inputs(128, 16, tokens=11, seed=34)
    fn = _unclamped_write(divisor, floor)
    with fresh_compile(), pass_manager.observe() as records:
        torch.compile(lambda k, c, s: fn(k, c, s, False), backend="kda_inductor", options=ON)(k, cache, slots)
    assert [r.matches["indexer_k_write"] for r in records] == [0]
    (miss,) = records[0].misses["indexer_k_write"]
    assert why in miss.check and "not clamped to [-448, 448]" in miss.check, miss


def test_quantization_clamped_to_other_bounds_is_refused():
    """A clamp to other bounds than +-448 changes the values: not matched, and the miss says so."""
    k, cache, slots, _, _ = _inputs(128, 16, tokens=11, seed=35)

    def fn(k, cache, slots):
        nb, bs, row = cache.shape
        t, d = k.shape
        x = k.float().view(t, 1, d)
        scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-4) / 448.0
        q = (x / scale).clamp(-240.0, 240.0).to(torch.float8_e4m3fn).view(t, d)
        blk, off = (slots // bs)[:, None], slots % bs
        flat = cache.view(nb, -1)
        flat[blk, off[:, None] * d + torch.arange(d)] = q.view(torch.uint8)
        flat[blk, bs * d + off[:, None] * 4 + torch.arange(4)] = scale.view(t, 1).view(torch.uint8)

    with fresh_compile(), pass_manager.observe() as records:
        torch.compile(fn, backend="kda_inductor", options=ON)(k, cache, slots)
    assert [r.matches["indexer_k_write"] for r in records] == [0]
    (miss,) = records[0].misses["indexer_k_write"]
    assert "not clamped to [-448, 448]" in miss.check, miss


def _slot0_inputs(seed=31):
    """A real token on slot 0 next to padding (clamped to slot 0 by the masked spellings)."""
    k, cache, slots, _, _ = _inputs(128, 16, num_blocks=4, tokens=4, seed=seed)
    return k, cache, torch.tensor([0, -1, 17, -1])


@pytest.mark.parametrize("force", [True, False], ids=["rewritten", "stock"])
def test_race_free_reference_keeps_slot_0(force):
    """reference.write_indexer_k adds where(valid, new - old, 0) with accumulate=True: padding
    clamped to slot 0 adds nothing, so the real token on slot 0 keeps its bytes. Eager, the
    rewrite and (CPU, below the speed rule's token count) stock Inductor all equal the
    token-by-token reference byte for byte, with no note about a race."""
    k, cache, slots = _slot0_inputs()
    expected = _reference(k, cache, slots, False)
    eager = cache.clone()
    write_indexer_k(k, eager, slots)
    assert torch.equal(eager, expected)
    with fresh_compile(), pass_manager.observe() as records:
        compiled = torch.compile(lambda k, c, s: write_indexer_k(k, c, s), backend="kda_inductor",
                                 options={"kda": {"force": force}})
        compiled(k, cache, slots)
    assert torch.equal(cache, expected)
    assert [r.matches["indexer_k_write"] for r in records] == [int(force)]
    assert "undefined" not in (records[0].note or "")


def test_racy_masked_spelling_is_matched_with_a_note():
    """The old masked spelling (plain index_put_ of where(valid, new, old), padding clamped to
    slot 0) writes slot 0 twice with different bytes when a real token uses it: eager's
    result is undefined (CPU eager keeps padding's old bytes). The rewrite still matches
    (it is exact wherever eager is defined), stores the real token, and notes the race at
    the user's line."""
    k, cache, slots = _slot0_inputs()
    expected = _reference(k, cache, slots, False)
    with fresh_compile(), pass_manager.observe() as records:
        compiled = torch.compile(lambda k, c, s: write_indexer_k_racy(k, c, s), backend="kda_inductor", options=ON)
        compiled(k, cache, slots)
    assert [r.matches["indexer_k_write"] for r in records] == [1]
    assert torch.equal(cache, expected)
    note = records[0].note
    assert re.search(r"indexer_k_write at \S*reference\.py:\d+: this masked write .*eager's result is undefined", note), note
    assert "kda_inductor.reference.write_indexer_k" in note


def test_write_forms_without_collisions_agree():
    """Where no real token shares padding's slot the racy spelling is well defined: eager
    racy, eager race-free and the reference agree byte for byte."""
    k, cache, slots, _, _ = _inputs(128, 16, tokens=11, seed=32, padding=(1, 4))
    a, b = cache.clone(), cache.clone()
    write_indexer_k(k, a, slots)
    write_indexer_k_racy(k, b, slots)
    assert torch.equal(a, _reference(k, cache, slots, False)) and torch.equal(b, a)


def _compile_dynamic(mode):
    return torch.compile(lambda k, c, s: _masked(k, c, s, False), backend="kda_inductor",
                         dynamic=True if mode.startswith("dynamic") else None, options={"kda": {"force": True}})


@pytest.mark.parametrize("mode", ["automatic", "mark_dynamic", "dynamic_true_rows_static", "dynamic_true"])
def test_dynamic_token_and_block_counts(mode):
    """Token count and block count vary (automatic dynamic recompiles once; ``mark_dynamic``
    on the token dim; ``dynamic=True`` with the block size and row width marked static):
    every graph keeps the rewrite, byte-exact against the reference. Plain ``dynamic=True``
    makes the block size and row width symbolic too: the rewrite specializes them (a guard:
    ``tests/test_dynamic_modes.py`` checks another block size recompiles), still one compile
    for every token and block count, with no miss."""
    with fresh_compile(), pass_manager.observe() as records:
        compiled = _compile_dynamic(mode)
        for tokens, blocks in ((5, 6), (7, 8), (9, 10)):
            k, cache, slots, _, _ = _inputs(128, 16, num_blocks=blocks, tokens=tokens, seed=tokens, padding=(1,))
            if mode == "mark_dynamic":
                torch._dynamo.mark_dynamic(k, 0)
                torch._dynamo.mark_dynamic(slots, 0)
            if mode == "dynamic_true_rows_static":
                for t, d in ((cache, 1), (cache, 2), (k, 1)):
                    torch._dynamo.mark_static(t, d)
            expected = _reference(k, cache, slots, False)
            compiled(k, cache, slots)
            assert torch.equal(cache, expected)
    counts = [r.matches["indexer_k_write"] for r in records]
    assert counts == ([1] if mode.startswith("dynamic") else [1, 1]), counts
    cache_meta = next(r.meta for r in records[-1].before_nodes if r.meta.startswith("uint8["))
    if mode == "dynamic_true":
        assert re.fullmatch(r"uint8\[s\d+, s\d+, s\d+( \+ 4)?\]", cache_meta), records[-1]
        assert records[0].misses["indexer_k_write"] == [], records[0].misses
    else:
        assert re.fullmatch(r"uint8\[s\d+, 16, 132\]", cache_meta), records[-1]


def test_round_trip_through_the_gather():
    """LayerNorm + write, then indexer_k_gather and dequantize: within half a quantization step."""
    seqs, bs = [9, 0, 20], 16
    k, cache, _, w, b = _inputs(128, bs, num_blocks=5, tokens=sum(seqs), seed=6)
    table = torch.tensor([[3, 0], [0, 0], [1, 4]], dtype=torch.int32)
    cu = torch.tensor([0, 9, 9, 29], dtype=torch.int32)
    slots = torch.tensor([3 * bs + p for p in range(9)] + [int(table[2, p // bs]) * bs + p % bs for p in range(20)])

    def fn(k, w, b, c, s, t, cu):
        write_indexer_k(layer_norm_k(k, w, b), c, s, True)
        return gather_indexer_k(c, t, cu, 29)

    (values, scales), matches = compile_and_run(fn, k, w, b, cache, slots, table, cu, options=ON)
    assert matches["indexer_k_write"] == 1 and matches["indexer_k_gather"] == 1
    x = layer_norm_k(k, w, b).float()
    got = dequantize_k(values, scales)
    s = scales.view(torch.float32).repeat_interleave(QUANT_GROUP, dim=1)
    step = fp8_step((x / s).abs()) * s  # the grid spacing around each value
    assert torch.all((got - x).abs() <= 0.5 * step + 1e-12)


# --------------------------------------------------------------------------- must not match


def _group_64(k, cache, slots, ue8m0):
    """Scales per 64 values (stored as two floats in the 4 scale bytes' place): another group size."""
    nb, bs, row = cache.shape
    t, d = k.shape
    x = k.float().view(t, -1, 64)
    scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-4) / 448.0
    q = (x / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(t, d)
    flat = cache.view(nb, -1)
    blk, off = slots // bs, slots % bs
    flat[blk[:, None], off[:, None] * d + torch.arange(d)] = q.view(torch.uint8)
    sc = scale.view(t, -1)[:, :1].contiguous()  # 4 bytes per token: the first group's scale
    flat[blk[:, None], bs * d + off[:, None] * 4 + torch.arange(4)] = sc.view(torch.uint8)


def _other_scale_formula(k, cache, slots, ue8m0):
    """amax * (1 / 448): not bit-identical to amax / 448."""
    nb, bs, row = cache.shape
    t, d = k.shape
    x = k.float().view(t, -1, QUANT_GROUP)
    scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-4) * (1.0 / 448.0)
    q = (x / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(t, d)
    flat = cache.view(nb, -1)
    blk, off = slots // bs, slots % bs
    flat[blk[:, None], off[:, None] * d + torch.arange(d)] = q.view(torch.uint8)
    flat[blk[:, None], bs * d + off[:, None] * 4 + torch.arange(4)] = scale.view(t, 1).view(torch.uint8)


def _interleaved(k, cache, slots, ue8m0):
    """The per-token interleaved layout seen in the wild: values then scale per token row."""
    q, scale = quantize_k(k, ue8m0)
    bs, d = cache.shape[1], k.shape[1]
    cache[slots // bs, slots % bs, :d] = q.view(torch.uint8)
    cache[slots // bs, slots % bs, d:] = scale.view(torch.uint8)


def _clamped_unmasked(k, cache, slots, ue8m0):
    """Padding clamped to slot 0 but not masked: eager writes it there; the op would not."""
    _put(k, cache, slots.clamp(min=0), ue8m0)


@pytest.mark.parametrize("fn", [_group_64, _other_scale_formula, _interleaved, _clamped_unmasked],
                         ids=lambda f: f.__name__.strip("_"))
def test_does_not_match(fn):
    k, cache, slots, _, _ = _inputs(128, 16, seed=8, padding=(4,) if fn is _clamped_unmasked else ())
    expected = cache.clone()
    fn(k, expected, slots, False)
    with fresh_compile():
        compiled = compile_for_test(lambda k, c, s: fn(k, c, s, False), options=ON)
        try:
            compiled(k, cache, slots)
        except torch._dynamo.exc.BackendCompilerFailed as e:
            # not rewritten, so stock Inductor lowers it; older Inductors (torch 2.9) cannot
            # lower scale.view(torch.uint8) at all (the point): the same failure
            assert "to view Float as Byte" in str(e), e
            assert compiled.matches["indexer_k_write"] == 0
            with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="to view Float as Byte"):
                torch.compile(lambda k, c, s: fn(k, c, s, False), backend="inductor")(k, cache.clone(), slots)
            return
    assert compiled.matches["indexer_k_write"] == 0
    if fn in (_interleaved, _group_64):  # not the blocked layout / scale width: compare bytes loosely
        diff = (cache != expected).float().mean()
        assert diff < 0.01
    else:
        _assert_cache_close(cache, expected, slots.clamp(min=0), 128)


# --------------------------------------------------------------------------- helpers


def _assert_cache_close(got, ref, slots, head_dim):
    """Bytes outside the written slots identical; written values within one fp8 step."""
    why = written_cache_mismatch(got, ref, slots, head_dim)
    assert why is None, why


def test_layer_norm_of_float32_k_is_fused():
    """float32 k: its ``.float()`` is no op, so the norm has no cast to anchor on; the
    pattern matcher's LayerNorm pattern for float32 input matches it."""
    k, cache, slots, w, b = _inputs(128, 16, seed=4)
    k = k.float()
    expected = _reference(k, cache, slots, True, w, b)

    def fn(k, w, b, c, s):
        write_indexer_k(layer_norm_k(k, w, b), c, s, True)

    _, after = _compile_norm_write_in_place(fn, k, w, b, cache, slots)
    assert "var_mean" not in after and "weight: %arg1_1" in after
    why = written_cache_mismatch(cache, expected, slots, 128)
    assert why is None, why
