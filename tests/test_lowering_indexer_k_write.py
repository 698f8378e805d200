"""kda::indexer_k_write and its Triton launcher vs the token-by-token reference."""

import os

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kda_inductor.lowerings import _fp8
from kda_inductor.lowerings import indexer_k_write as mod
from kda_inductor.reference import cache_row_bytes, write_indexer_k_loop

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover
    HAS_TRITON = False

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
needs_launcher = pytest.mark.skipif(
    not (HAS_TRITON and (HAS_CUDA or os.environ.get("TRITON_INTERPRET") == "1")),
    reason="no triton, or no GPU and no interpreter",
)
OPS = torch.ops.kda


def make_case(head_dim=128, block_size=16, num_blocks=5, tokens=13, dtype=torch.bfloat16, seed=0,
              norm=False, padding=(2,), block_pad=0, device="cpu"):
    """Random k (some zeros and huge values), a poisoned cache whose block stride may be padded,
    distinct slots with padding (-1, -7), LayerNorm parameters if ``norm``."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(tokens, head_dim, generator=g) * 4
    k[0] = 0
    k[1, 5] = 3e4
    k = k.to(dtype)
    row = cache_row_bytes(head_dim)
    store = torch.randint(0, 256, (num_blocks, block_size * row + block_pad), dtype=torch.uint8, generator=g)
    cache = store[:, : block_size * row].view(num_blocks, block_size, row) if block_pad else store.view(
        num_blocks, block_size, row)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:tokens]
    for i, t in enumerate(padding):
        slots[t] = -1 - 6 * i
    w = (torch.rand(head_dim, generator=g) + 0.5) if norm else None
    b = (torch.randn(head_dim, generator=g) * 0.1) if norm else None
    to = lambda x: None if x is None else x.to(device)  # noqa: E731
    return to(k), to(cache), to(store), to(slots), to(w), to(b)


def _ref(k, cache, slots, ue8m0, w, b):
    out = cache.cpu().clone()
    write_indexer_k_loop(k.cpu(), out, slots.cpu(), ue8m0, None if w is None else w.cpu(),
                         None if b is None else b.cpu())
    return out


CASES = [  # head_dim, block_size, k dtype, norm, ue8m0, block_pad
    (128, 16, torch.bfloat16, False, False, 0),
    (128, 64, torch.bfloat16, True, True, 0),
    (512, 16, torch.bfloat16, True, False, 12),
    (512, 64, torch.float32, False, True, 0),
    (384, 16, torch.float16, True, True, 4),
    (256, 16, torch.float32, True, False, 0),
]


@pytest.mark.parametrize("hd,bs,dtype,norm,ue8m0,pad", CASES)
def test_cpu_op_is_bit_exact(hd, bs, dtype, norm, ue8m0, pad):
    k, cache, store, slots, w, b = make_case(hd, bs, dtype=dtype, norm=norm, block_pad=pad, seed=hd + bs)
    expected = _ref(k, cache, slots, ue8m0, w, b)
    store_before = store.clone()
    OPS.indexer_k_write(cache, k, slots, w, b, 1e-6, ue8m0)
    assert torch.equal(cache, expected)
    if pad:  # the padding between blocks is not the cache's: untouched
        assert torch.equal(store[:, -pad:], store_before[:, -pad:])


@needs_launcher
@pytest.mark.parametrize("hd,bs,dtype,norm,ue8m0,pad", CASES)
def test_triton_is_bit_exact(hd, bs, dtype, norm, ue8m0, pad):
    """Without the norm: exact, in the interpreter too (fp8 rounding is integer arithmetic).
    With it: the LayerNorm's reduction order differs from torch's, so a normalized value may
    move by an ulp and its fp8 code by one step (seen with float32 k; bf16 k mostly hides it)."""
    k, cache, store, slots, w, b = make_case(hd, bs, dtype=dtype, norm=norm, block_pad=pad, seed=hd + bs,
                                             device=DEVICE)
    expected = _ref(k, cache, slots, ue8m0, w, b)
    store_before = store.clone()
    mod.write_triton(cache, k, slots, w, b, 1e-6, ue8m0)
    if norm:
        from tests.test_indexer_k_write import _assert_cache_close

        _assert_cache_close(cache.cpu(), expected, slots.cpu(), hd)
    else:
        assert torch.equal(cache.cpu(), expected), f"{int((cache.cpu() != expected).sum())} bytes differ"
    if pad:
        assert torch.equal(store[:, -pad:], store_before[:, -pad:])


@needs_launcher
def test_triton_strided_k_and_block_t():
    k, cache, _, slots, _, _ = make_case(128, 16, tokens=9, device=DEVICE)
    wide = torch.zeros(9, 300, dtype=k.dtype, device=DEVICE)
    wide[:, 7:135] = k
    expected = _ref(k, cache, slots, True, None, None)
    mod.write_triton(cache, wide[:, 7:135], slots, ue8m0=True, block_t=4)
    assert torch.equal(cache.cpu(), expected)


@needs_launcher
def test_triton_without_checks_skips_out_of_range_slots():
    """``check=False`` (the explicit no-assert variant, for benchmarks) skips them."""
    k, cache, _, slots, _, _ = make_case(128, 16, tokens=6, padding=(), device=DEVICE)
    bad = slots.clone()
    bad[3] = cache.shape[0] * cache.shape[1] + 5
    expected = _ref(k[[0, 1, 2, 4, 5]], cache, slots[[0, 1, 2, 4, 5]], False, None, None)
    mod.write_triton(cache, k, bad, check=False)
    assert torch.equal(cache.cpu(), expected)


# ---------------------------------------------------------------------------------------
# slots: what the replaced eager code does (masked: skip; unmasked: Python indexing wraps)
# ---------------------------------------------------------------------------------------
def _eager_unmasked(k, cache, slots, ue8m0=False, flat_1d=False):
    """``reference.write_indexer_k`` without the ``torch.where(slot >= 0, ...)`` mask (and
    without the clamp): what unmasked serving code does, in the two store spellings the
    pattern reads (``flat[blk, cols] = q`` and ``cache.view(-1)[byte index] = q``)."""
    from kda_inductor.reference import quantize_k

    nb, bs, row = cache.shape
    t, d = k.shape
    sb = row - d
    q, scale = quantize_k(k, ue8m0)
    blk, off = (slots // bs)[:, None], slots % bs
    cols = off[:, None] * d + torch.arange(d)
    scols = bs * d + off[:, None] * sb + torch.arange(sb)
    if flat_1d:
        flat = cache.view(-1)
        flat[blk * bs * row + cols] = q.view(torch.uint8)
        flat[blk * bs * row + scols] = scale.view(torch.uint8)
    else:
        flat = cache.view(nb, -1)
        flat[blk, cols] = q.view(torch.uint8)
        flat[blk, scols] = scale.view(torch.uint8)


def _wrap_case(seed=5, tokens=9):
    k, cache, _, _, _, _ = make_case(128, 16, num_blocks=4, tokens=tokens, padding=(), seed=seed)
    total = cache.shape[0] * cache.shape[1]
    slots = torch.randperm(total - 2, generator=torch.Generator().manual_seed(seed))[:tokens] + 1
    slots[1], slots[4] = -1, -total  # the last slot and slot 0, counted from the end
    slots[7] -= total
    wrapped = torch.where(slots < 0, slots + total, slots)
    assert wrapped.unique().numel() == tokens
    return k, cache, slots, total


@pytest.mark.parametrize("flat_1d", [False, True], ids=["index_put", "flat_1d"])
def test_eager_wraps_unmasked_negative_slots(flat_1d):
    """Ground truth for ``wrap_negative``: unmasked eager writes slot -1 into the last row of
    the last block (s + num_slots); masked eager (``reference.write_indexer_k``) skips it."""
    from kda_inductor.reference import write_indexer_k

    k, cache, slots, total = _wrap_case()
    unmasked = cache.clone()
    _eager_unmasked(k, unmasked, slots, flat_1d=flat_1d)
    assert torch.equal(unmasked, _ref(k, cache, torch.where(slots < 0, slots + total, slots), False, None, None))
    masked = cache.clone()
    write_indexer_k(k, masked, slots)
    assert torch.equal(masked, _ref(k, cache, slots, False, None, None))  # the loop skips slots < 0
    assert not torch.equal(masked, unmasked)


@pytest.mark.parametrize("ue8m0", [False, True], ids=["plain", "ue8m0"])
def test_wrap_negative_matches_unmasked_eager(ue8m0):
    k, cache, slots, total = _wrap_case(seed=6)
    expected = cache.clone()
    _eager_unmasked(k, expected, slots, ue8m0)
    got = cache.clone()
    OPS.indexer_k_write(got, k, slots, None, None, 1e-6, ue8m0, wrap_negative=True)
    assert torch.equal(got, expected)
    skipped = cache.clone()  # wrap_negative=False: padding, as masked code
    OPS.indexer_k_write(skipped, k, slots, None, None, 1e-6, ue8m0)
    assert torch.equal(skipped, _ref(k, cache, slots, ue8m0, None, None))
    if HAS_TRITON and (HAS_CUDA or os.environ.get("TRITON_INTERPRET") == "1"):
        kern = cache.clone().to(DEVICE)
        mod.write_triton(kern, k.to(DEVICE), slots.to(DEVICE), ue8m0=ue8m0, wrap_negative=True, block_t=4)
        assert torch.equal(kern.cpu(), expected)
        kern = cache.clone().to(DEVICE)
        mod.write_triton(kern, k.to(DEVICE), slots.to(DEVICE), ue8m0=ue8m0, block_t=4)
        assert torch.equal(kern.cpu(), skipped)


@pytest.mark.parametrize("kind", ["past_end", "past_end_wrap", "below_minus_num_slots"])
def test_out_of_range_slots_raise_like_eager(kind):
    """Eager raises IndexError on these (both spellings, masked or not); the CPU op raises
    before writing anything, the kernel traps (interpreter here, a device assert on CUDA)."""
    from kda_inductor.reference import write_indexer_k

    k, cache, slots, total = _wrap_case(seed=7)
    wrap = kind != "past_end"
    bad = slots.clone()
    bad[2] = total if kind.startswith("past_end") else -total - 1
    with pytest.raises(IndexError):
        _eager_unmasked(k, cache.clone(), bad)
    if kind == "past_end":
        with pytest.raises(IndexError):
            write_indexer_k(k, cache.clone(), bad)
    before = cache.clone()
    with pytest.raises(IndexError, match=rf"slot_mapping: slot {int(bad[2])} \(token 2\) out of range"):
        OPS.indexer_k_write(cache, k, bad, None, None, 1e-6, False, wrap_negative=wrap)
    assert torch.equal(cache, before)
    if HAS_TRITON and os.environ.get("TRITON_INTERPRET") == "1" and not HAS_CUDA:
        from triton.runtime.errors import InterpreterError

        with pytest.raises(InterpreterError, match="indexer_k_write: slot"):
            mod.write_triton(cache, k, bad, wrap_negative=wrap, block_t=4)


# ---------------------------------------------------------------------------------------
# 2-D page caches (SGLang: uint8 [num_pages, page_size * (head_dim + 4 * G)])
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("hd,bs,pad", [(128, 16, 0), (512, 64, 12)])
def test_page_cache_2d_matches_3d(hd, bs, pad):
    k, cache, store, slots, w, b = make_case(hd, bs, norm=True, block_pad=pad, seed=11)
    expected = _ref(k, cache, slots, True, w, b)
    nb, _, row = cache.shape
    pages = store[:, : bs * row]
    assert pages.dim() == 2 and pages.data_ptr() == cache.data_ptr()
    OPS.indexer_k_write(pages, k, slots, w, b, 1e-6, True, True, bs)
    assert torch.equal(cache, expected)
    if HAS_TRITON and (HAS_CUDA or os.environ.get("TRITON_INTERPRET") == "1"):
        k2, cache2, store2, *_ = make_case(hd, bs, norm=True, block_pad=pad, seed=11, device=DEVICE)
        expected = _ref(k2, cache2, slots, False, None, None)  # quant + write: exact in the kernel too
        mod.write_triton(store2[:, : bs * row], k2, slots.to(DEVICE), block_size=bs, block_t=4)
        assert torch.equal(cache2.cpu(), expected)
    with FakeTensorMode() as fm:
        OPS.indexer_k_write(fm.from_tensor(pages), fm.from_tensor(k), fm.from_tensor(slots), fm.from_tensor(w),
                            fm.from_tensor(b), 1e-6, True, True, bs)


@pytest.mark.parametrize("block_size, match", [
    (0, "block_size: required"),
    (8, "block_size: .* expected 8 \\* 132"),
    (-2, "block_size: expected >= 0"),
])
def test_page_cache_2d_bad_block_size(block_size, match):
    k, cache, _, slots, _, _ = make_case(128, 16)
    pages = cache.view(cache.shape[0], -1)
    before = pages.clone()
    with pytest.raises(ValueError, match=match):
        OPS.indexer_k_write(pages, k, slots, None, None, 1e-6, False, True, block_size)
    with pytest.raises(ValueError, match="block_size: expected 0 or kv_cache.shape"):
        OPS.indexer_k_write(cache, k, slots, None, None, 1e-6, False, True, 8)
    assert torch.equal(pages, before)


# ---------------------------------------------------------------------------------------
# the kernel's rounding helpers against torch, value by value
# ---------------------------------------------------------------------------------------
if HAS_TRITON:

    @triton.jit
    def _helpers_kernel(x_ptr, pow2_ptr, fp8_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        x = tl.load(x_ptr + i, mask=m, other=1.0)
        tl.store(pow2_ptr + i, _fp8.ceil_pow2(tl.abs(x)), mask=m)
        tl.store(fp8_ptr + i, _fp8.e4m3_bits(tl.minimum(tl.maximum(x, -448.0), 448.0)), mask=m)


def _edge_floats():
    """Powers of two just above/below (mantissa bits 0..200 and near 2**23) over the scales'
    exponent range, plus every fp8 grid point and midpoint +-1 float32 ulp."""
    ks = torch.arange(-24, 40)
    ms = torch.cat([torch.arange(0, 200), torch.tensor([2**23 - 1, 2**23 - 2, 2**22, 12345])])
    bits = (((ks[:, None] + 127) << 23) | ms[None, :]).flatten().to(torch.int32)
    scales = bits.view(torch.float32)
    grid = torch.arange(0, 256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[torch.isfinite(grid)].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    near = torch.cat([grid, mids])
    nb = near.view(torch.int32)
    near = torch.cat([near, (nb + 1).view(torch.float32), (nb - 1).view(torch.float32)])
    near = near[torch.isfinite(near) & (near.abs() <= 448)]
    return scales, torch.cat([near, -near, torch.randn(4096) * 100])


@needs_launcher
def test_ue8m0_and_fp8_rounding_match_torch():
    scales, values = _edge_floats()
    for x in (scales, values):
        x = x.to(DEVICE)
        pow2 = torch.empty_like(x)
        fp8 = torch.empty(x.shape, dtype=torch.uint8, device=DEVICE)
        _helpers_kernel[(triton.cdiv(x.numel(), 1024),)](x, pow2, fp8, x.numel(), BLOCK=1024)
        if x is not values:  # positive normal scales
            ref = torch.pow(2.0, torch.ceil(torch.log2(x)))
            assert torch.equal(pow2, ref), f"{int((pow2 != ref).sum())} ue8m0 scales differ"
        ref8 = x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
        assert torch.equal(fp8, ref8), f"{int((fp8 != ref8).sum())} fp8 casts differ"


# ---------------------------------------------------------------------------------------
# argument errors: clear, named, raised before anything is written
# ---------------------------------------------------------------------------------------
def _bad_args():
    k, cache, _, slots, w, b = make_case(128, 16, norm=True)
    return [
        (dict(k=k.float().double()), "k: expected a 2-D bfloat16/float16/float32"),
        (dict(k=k[:, :100]), "k: head_dim"),
        (dict(kv_cache=cache.view(torch.int8)), "kv_cache: expected a 3-D uint8"),
        (dict(kv_cache=cache[:, :, :130]), "kv_cache: expected last dim"),
        (dict(kv_cache=cache.transpose(0, 1)), "kv_cache: each block must be contiguous"),
        (dict(slot_mapping=slots.float()), "slot_mapping: expected a 1-D int32/int64"),
        (dict(slot_mapping=slots[:-1]), "slot_mapping: expected 13 entries"),
        (dict(weight=None), "weight: weight and bias come together"),
        (dict(weight=w.double()), "weight: expected a float32 tensor [128]"),
        (dict(bias=b[:64]), "bias: expected a float32 tensor [128]"),
        (dict(eps=float("nan")), "eps: expected a finite float"),
        (dict(slot_mapping=torch.where(slots == slots.max(), 10**6, slots)), "slot_mapping: slot 1000000"),
    ], dict(kv_cache=cache, k=k, slot_mapping=slots, weight=w, bias=b, eps=1e-6, ue8m0=False)


@pytest.mark.parametrize("i", range(12))
def test_bad_arguments_are_named_and_leave_the_cache_untouched(i):
    cases, good = _bad_args()
    change, msg = cases[i]
    args = {**good, **change}
    before = args["kv_cache"].clone()
    with pytest.raises((ValueError, TypeError, IndexError), match=msg.replace("[", r"\[").replace("]", r"\]")):
        OPS.indexer_k_write(**args)
    assert torch.equal(args["kv_cache"], before)
    if "slot 1000000" not in msg:  # metadata errors: the fake impl and the launcher say the same
        with FakeTensorMode() as fm, pytest.raises((ValueError, TypeError), match=msg.split(":")[0]):
            fake = {n: fm.from_tensor(v) if isinstance(v, torch.Tensor) else v for n, v in args.items()}
            OPS.indexer_k_write(**fake)
        if HAS_TRITON:
            with pytest.raises((ValueError, TypeError), match=msg.split(":")[0]):
                mod.write_triton(**args)


def test_device_mismatch_is_named():
    k, cache, _, slots, _, _ = make_case(128, 16)
    with pytest.raises(ValueError, match="slot_mapping: expected device"):
        mod.validate(cache, k, slots.to("meta"), None, None, 1e-6)


def test_opcheck():
    k, cache, _, slots, w, b = make_case(128, 16, norm=True)
    torch.library.opcheck(OPS.indexer_k_write.default, (cache, k, slots, w, b, 1e-6, True))
    torch.library.opcheck(OPS.indexer_k_write.default, (cache, k, slots.int(), None, None, 1e-6, False))
    pages = cache.view(cache.shape[0], -1)  # a 2-D page cache, negative slots wrapped
    torch.library.opcheck(OPS.indexer_k_write.default,
                          (pages, k, slots, w, b, 1e-6, True, True, cache.shape[1], True))


@pytest.mark.parametrize("capability,hardware", [((7, 5), False), ((8, 0), False), ((8, 6), False),
                                                  ((8, 9), True), ((9, 0), True), ((10, 0), True)])
def test_hardware_fp8_casts_only_where_the_gpu_has_them(capability, hardware, monkeypatch):
    """Triton refuses ``float8e4nv`` below compute capability 8.9 (an A100 would fail to compile the
    kernel): there the kernels take the integer roundings, which the test below checks equal."""
    from types import SimpleNamespace

    from kda_inductor.lowerings._fp8 import hardware_casts

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert hardware_casts(SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))) is hardware
    assert hardware_casts(torch.zeros(1)) is False  # CPU: the interpreter's integer roundings


@pytest.mark.cuda
@pytest.mark.parametrize("norm", [False, True], ids=["quant", "norm"])
@pytest.mark.parametrize("ue8m0", [False, True], ids=["plain", "ue8m0"])
def test_hardware_casts_equal_integer_roundings(norm, ue8m0):
    """The GPU path (hardware bf16 / fp8 casts, ue8m0 division as a multiplication) writes the
    same bytes as the integer roundings the interpreter runs, over values spread across 40
    binades (fp8 subnormals, ties, the 448 clamp)."""
    g = torch.Generator().manual_seed(7)
    k = torch.randn(4096, 128, generator=g) * torch.exp2(torch.randint(-20, 20, (4096, 128), generator=g).float())
    k = k.to(torch.bfloat16).cuda()
    row = cache_row_bytes(128)
    hw = torch.randint(0, 256, (65, 64, row), dtype=torch.uint8, generator=g).cuda()
    exact = hw.clone()
    slots = (torch.randperm(64 * 64, generator=g) + 64).cuda()
    w, b = (torch.rand(128, generator=g).cuda() + 0.5, torch.randn(128, generator=g).cuda()) if norm else (None, None)
    mod.write_triton(hw, k, slots, w, b, 1e-6, ue8m0, hw_casts=True)
    mod.write_triton(exact, k, slots, w, b, 1e-6, ue8m0, hw_casts=False)
    assert torch.equal(hw, exact), f"{int((hw != exact).sum())} bytes differ"


@needs_launcher
@pytest.mark.parametrize("ue8m0", [False, True], ids=["plain", "ue8m0"])
def test_triton_float32_norm_round_norm_false(ue8m0):
    """``round_norm=False``: the float32 LayerNorm output is quantized as is (the reference:
    the loop on the float32 norm), within one fp8 step (reduction order); the CPU op exact."""
    from kda_inductor.reference import layer_norm_k
    from tests.test_indexer_k_write import _assert_cache_close

    k, cache, store, slots, w, b = make_case(128, 16, norm=True, seed=17, device=DEVICE)
    kn = layer_norm_k(k.cpu(), w.cpu(), b.cpu(), round_to_input=False)
    expected = _ref(kn, cache, slots, ue8m0, None, None)
    cpu = cache.cpu().clone()
    OPS.indexer_k_write(cpu, k.cpu(), slots.cpu(), w.cpu(), b.cpu(), 1e-6, ue8m0, False)
    assert torch.equal(cpu, expected)
    mod.write_triton(cache, k, slots, w, b, 1e-6, ue8m0, round_norm=False)
    _assert_cache_close(cache.cpu(), expected, slots.cpu(), 128)
