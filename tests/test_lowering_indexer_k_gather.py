"""kda::indexer_k_gather / kda::indexer_k_gather_out and the Triton launcher vs the reference loop."""

import os

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kda_inductor.lowerings import indexer_k_gather as mod
from kda_inductor.reference import (
    gather_indexer_k,
    gather_indexer_k_loop,
    random_indexer_cache,
    scale_bytes,
)

try:
    import triton  # noqa: F401

    HAS_TRITON = True
except ImportError:  # pragma: no cover
    HAS_TRITON = False

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"


def _interpreter_takes_scalar_loop_bounds() -> bool:
    """Feature probe: older Triton interpreters (seen: 3.5) pass scalar kernel args as
    1-element arrays, so ``range(n)`` inside a kernel fails there."""
    import triton.language as tl

    @triton.jit
    def probe(out_ptr, n):
        acc = 0
        for _ in range(n):
            acc += 1
        tl.store(out_ptr, acc)

    out = torch.zeros(1, dtype=torch.int32)
    try:
        probe[(1,)](out, 3)
    except Exception:  # noqa: BLE001 - any failure means: cannot run our kernels
        return False
    return int(out[0]) == 3


# The launcher runs on CPU tensors only through the interpreter (conftest sets it without CUDA).
LAUNCHER_OK = HAS_TRITON and (
    HAS_CUDA or (os.environ.get("TRITON_INTERPRET") == "1" and _interpreter_takes_scalar_loop_bounds())
)
needs_launcher = pytest.mark.skipif(
    not LAUNCHER_OK, reason="no triton, or its CPU interpreter cannot run these kernels"
)
# Small tiles keep the numpy interpreter fast; on GPU use the production tile.
BLOCK_T = None if HAS_CUDA else 16  # None: the launcher's own choice

OPS = torch.ops.kda

# (seq_lens, block_size, head_dim, table dtype, cu dtype, table_stride_pad, num_tokens - cu[-1])
CASES = [
    ([0, 5, 17], 16, 128, torch.int32, torch.int32, 0, 0),  # empty first
    ([7, 0, 33], 16, 512, torch.int64, torch.int64, 3, 0),  # empty middle
    ([20, 3, 0], 64, 128, torch.int32, torch.int64, 2, -5),  # empty last, N < cu[-1]
    ([70, 0, 0, 1], 64, 512, torch.int64, torch.int32, 1, -1),
    ([3, 0, 12, 40, 1, 0, 65, 2, 9], 16, 128, torch.int32, torch.int32, 1, -7),  # deeper search
    ([0, 0], 16, 128, torch.int64, torch.int32, 1, 0),  # N = 0
    ([], 64, 128, torch.int32, torch.int64, 0, 0),  # no requests, N = 0
    ([4, 9], 64, 128, torch.int32, torch.int32, 0, -13),  # N = 0 < cu[-1]
]
IDS = [f"case{i}" for i in range(len(CASES))]


def make_case(i, device=DEVICE):
    seq_lens, bs, hd, bt_dtype, cu_dtype, pad, dn = CASES[i]
    g = torch.Generator().manual_seed(1000 + i)
    kv, bt, cu, total = random_indexer_cache(
        seq_lens, bs, hd, table_stride_pad=pad, index_dtype=bt_dtype, generator=g
    )
    if pad:
        assert bt.stride(0) > bt.shape[1]
    n = total + dn
    return kv.to(device), bt.to(device), cu.to(cu_dtype).to(device), n, hd, g


def reference(kv, bt, cu, n, hd):
    """The loop reference on CPU (it needs all cu[-1] rows), cut to n rows; cross-checked."""
    kv, bt, cu = kv.cpu(), bt.cpu(), cu.cpu()
    total = int(cu[-1])
    sb = scale_bytes(hd)
    v = torch.full((total, hd), 0xAB, dtype=torch.uint8)
    s = torch.full((total, sb), 0xAB, dtype=torch.uint8)
    gather_indexer_k_loop(kv, v, s, bt, cu)
    vv, ss = gather_indexer_k(kv, bt, cu, n)
    assert torch.equal(vv.view(torch.uint8), v[:n])
    assert torch.equal(ss.view(torch.uint8).view(n, sb), s[:n])
    return v[:n], s[:n]


def poison(shape, dtype, g, device):
    nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).view(shape).to(device)


def same_bytes(a, b):
    def raw(x):
        return x.cpu().contiguous().view(torch.uint8).flatten()

    return torch.equal(raw(a), raw(b))


# ---------------------------------------------------------------------------------------
# ops vs reference
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("i", range(len(CASES)), ids=IDS)
def test_functional_matches_reference(i):
    kv, bt, cu, n, hd, _ = make_case(i)
    rv, rs = reference(kv, bt, cu, n, hd)
    v, s = OPS.indexer_k_gather(kv, bt, cu, n, hd)
    assert v.dtype == s.dtype == torch.uint8
    assert v.shape == (n, hd) and s.shape == (n, scale_bytes(hd))
    assert v.is_contiguous() and s.is_contiguous()
    assert v.device == kv.device
    assert same_bytes(v, rv) and same_bytes(s, rs)


@pytest.mark.parametrize("i", range(len(CASES)), ids=IDS)
def test_out_matches_reference(i):
    kv, bt, cu, n, hd, g = make_case(i)
    rv, rs = reference(kv, bt, cu, n, hd)
    G = hd // 128
    # alternate destination dtypes: fp8 values / float32 scales and uint8 / uint8
    if i % 2:
        dv = poison((n, hd), torch.float8_e4m3fn, g, kv.device)
        ds = poison((n, G), torch.float32, g, kv.device)
    else:
        dv = poison((n, hd), torch.uint8, g, kv.device)
        ds = poison((n, 4 * G), torch.uint8, g, kv.device)
    dv_ptr, ds_ptr = dv.data_ptr(), ds.data_ptr()
    assert OPS.indexer_k_gather_out(kv, dv, ds, bt, cu) is None
    assert dv.data_ptr() == dv_ptr and ds.data_ptr() == ds_ptr
    assert same_bytes(dv, rv) and same_bytes(ds, rs)


def test_out_strided_destinations_and_cache():
    """Row-padded destinations, a cache whose block stride exceeds the block size."""
    kv, bt, cu, n, hd, g = make_case(4)
    rv, rs = reference(kv, bt, cu, n, hd)
    nb, bs, row = kv.shape
    big = torch.zeros(nb, bs * row + 64, dtype=torch.uint8, device=kv.device)
    big[:, : bs * row] = kv.reshape(nb, -1)
    kv2 = big[:, : bs * row].view(nb, bs, row)
    dv_base = poison((n, hd + 32), torch.uint8, g, kv.device)
    ds_base = poison((n, 3), torch.float32, g, kv.device)
    dv_before, ds_before = dv_base.clone(), ds_base.clone()
    dv, ds = dv_base[:, :hd], ds_base[:, :1]
    OPS.indexer_k_gather_out(kv2, dv, ds, bt, cu)
    assert same_bytes(dv, rv) and same_bytes(ds, rs)
    # the padding columns are untouched
    assert torch.equal(dv_base[:, hd:], dv_before[:, hd:])
    assert same_bytes(ds_base[:, 1:], ds_before[:, 1:])


# ---------------------------------------------------------------------------------------
# the Triton launcher directly
# ---------------------------------------------------------------------------------------
@needs_launcher
@pytest.mark.parametrize("grid_by, fanout", [("token", 2), ("token", 16), ("block", 16)])
@pytest.mark.parametrize("i", range(len(CASES)), ids=IDS)
def test_launcher_matches_reference(i, grid_by, fanout):
    kv, bt, cu, n, hd, g = make_case(i)
    rv, rs = reference(kv, bt, cu, n, hd)
    dv = poison((n, hd), torch.uint8, g, kv.device)
    ds = poison((n, scale_bytes(hd)), torch.uint8, g, kv.device)
    w = mod.gather_triton(kv, bt, cu, dv, ds, block_t=BLOCK_T, fanout=fanout, grid_by=grid_by)
    assert w == 4
    assert same_bytes(dv, rv) and same_bytes(ds, rs)


def _shifted(x, shift):
    """A copy of uint8 ``x`` whose data starts ``shift`` bytes into a fresh buffer."""
    buf = torch.zeros(x.numel() + shift, dtype=torch.uint8, device=x.device)
    out = buf[shift:].view(x.shape)
    out.copy_(x)
    return out


@needs_launcher
@pytest.mark.parametrize(
    "kv_shift, dv_shift, block_pad, want",
    [(1, 0, 0, 1), (2, 0, 0, 2), (0, 3, 0, 1), (0, 0, 6, 2), (0, 0, 8, 4)],
)
def test_launcher_word_fallback(kv_shift, dv_shift, block_pad, want):
    kv, bt, cu, n, hd, g = make_case(2)
    rv, rs = reference(kv, bt, cu, n, hd)
    nb, bs, row = kv.shape
    if block_pad:
        big = torch.zeros(nb, bs * row + block_pad, dtype=torch.uint8, device=kv.device)
        big[:, : bs * row] = kv.reshape(nb, -1)
        kv = big[:, : bs * row].view(nb, bs, row)
    if kv_shift:
        kv = _shifted(kv, kv_shift)
    assert kv.storage_offset() == kv_shift
    dv = _shifted(poison((n, hd), torch.uint8, g, kv.device), dv_shift)
    ds = poison((n, scale_bytes(hd)), torch.uint8, g, kv.device)
    assert mod.gather_triton(kv, bt, cu, dv, ds, block_t=BLOCK_T) == want
    assert same_bytes(dv, rv) and same_bytes(ds, rs)
    # the CPU/CUDA op agrees on the same odd layouts
    v2, s2 = OPS.indexer_k_gather(kv, bt, cu, n, hd)
    assert same_bytes(v2, rv) and same_bytes(s2, rs)


@pytest.mark.parametrize("launcher", ["op", "token", "block"])
def test_block_table_with_spare_rows(launcher):
    """A persistent batch table: more rows than requests; the spare rows are never read."""
    kv, bt, cu, n, hd, g = make_case(4)
    spare = torch.full((3, bt.shape[1]), 10**6, dtype=bt.dtype, device=bt.device)
    bt_padded = torch.cat([bt, spare])
    rv, rs = reference(kv, bt, cu, n, hd)
    if launcher == "op":
        dv, ds = torch.ops.kda.indexer_k_gather(kv, bt_padded, cu, n, hd)
    else:
        if not LAUNCHER_OK:
            pytest.skip("no triton, or its CPU interpreter cannot run these kernels")
        dv = poison((n, hd), torch.uint8, g, kv.device)
        ds = poison((n, scale_bytes(hd)), torch.uint8, g, kv.device)
        mod.gather_triton(kv, bt_padded, cu, dv, ds, block_t=BLOCK_T, grid_by=launcher)
    assert same_bytes(dv, rv) and same_bytes(ds, rs)


@needs_launcher
@pytest.mark.parametrize("grid_by", ["token", "block"])
def test_launcher_without_checks_masks_unresolvable_tokens(grid_by):
    """``check=False`` (the explicit no-assert variant, for benchmarks): bad block ids, a
    too-narrow row and tokens past cu[-1] read nothing and get zeros; negative block ids
    in range still wrap."""
    kv, bt, cu, _, hd, g = make_case(4)
    cu_cpu = cu.cpu().long()
    n = int(cu_cpu[-1])
    nb, bs = kv.shape[:2]
    bt_bad = bt.clone()
    bt_bad[1, 0] = nb + 5  # request 1 is empty: never referenced
    bt_bad[2, 0] = nb + 1000  # request 2 (12 tokens, block 0) -> zeros
    bt_bad[3, 1] = -nb - 3  # request 3, block 1 -> zeros
    bt_bad[3, 0] = int(bt[3, 0]) - nb  # in range counting from the end: the same block
    rv, rs = reference(kv, bt, cu, n, hd)
    extra = 6
    dv = poison((n + extra, hd), torch.uint8, g, kv.device)
    ds = poison((n + extra, scale_bytes(hd)), torch.uint8, g, kv.device)
    mod.gather_triton(kv, bt_bad, cu, dv, ds, block_t=BLOCK_T, grid_by=grid_by, check=False)
    ev = torch.cat([rv, torch.zeros(extra, hd, dtype=torch.uint8)])
    es = torch.cat([rs, torch.zeros(extra, rs.shape[1], dtype=torch.uint8)])
    a, b = int(cu_cpu[2]), int(cu_cpu[3])
    ev[a:b], es[a:b] = 0, 0
    a = int(cu_cpu[3]) + bs
    ev[a : a + bs], es[a : a + bs] = 0, 0
    assert same_bytes(dv, ev) and same_bytes(ds, es)


# ---------------------------------------------------------------------------------------
# invalid indices: never stricter than the replaced code (the rule in the module docstring)
# ---------------------------------------------------------------------------------------
def _eager(kv, bt, cu, n):
    """The replaced code (``reference.gather_indexer_k``) as uint8 rows, or the exception it raises."""
    try:
        v, s = gather_indexer_k(kv.cpu(), bt.cpu(), cu.cpu(), n)
    except (IndexError, RuntimeError) as exc:
        return exc
    return v.view(torch.uint8), s.view(torch.uint8).reshape(n, -1)


def _kernel_runs(kv, bt, cu, n, hd, grid_by, g):
    dv = poison((n, hd), torch.uint8, g, kv.device)
    ds = poison((n, scale_bytes(hd)), torch.uint8, g, kv.device)
    mod.gather_triton(kv, bt, cu, dv, ds, block_t=BLOCK_T, grid_by=grid_by)
    return dv, ds


def _edge_case(kind, device=DEVICE):
    """Valid inputs that eager computes (-> must match) but that look odd."""
    kv, bt, cu, n, hd, g = make_case(4, device="cpu")
    nb = kv.shape[0]
    if kind == "negative_block_ids":  # every used entry once as b - nb: the same blocks
        bt = torch.where(torch.rand(bt.shape, generator=g) < 0.5, bt - nb, bt)
        bt[2, 0] = -nb  # the lowest id in range: block 0
    elif kind == "minus_one":  # -1 is the last block, as Python indexing reads it
        bt = bt.clone()
        bt[2, 0] = -1
    elif kind == "garbage_in_unused_entries":  # spare columns / rows are never read
        bt = torch.cat([bt, torch.full((2, bt.shape[1]), 10**6, dtype=bt.dtype)], 0)
        lens = (cu[1:] - cu[:-1]).long()
        for r in range(lens.shape[0]):
            used = -(-int(lens[r]) // kv.shape[1])
            bt[r, used:] = -(10**6)
    elif kind == "cu0_negative":  # request 0 starts before token 0: eager reads its tail
        cu = cu.clone()
        cu[0] = -5
    elif kind == "fewer_tokens":
        n = n - 9
    return kv.to(device), bt.to(device), cu.to(device), n, hd, g


EDGE = ["negative_block_ids", "minus_one", "garbage_in_unused_entries", "cu0_negative", "fewer_tokens"]


@pytest.mark.parametrize("kind", EDGE)
def test_edge_cases_match_eager(kind):
    kv, bt, cu, n, hd, g = _edge_case(kind)
    ref = _eager(kv, bt, cu, n)
    assert not isinstance(ref, Exception), ref
    v, s = OPS.indexer_k_gather(kv, bt, cu, n, hd)
    assert same_bytes(v, ref[0]) and same_bytes(s, ref[1])
    dv, ds = torch.empty_like(v), torch.empty(n, hd // 128, dtype=torch.float32, device=kv.device)
    OPS.indexer_k_gather_out(kv, dv, ds, bt, cu)
    assert same_bytes(dv, ref[0]) and same_bytes(ds, ref[1])
    if LAUNCHER_OK:
        for grid_by in ("token", "block"):
            dv, ds = _kernel_runs(kv, bt, cu, n, hd, grid_by, g)
            assert same_bytes(dv, ref[0]) and same_bytes(ds, ref[1]), grid_by


def _refused_case(kind, device="cpu"):
    """``(inputs, CPU error regex, kernel assert text, how eager behaves)``; the inputs on
    ``device`` (on CUDA only in a subprocess: tests/test_indexer_asserts_cuda.py)."""
    out = _refused_inputs(kind)
    return (tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in out[0]), *out[1:])


def _refused_inputs(kind):
    kv, bt, cu, n, hd, g = make_case(4, device="cpu")
    nb = kv.shape[0]
    bt = bt.clone()
    if kind == "block_id_high":
        bt[6, 2] = nb
        return (kv, bt, cu, n, hd), rf"block_table: block id {nb} out of range \[-{nb}, {nb}\)", "block id out of range", "raises"
    if kind == "block_id_low":
        bt[3, 1] = -nb - 1
        return (kv, bt, cu, n, hd), rf"block_table: block id {-nb - 1} out of range", "block id out of range", "raises"
    if kind == "column_past_width":
        return (kv, bt[:, :2], cu, n, hd), "block_table: request 3 needs block column 2", "past the table's width", "raises"
    total = int(cu[-1])
    if kind == "past_cu_end":
        return (kv, bt, cu, total + 1, hd), "num_tokens: num_tokens .* exceeds cu_seq_lens", "past cu_seq_lens", "raises"
    if kind == "past_cu_end_spare_row":
        bt = torch.cat([bt, bt[:1]])
        return (kv, bt, cu, total + 3, hd), "num_tokens: num_tokens .* exceeds cu_seq_lens", "past cu_seq_lens", "spelling"
    if kind == "cu0_positive":
        return (kv, bt, cu + 1, n, hd), r"cu_seq_lens: expected cu_seq_lens\[0\] <= 0", "before cu_seq_lens", "spelling"
    if kind == "cu_decreasing":
        cu = cu.clone()
        cu[4] = cu[3] - 1
        return (kv, bt, cu, n, hd), "cu_seq_lens: expected non-decreasing", "cu_seq_lens decreases", "undefined"
    raise AssertionError(kind)


REFUSED = ["block_id_high", "block_id_low", "column_past_width", "past_cu_end", "past_cu_end_spare_row",
           "cu0_positive", "cu_decreasing"]


@pytest.mark.parametrize("kind", REFUSED)
def test_refused_cases_and_why(kind):
    """The op refuses exactly what eager cannot compute: eager raises too, or its result
    depends on the spelling the pattern identified with it, or is undefined."""
    (kv, bt, cu, n, hd), cpu_error, _, eager = _refused_case(kind)
    ref = _eager(kv, bt, cu, n)
    if eager == "raises":
        assert isinstance(ref, Exception), "eager computes this: the op must not refuse it"
    elif eager == "spelling":  # another spelling the pattern accepts computes something else
        other = _eager_other_spelling(kv, bt, cu, n)
        assert isinstance(ref, Exception) or isinstance(other, Exception) or not (
            torch.equal(ref[0], other[0]) and torch.equal(ref[1], other[1])), "one result: reproduce it"
    else:  # searchsorted on unsorted boundaries: not the count the sorted case computes
        t = torch.arange(n)
        count = (cu.long()[None, :] <= t[:, None]).sum(1)
        assert not torch.equal(torch.searchsorted(cu, t.to(cu.dtype), right=True), count)
    with pytest.raises((ValueError, IndexError), match=cpu_error):
        OPS.indexer_k_gather(kv, bt, cu, n, hd)


def _eager_other_spelling(kv, bt, cu, n):
    """``reference.gather_indexer_k`` spelled as forks do, the same arithmetic for valid input:
    ``bucketize`` over ``cu[1:]``, the start read from ``cu[:-1]``."""
    nb, bs, row = kv.shape
    hd = row * 128 // 132
    t = torch.arange(n)
    req = torch.bucketize(t.to(cu.dtype), cu[1:], right=True)
    try:
        pos = t - cu[:-1][req]
        blk = bt[req, pos // bs]
    except IndexError as exc:
        return exc
    flat = kv.view(nb, -1)
    off = pos % bs
    v = flat[blk[:, None], (off * hd)[:, None] + torch.arange(hd)]
    s = flat[blk[:, None], (bs * hd + off * 4)[:, None] + torch.arange(4)]
    return v, s


@needs_launcher
@pytest.mark.skipif(HAS_CUDA, reason="a device assert poisons the CUDA context: tests/test_indexer_asserts_cuda.py")
@pytest.mark.parametrize("grid_by", ["token", "block"])
@pytest.mark.parametrize("kind", REFUSED)
def test_kernel_traps_refused_cases(kind, grid_by):
    """The Triton kernel (interpreter here, device-side asserts on CUDA) traps each refused case."""
    from triton.runtime.errors import InterpreterError

    (kv, bt, cu, n, hd), _, text, _ = _refused_case(kind)
    g = torch.Generator().manual_seed(3)
    with pytest.raises((InterpreterError, RuntimeError), match=text):
        _kernel_runs(kv, bt, cu, n, hd, grid_by, g)


# ---------------------------------------------------------------------------------------
# 2-D page caches (SGLang: uint8 [num_pages, page_size * (head_dim + 4 * G)])
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("i", [0, 1, 4], ids=["bs16_hd128", "bs16_hd512", "bs16_deep"])
def test_page_cache_2d(i):
    kv, bt, cu, n, hd, g = make_case(i)
    rv, rs = reference(kv, bt, cu, n, hd)
    nb, bs, row = kv.shape
    pages = kv.reshape(nb, bs * row)
    v, s = OPS.indexer_k_gather(pages, bt, cu, n, hd, bs)
    assert same_bytes(v, rv) and same_bytes(s, rs)
    dv = poison((n, hd), torch.uint8, g, kv.device)
    ds = poison((n, scale_bytes(hd)), torch.uint8, g, kv.device)
    OPS.indexer_k_gather_out(pages, dv, ds, bt, cu, block_size=bs)
    assert same_bytes(dv, rv) and same_bytes(ds, rs)
    # pages with a padded stride
    big = torch.zeros(nb, bs * row + 8, dtype=torch.uint8, device=kv.device)
    big[:, : bs * row] = pages
    padded = big[:, : bs * row]
    v, s = OPS.indexer_k_gather(padded, bt, cu, n, hd, block_size=bs)
    assert same_bytes(v, rv) and same_bytes(s, rs)
    if LAUNCHER_OK:
        for grid_by in ("token", "block"):
            dv = poison((n, hd), torch.uint8, g, kv.device)
            ds = poison((n, scale_bytes(hd)), torch.uint8, g, kv.device)
            mod.gather_triton(padded, bt, cu, dv, ds, block_size=bs, block_t=BLOCK_T, grid_by=grid_by)
            assert same_bytes(dv, rv) and same_bytes(ds, rs), grid_by
    with FakeTensorMode() as mode:
        fv, fs = OPS.indexer_k_gather(mode.from_tensor(pages), mode.from_tensor(bt), mode.from_tensor(cu), n, hd, bs)
        assert fv.shape == (n, hd) and fs.shape == (n, scale_bytes(hd))


@pytest.mark.parametrize("change, match", [
    (dict(block_size=0), "block_size: required"),
    (dict(block_size=24), "block_size: .* expected 24 \\* 132"),
    (dict(block_size=-1), "block_size: expected >= 0"),
    (dict(kv=lambda kv: kv.view(torch.int8)), "kv_cache: expected a 3-D uint8 tensor .* or a 2-D"),
    (dict(kv=lambda kv: kv[:, ::2]), "block_size|kv_cache: each page must be contiguous"),
    (dict(three_d_block_size=8), "block_size: expected 0 or kv_cache.shape\\[1\\] = 16"),
])
def test_page_cache_2d_bad_block_size(change, match):
    kv, bt, cu, n, hd, g = make_case(0)
    nb, bs, row = kv.shape
    pages = kv.reshape(nb, bs * row)
    block_size = change.get("block_size", bs)
    if "kv" in change:
        pages = change["kv"](pages)
    if "three_d_block_size" in change:
        pages, block_size = kv, change["three_d_block_size"]
    with pytest.raises((ValueError, TypeError), match=match):
        OPS.indexer_k_gather(pages, bt, cu, n, hd, block_size)
    dv = poison((n, hd), torch.uint8, g, kv.device)
    dv0 = dv.clone()
    ds = torch.zeros(n, 4, dtype=torch.uint8, device=kv.device)
    with pytest.raises((ValueError, TypeError), match=match):
        OPS.indexer_k_gather_out(pages, dv, ds, bt, cu, block_size)
    assert torch.equal(dv, dv0)


# ---------------------------------------------------------------------------------------
# fake impls and opcheck
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("hd", [128, 512])
def test_fake_impls(hd):
    kv, bt, cu, n, _, _ = make_case(1 if hd == 512 else 0, device="cpu")
    with FakeTensorMode() as mode:
        fkv, fbt, fcu = (mode.from_tensor(x) for x in (kv, bt, cu))
        v, s = OPS.indexer_k_gather(fkv, fbt, fcu, 11, hd)
        assert v.shape == (11, hd) and s.shape == (11, scale_bytes(hd))
        assert v.dtype == s.dtype == torch.uint8
        dv = torch.empty(11, hd, dtype=torch.float8_e4m3fn)
        ds = torch.empty(11, hd // 128, dtype=torch.float32)
        assert OPS.indexer_k_gather_out(fkv, dv, ds, fbt, fcu) is None
        with pytest.raises(ValueError, match="cu_seq_lens"):
            OPS.indexer_k_gather(fkv, fbt, fcu.repeat(2), 11, hd)  # more requests than rows


def test_opcheck():
    kv, bt, cu, n, hd, _ = make_case(0, device="cpu")
    torch.library.opcheck(OPS.indexer_k_gather.default, (kv, bt, cu, n, hd))
    dv = torch.zeros(n, hd, dtype=torch.uint8)
    ds = torch.zeros(n, hd // 128, dtype=torch.float32)
    torch.library.opcheck(OPS.indexer_k_gather_out.default, (kv, dv, ds, bt, cu))
    pages = kv.reshape(kv.shape[0], -1)  # a 2-D page cache with block_size
    torch.library.opcheck(OPS.indexer_k_gather.default, (pages, bt, cu, n, hd, kv.shape[1]))
    torch.library.opcheck(OPS.indexer_k_gather_out.default, (pages, dv, ds, bt, cu, kv.shape[1]))


def test_compiles_fullgraph_dynamic():
    """Both ops trace into one graph with a symbolic num_tokens (fake impls, SymInt path)."""

    def f(kv, bt, cu, n):
        v, s = OPS.indexer_k_gather(kv, bt, cu, n, 128)
        dv = torch.empty(n, 128, dtype=torch.float8_e4m3fn, device=kv.device)
        ds = torch.empty(n, 1, dtype=torch.float32, device=kv.device)
        OPS.indexer_k_gather_out(kv, dv, ds, bt, cu)
        return v, s, dv, ds

    torch._dynamo.reset()
    cf = torch.compile(f, backend="aot_eager", dynamic=True, fullgraph=True)
    for i in (0, 4):
        kv, bt, cu, n, hd, _ = make_case(i)
        rv, rs = reference(kv, bt, cu, n, hd)
        v, s, dv, ds = cf(kv, bt, cu, n)
        assert same_bytes(v, rv) and same_bytes(s, rs)
        assert same_bytes(dv, rv) and same_bytes(ds, rs)


# ---------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------
def _bad_inputs(kind, device):
    kv, bt, cu, n, hd, _ = make_case(4, device=device)
    if kind == "kv_dtype":
        kv = kv.view(torch.int8)
    elif kind == "kv_ndim":
        kv = kv.flatten(1)
    elif kind == "kv_last_dim":
        kv = kv[:, :, :-4]
    elif kind == "kv_strides":
        kv = kv.transpose(0, 1)
    elif kind == "bt_dtype":
        bt = bt.float()
    elif kind == "bt_ndim":
        bt = bt[:, 0]
    elif kind == "cu_dtype":
        cu = cu.float()
    elif kind == "cu_len":  # more requests than table rows
        cu = torch.cat([cu, cu[-1:]] * (bt.shape[0] + 1))
    elif kind == "bt_range":
        bt = bt.clone()
        bt[6, 2] = kv.shape[0] + 7
    elif kind == "bt_narrow":
        bt = bt[:, :2]
    elif kind == "cu_start":
        cu = cu + 1
    elif kind == "cu_order":
        cu = cu.clone()
        cu[4] = cu[3] - 1
    elif kind == "device":
        cu = cu.cpu()
    return kv, bt, cu, n, hd


META_ERRORS = {
    "kv_dtype": "kv_cache",
    "kv_ndim": "kv_cache",
    "kv_last_dim": "kv_cache",
    "kv_strides": "kv_cache",
    "bt_dtype": "block_table",
    "bt_ndim": "block_table",
    "cu_dtype": "cu_seq_lens",
    "cu_len": "cu_seq_lens",
    "device": "cu_seq_lens",
}
VALUE_ERRORS = {  # checked by the CPU kernel only
    "bt_range": r"block_table: block id \d+ out of range \[-\d+, \d+\) for request 6",
    "bt_narrow": "block_table: request 3 needs block column 2",
    "cu_start": r"cu_seq_lens: expected cu_seq_lens\[0\] <= 0",
    "cu_order": "cu_seq_lens: expected non-decreasing",
}


def _check_rejected(kind, match, device):
    kv, bt, cu, n, hd = _bad_inputs(kind, device)
    exc = (ValueError, IndexError, TypeError)
    with pytest.raises(exc, match=match):
        OPS.indexer_k_gather(kv, bt, cu, n, hd)
    g = torch.Generator().manual_seed(7)
    dv = poison((n, hd), torch.uint8, g, device)
    ds = poison((n, hd // 128), torch.float32, g, device)
    dv0, ds0 = dv.clone(), ds.clone()
    with pytest.raises(exc, match=match):
        OPS.indexer_k_gather_out(kv, dv, ds, bt, cu)
    assert torch.equal(dv, dv0) and torch.equal(ds.view(torch.uint8), ds0.view(torch.uint8))
    if kind in META_ERRORS and LAUNCHER_OK:
        with pytest.raises(exc, match=match):
            mod.gather_triton(kv, bt, cu, dv, ds, block_t=BLOCK_T)
        assert torch.equal(dv, dv0)


@pytest.mark.parametrize("kind", sorted(META_ERRORS))
def test_rejects_bad_metadata(kind):
    if kind == "device" and not HAS_CUDA:
        pytest.skip("device mismatch needs a GPU")
    _check_rejected(kind, META_ERRORS[kind], DEVICE)


@pytest.mark.parametrize("kind", sorted(VALUE_ERRORS))
def test_rejects_bad_values_cpu(kind):
    _check_rejected(kind, VALUE_ERRORS[kind], "cpu")


def test_rejects_bad_head_dim_and_num_tokens():
    kv, bt, cu, n, hd, g = make_case(4, device=DEVICE)
    for bad_hd in (100, 0, 256):  # 256 is valid but does not match kv_cache's last dim
        arg = "head_dim" if bad_hd != 256 else "kv_cache"
        with pytest.raises(ValueError, match=arg):
            OPS.indexer_k_gather(kv, bt, cu, n, bad_hd)
    with pytest.raises(ValueError, match="num_tokens: expected >= 0"):
        OPS.indexer_k_gather(kv, bt, cu, -1, hd)
    # out variant: head_dim comes from dst_value
    dv = poison((n, 100), torch.uint8, g, DEVICE)
    ds = poison((n, 1), torch.float32, g, DEVICE)
    dv0, ds0 = dv.clone(), ds.clone()
    with pytest.raises(ValueError, match="dst_value: head_dim must be a positive multiple of 128"):
        OPS.indexer_k_gather_out(kv, dv, ds, bt, cu)
    assert torch.equal(dv, dv0) and torch.equal(ds.view(torch.uint8), ds0.view(torch.uint8))
    # destination shape/dtype problems
    dv = poison((n, hd), torch.uint8, g, DEVICE)
    for ds_bad, what in [
        (poison((n, 2), torch.float32, g, DEVICE), "bytes per row"),
        (poison((n + 1, 1), torch.float32, g, DEVICE), "rows"),
        (poison((n, 8), torch.uint8, g, DEVICE)[:, ::2], "bytes per row|contiguous"),
    ]:
        with pytest.raises(ValueError, match=f"dst_scale: .*({what})"):
            OPS.indexer_k_gather_out(kv, dv, ds_bad, bt, cu)
    with pytest.raises(ValueError, match="dst_value: expected a 2-D tensor of a 1-byte dtype"):
        OPS.indexer_k_gather_out(kv, dv.view(torch.int16), ds, bt, cu)


def test_rejects_too_many_tokens_cpu():
    kv, bt, cu, n, hd, g = make_case(4, device="cpu")
    total = int(cu[-1])
    with pytest.raises(ValueError, match=f"num_tokens: num_tokens {total + 1} exceeds cu_seq_lens"):
        OPS.indexer_k_gather(kv, bt, cu, total + 1, hd)
    dv = poison((total + 1, hd), torch.uint8, g, "cpu")
    ds = poison((total + 1, 4), torch.uint8, g, "cpu")
    dv0, ds0 = dv.clone(), ds.clone()
    with pytest.raises(ValueError, match="dst_value: num_tokens .* exceeds cu_seq_lens"):
        OPS.indexer_k_gather_out(kv, dv, ds, bt, cu)
    assert torch.equal(dv, dv0) and torch.equal(ds, ds0)
