"""indexer_k_gather: the pattern finds the vectorized gather in compiled code.

Every positive test compiles real code with the backend, asserts the exact
match count and compares bytes with eager on fresh random caches; negative
tests assert 0 matches and still-correct results (stock Inductor runs them).
"""

from __future__ import annotations

import re

import pytest
import torch

from kda_inductor.reference import (
    QUANT_GROUP,
    gather_indexer_k,
    gather_indexer_k_loop,
    random_indexer_cache,
    scale_bytes,
)
from torch._inductor.utils import run_and_get_code

from kda_inductor import pass_manager
from kda_inductor.testing import compile_for_test
from tests.helpers import assert_bytes_equal, compile_and_run, device_params, fresh_compile

SEQS = [5, 0, 70, 1, 130, 0]


def _inputs(device, block_size=16, head_dim=128, seed=0, seqs=SEQS, index_dtype=torch.int32):
    g = torch.Generator().manual_seed(seed)
    return random_indexer_cache(
        seqs, block_size, head_dim, table_stride_pad=3, index_dtype=index_dtype,
        device=device, generator=g,
    )


def _loop_ref(cache, table, cu, n, head_dim):
    dv = torch.empty(n, head_dim, dtype=torch.uint8, device=cache.device)
    ds = torch.empty(n, scale_bytes(head_dim), dtype=torch.uint8, device=cache.device)
    gather_indexer_k_loop(cache, dv, ds, table, cu)
    return dv, ds


# --------------------------------------------------------------------------- spellings


def _bucketize_reshape_int64(cache, table, cu, n):
    """bucketize, reshape, int64 indices, cu[1:] without the -1, & and >> arithmetic."""
    nb, bs, row = cache.shape
    hd = row * QUANT_GROUP // (QUANT_GROUP + 4)
    tok = torch.arange(n, device=cache.device)
    req = torch.bucketize(tok, cu[1:].long(), right=True)
    pos = tok - cu.long()[req]
    shift = bs.bit_length() - 1
    blk = table.long()[req, pos >> shift]
    off = pos & (bs - 1)
    flat = cache.reshape(nb, -1)
    values = flat[blk[:, None], off[:, None] * hd + torch.arange(hd, device=cache.device)[None, :]]
    sc = bs * hd + off[:, None] * (row - hd) + torch.arange(row - hd, device=cache.device)
    scales = flat[blk[:, None], sc]
    return values, scales  # scales stay uint8 [N, 4G]


def _flat_1d(cache, table, cu, n):
    """One flat byte index into kv_cache.view(-1); modulo spelled with floor division."""
    nb, bs, row = cache.shape
    hd = row * QUANT_GROUP // (QUANT_GROUP + 4)
    sb = row - hd
    tok = torch.arange(n, device=cache.device)
    req = torch.searchsorted(cu, tok, right=True) - 1
    pos = tok - cu[req]
    base = table[req, pos // bs].long() * (bs * row)
    off = pos - (pos // bs) * bs
    flat = cache.view(-1)
    values = flat[(base + off * hd)[:, None] + torch.arange(hd, device=cache.device)]
    scales = flat[(base + bs * hd + off * sb)[:, None] + torch.arange(sb, device=cache.device)]
    return values.view(torch.float8_e4m3fn), scales.view(torch.float32)


@device_params
@pytest.mark.parametrize("block_size,head_dim", [(16, 128), (64, 128), (16, 512)])
def test_vectorized_form_matches_and_is_bit_exact(device, block_size, head_dim):
    cache, table, cu, n = _inputs(device, block_size, head_dim, seed=block_size + head_dim)
    out, matches = compile_and_run(lambda c, t, s: gather_indexer_k(c, t, s, n), cache, table, cu)
    assert matches["indexer_k_gather"] == 1
    assert out[0].dtype == torch.float8_e4m3fn and out[1].dtype == torch.float32
    assert out[1].shape == (n, head_dim // QUANT_GROUP)
    assert_bytes_equal(out, gather_indexer_k(cache, table, cu, n))
    assert_bytes_equal([as_u8(o) for o in out], _loop_ref(cache, table, cu, n, head_dim))


def as_u8(x):
    return x.view(torch.uint8).reshape(x.shape[0], -1)


@device_params
@pytest.mark.parametrize("spelling", [_bucketize_reshape_int64, _flat_1d], ids=lambda f: f.__name__)
def test_other_spellings_match(device, spelling):
    cache, table, cu, n = _inputs(device, 16, 128, seed=7, index_dtype=torch.int64)
    out, matches = compile_and_run(lambda c, t, s: spelling(c, t, s, n), cache, table, cu)
    assert matches["indexer_k_gather"] == 1
    assert_bytes_equal(out, spelling(cache, table, cu, n))
    assert_bytes_equal([as_u8(o) for o in out], _loop_ref(cache, table, cu, n, 128))


@device_params
def test_copy_into_preallocated_dst(device):
    cache, table, cu, n = _inputs(device, 64, 128, seed=3, seqs=[0, 300, 0, 65, 2, 0])

    def fn(c, t, s, dst_value, dst_scale):
        v, sc = gather_indexer_k(c, t, s, n)
        dst_value.copy_(v)
        dst_scale.view(torch.float32).copy_(sc)

    poison = 0xAB
    dst_v = torch.full((n, 128), poison, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    dst_s = torch.full((n, 4), poison, dtype=torch.uint8, device=device)
    with fresh_compile(), pass_manager.observe() as records:
        _, code = run_and_get_code(
            torch.compile(fn, backend="kda_inductor", options={"kda": {"strict": True, "force": True}}),
            cache, table, cu, dst_v, dst_s,
        )
    assert [r.matches["indexer_k_gather"] for r in records] == [1]
    assert_bytes_equal([as_u8(dst_v), dst_s], _loop_ref(cache, table, cu, n, 128))
    # written in place by the out variant: no temporary, no copy into dst
    code = "\n".join(code)
    assert "kda.indexer_k_gather_out.default(" in code
    assert "copy_" not in code and "kda.indexer_k_gather.default(" not in code


@device_params
def test_dst_copy_and_returned_uses_functional_op(device):
    """The gathered values are also returned: the in-place variant cannot serve both."""
    cache, table, cu, n = _inputs(device, 16, 128, seed=13)

    def fn(c, t, s, dst_value, dst_scale):
        v, sc = gather_indexer_k(c, t, s, n)
        dst_value.copy_(v)
        dst_scale.view(torch.float32).copy_(sc)
        return v

    dst_v = torch.empty(n, 128, dtype=torch.float8_e4m3fn, device=device)
    dst_s = torch.empty(n, 4, dtype=torch.uint8, device=device)
    out, matches = compile_and_run(fn, cache, table, cu, dst_v, dst_s)
    assert matches["indexer_k_gather"] == 1
    ref = _loop_ref(cache, table, cu, n, 128)
    assert_bytes_equal([as_u8(out), as_u8(dst_v), dst_s], [ref[0], ref[0], ref[1]])


def test_index_arithmetic_shared_with_other_code():
    """An ``arange`` the graph's CSE shares with other code (the cache write's columns, in the
    hybrid model) stays for its other reader; the gather still matches, bit-exact."""
    cache, table, cu, n = _inputs("cpu", seed=6)

    def fn(c, t, s):
        v, sc = gather_indexer_k(c, t, s, n)
        return v, sc, torch.arange(128, device=c.device) * 3

    out, matches = compile_and_run(fn, cache, table, cu)
    assert matches["indexer_k_gather"] == 1
    assert_bytes_equal(out, fn(cache, table, cu))


def test_cpu_speed_rule_small_gathers_stay_with_inductor():
    """What a CPU user gets (no force): below ``CPU_MIN_TOKENS`` gathered tokens the gather is
    left to Inductor, whose C++ is faster there, and the record says why; at that count the op
    runs. Both bit-exact."""
    from kda_inductor.patterns.indexer_k_gather import CPU_MIN_TOKENS

    g = torch.Generator().manual_seed(8)
    for seqs, want in (([40, 0, 61], 0), ([CPU_MIN_TOKENS // 2] * 2, 1)):
        cache, table, cu, n = random_indexer_cache(seqs, 64, 128, generator=g)
        fn = lambda c, t, s, n=n: gather_indexer_k(c, t, s, n)  # noqa: E731
        with fresh_compile():
            compiled = compile_for_test(fn, force=False)
            out = compiled(cache, table, cu)
        assert compiled.matches["indexer_k_gather"] == want, (n, compiled.matches)
        why = [m.check for r in compiled.records for m in r.misses["indexer_k_gather"]]
        assert (want == 0) == any(f"below {CPU_MIN_TOKENS} gathered tokens (this one: {n};" in w for w in why), why
        assert_bytes_equal(out, fn(cache, table, cu))


@device_params
def test_block_table_with_spare_rows(device):
    """A persistent batch's table has more rows than this step has requests."""
    cache, table, cu, n = _inputs(device, 16, 128, seed=17)
    spare = torch.randint(0, 10**6, (5, table.shape[1]), dtype=table.dtype, device=device)
    padded = torch.cat([table, spare])
    out, matches = compile_and_run(lambda c, t, s: gather_indexer_k(c, t, s, n), cache, padded, cu)
    assert matches["indexer_k_gather"] == 1
    assert_bytes_equal([as_u8(o) for o in out], _loop_ref(cache, table, cu, n, 128))


@device_params
def test_fewer_tokens_than_cached(device):
    """num_tokens < cu_seq_lens[-1]: the first num_tokens rows, as in eager."""
    cache, table, cu, n = _inputs(device, 16, 128, seed=11)
    m = n - 37
    out, matches = compile_and_run(lambda c, t, s: gather_indexer_k(c, t, s, m), cache, table, cu)
    assert matches["indexer_k_gather"] == 1
    assert_bytes_equal(out, gather_indexer_k(cache, table, cu, m))


# --------------------------------------------------------------------------- must not match


def _token_blocks(table, cu, n, block_size):
    """Each token's block id and offset, spelled as in the reference."""
    tok = torch.arange(n, device=cu.device)
    req = torch.searchsorted(cu, tok, right=True) - 1
    pos = tok - cu[req]
    return table[req, pos // block_size], pos % block_size


def _interleaved_layout(cache, table, cu, n):
    """The per-token interleaved port seen in the wild: a different layout."""
    nb, bs, row = cache.shape
    hd = row * QUANT_GROUP // (QUANT_GROUP + 4)
    blk, off = _token_blocks(table, cu, n, bs)
    flat = cache.view(nb, -1)
    values = flat[blk[:, None], (off * row)[:, None] + torch.arange(hd, device=cache.device)]
    scales = flat[blk[:, None], (off * row + hd)[:, None] + torch.arange(row - hd, device=cache.device)]
    return values, scales


def _wrong_block_size(cache, table, cu, n):
    """Block arithmetic with 32 while the cache has 16 tokens per block."""
    nb, bs, row = cache.shape
    hd, bs_user = 128, 2 * bs
    blk, off = _token_blocks(table, cu, n, bs_user)
    flat = cache.view(nb // 2, -1)
    values = flat[blk[:, None] // 2, (off * hd)[:, None] + torch.arange(hd, device=cache.device)]
    scales = flat[blk[:, None] // 2, (bs_user * hd + off * 4)[:, None] + torch.arange(4, device=cache.device)]
    return values, scales


def _block_ids_read_again(cache, table, cu, n):
    """The block ids are also returned: an intermediate read after the rewrite."""
    nb, bs, row = cache.shape
    blk, off = _token_blocks(table, cu, n, bs)
    flat = cache.view(nb, -1)
    values = flat[blk[:, None], (off * 128)[:, None] + torch.arange(128, device=cache.device)]
    scales = flat[blk[:, None], (bs * 128 + off * 4)[:, None] + torch.arange(4, device=cache.device)]
    return values, scales, blk


def _left_side_search(cache, table, cu, n):
    """searchsorted(right=False) puts boundary tokens in the previous request."""
    nb, bs, row = cache.shape
    tok = torch.arange(n, device=cache.device)
    req = (torch.searchsorted(cu, tok, right=False) - 1).clamp(min=0)
    pos = (tok - cu[req]).clamp(min=0)
    blk = table[req, (pos // bs).clamp(max=table.shape[1] - 1)]
    off = pos % bs
    flat = cache.view(nb, -1)
    values = flat[blk[:, None], (off * 128)[:, None] + torch.arange(128, device=cache.device)]
    scales = flat[blk[:, None], (bs * 128 + off * 4)[:, None] + torch.arange(4, device=cache.device)]
    return values, scales


def _values_only(cache, table, cu, n):
    return gather_indexer_k(cache, table, cu, n)[0]


@pytest.mark.parametrize(
    "fn",
    [_interleaved_layout, _wrong_block_size, _block_ids_read_again, _left_side_search, _values_only],
    ids=lambda f: f.__name__,
)
def test_does_not_match(fn):
    cache, table, cu, n = _inputs("cpu", 16, 128, seed=5, seqs=[5, 40, 0, 33])
    if fn is _wrong_block_size:  # an even number of blocks, so the 32-token view exists
        cache = cache[: cache.shape[0] // 2 * 2]
    out, matches = compile_and_run(lambda c, t, s: fn(c, t, s, n), cache, table, cu)
    assert matches["indexer_k_gather"] == 0
    expected = fn(cache, table, cu, n)
    out = out if isinstance(out, tuple) else (out,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert_bytes_equal(out, expected)


def test_matches_when_token_count_and_batch_become_dynamic():
    """Serving recompiles once with symbolic num_tokens and batch size; still matched."""
    g = torch.Generator().manual_seed(21)
    cache, *_ = random_indexer_cache([600], 16, 128, generator=g)

    def fn(c, t, s, like):  # num_tokens from a tensor's size: symbolic after a recompile
        return gather_indexer_k(c, t, s, like.shape[0])

    with fresh_compile(), pass_manager.observe() as records:
        compiled = torch.compile(fn, backend="kda_inductor", options={"kda": {"strict": True, "force": True}})
        for seqs in ([5, 0, 70, 130], [9, 33, 1], [100, 2, 0, 0, 64]):
            _, table, cu, n = random_indexer_cache(seqs, 16, 128, generator=g)
            table = table % cache.shape[0]
            out = compiled(cache, table, cu, torch.empty(n, 0))
            assert_bytes_equal(out, gather_indexer_k(cache, table, cu, n))
    assert len(records) >= 2 and all(r.matches["indexer_k_gather"] == 1 for r in records)
    # one of the graphs passes a symbolic num_tokens (a graph node, not a literal) to the op
    symbolic = re.compile(r"kda\.indexer_k_gather\.default\]\(args = \((%\w+, ){4}128\)")
    assert any(symbolic.search(r.after) for r in records), [r.after for r in records]


def test_matches_when_the_block_count_becomes_dynamic():
    """A second cache with another block count recompiles with a symbolic num_blocks (automatic
    dynamic): still matched, bit-exact, and a bad block id gets the op's error naming
    block_table (stock Inductor's C++ bounds check would abort the process)."""
    g = torch.Generator().manual_seed(22)

    def fn(c, t, s, like):
        return gather_indexer_k(c, t, s, like.shape[0])

    with fresh_compile(), pass_manager.observe() as records:
        compiled = torch.compile(fn, backend="kda_inductor", options={"kda": {"strict": True, "force": True}})
        for seqs, extra in (([5, 0, 70], 3), ([9, 33, 1, 4], 5), ([20, 2], 7)):
            cache, table, cu, n = random_indexer_cache(seqs, 16, 128, extra_blocks=extra, generator=g)
            out = compiled(cache, table, cu, torch.empty(n, 0))
            assert_bytes_equal(out, gather_indexer_k(cache, table, cu, n))
        assert [r.matches["indexer_k_gather"] for r in records] == [1, 1]
        assert re.fullmatch(r"uint8\[s\d+, 16, 132\]", val_shape(records[-1].before_nodes, "uint8[")), records[-1]
        table[0, 0] = cache.shape[0] + 5
        with pytest.raises(IndexError, match="block_table: block id"):
            compiled(cache, table, cu, torch.empty(n, 0))


def val_shape(rows, prefix):
    """The meta column of the first node row whose meta starts with ``prefix``."""
    return next(r.meta for r in rows if r.meta.startswith(prefix))


def test_dynamic_true_specializes_the_block_size():
    """dynamic=True makes the cache's block size and row width symbolic: the rewrite specializes
    them (the op needs them static; a guard, so another block size recompiles: see
    tests/test_dynamic_modes.py) with no miss; mark_static on them (block count and token count
    still dynamic) is the same graph."""
    g = torch.Generator().manual_seed(23)

    def fn(c, t, s, like):
        return gather_indexer_k(c, t, s, like.shape[0])

    for static in (False, True):
        with fresh_compile(), pass_manager.observe() as records:
            compiled = torch.compile(fn, backend="kda_inductor", dynamic=True,
                                     options={"kda": {"force": True}})
            for seqs, extra in (([5, 0, 70], 3), ([9, 33, 1, 4], 5)):
                cache, table, cu, n = random_indexer_cache(seqs, 16, 128, extra_blocks=extra, generator=g)
                if static:
                    torch._dynamo.mark_static(cache, 1)
                    torch._dynamo.mark_static(cache, 2)
                out = compiled(cache, table, cu, torch.empty(n, 0))
                assert_bytes_equal(out, gather_indexer_k(cache, table, cu, n))
        assert [r.matches["indexer_k_gather"] for r in records] == [1]
        assert records[0].misses["indexer_k_gather"] == [], records[0].misses