"""Property tests: each rewrite's canonical form, rewritten into equivalent spellings by
composing choices (hypothesis), must give the same match count and the same bytes.

For every generated spelling: eager gives bit-identical results to the canonical form's
eager (so the choices really are equivalent; a failure there is a bug of this file), the
compiled spelling matches exactly like the canonical form does, and its compiled results
are bit-identical to the compiled canonical form and to eager. Examples are derandomized
(stable in CI), few (each costs a compile; KDA_PROPERTY_EXAMPLES=N for a longer search) and
not shrunk (shrinking would recompile).
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

from kda_inductor.patterns import REWRITE_NAMES
from kda_inductor.reference import random_indexer_cache
from kda_inductor.testing import assert_close_to_eager, compile_for_test, fresh_compile
from tests.spellings._corpus import FORCED, gen, partition, poison, randn

EXAMPLES = int(os.environ.get("KDA_PROPERTY_EXAMPLES", "6"))
"""Generated examples per property, on top of the two explicit ones (the issue's spellings)."""
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    phases=(Phase.explicit, Phase.generate), report_multiple_bugs=False)


def _bytes(x):
    """Every tensor output as flat bytes (spellings may return other shapes or views)."""
    xs = x if isinstance(x, (list, tuple)) else [x]
    return [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in xs]


def _compiled(fn, args):
    with torch.no_grad(), fresh_compile():
        c = compile_for_test(fn, options=FORCED)
        out = c(*args)
    return out, c


def _check(rewrite: str, variant, variant_args, canonical_eager, canonical_compiled, *, mutated=None):
    """The variant: eager bytes == canonical eager bytes; compiled: one match of ``rewrite``
    (none of the others) and bytes == canonical compiled == eager. ``mutated`` picks the
    argument whose bytes are the result (a cache) instead of the return value."""
    pick = (lambda out, args: _bytes(args[mutated])) if mutated is not None else (lambda out, args: _bytes(out))
    eager_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in variant_args]
    with torch.no_grad():
        eager = pick(variant(*eager_args), eager_args)
    assert_close_to_eager(eager, canonical_eager, exact=True)  # the spelling is equivalent
    comp_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in variant_args]
    out, c = _compiled(variant, comp_args)
    expected = {name: int(name == rewrite) for name in REWRITE_NAMES}
    if c.matches != expected:
        misses = "\n".join(f"  {m.location}: {m.check}" for r in c.records for m in r.misses.get(rewrite, []))
        raise AssertionError(f"matches {c.matches}, expected {expected}; closest misses:\n{misses or '  (none)'}")
    got = pick(out, comp_args)
    assert_close_to_eager(got, canonical_compiled, exact=True)
    assert_close_to_eager(got, eager, exact=True)


def _canonical(rewrite, fn, args, mutated=None):
    """(eager bytes, compiled bytes) of the canonical form; it must match once itself."""
    pick = (lambda out, a: _bytes(a[mutated])) if mutated is not None else (lambda out, a: _bytes(out))
    eager_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    with torch.no_grad():
        eager = pick(fn(*eager_args), eager_args)
    comp_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    out, c = _compiled(fn, comp_args)
    assert c.matches[rewrite] == 1, f"the canonical {rewrite} form itself: {c.matches}"
    return eager, pick(out, comp_args)


# --------------------------------------------------------------------------- gdn_spec_split

T_SPLIT, C, H = 13, 24, 3


def _split_inputs():
    g = gen(100)
    s, ns = partition(g, T_SPLIT, 8, sort=False)
    return (randn(g, T_SPLIT, C), randn(g, 1, T_SPLIT, H, dtype=torch.float32), randn(g, 1, T_SPLIT, H), s, ns)


def split_canonical(qkv, g, beta, s, ns):
    return (qkv.index_select(0, s), qkv.index_select(0, ns), g.index_select(1, s), g.index_select(1, ns),
            beta.index_select(1, s), beta.index_select(1, ns))


@functools.cache
def _split_reference():
    return _canonical("gdn_spec_split", split_canonical, _split_inputs())


ROWS = {  # gather of token rows of a [T, C] source
    "index_select": lambda x, i: x.index_select(0, i),
    "getitem": lambda x, i: x[i],
    "torch.index_select": lambda x, i: torch.index_select(x, 0, i),
}
TOKENS = {  # gather along dim 1 of a [1, T, H] source
    "index_select": lambda x, i: x.index_select(1, i),
    "getitem": lambda x, i: x[:, i],
    "squeeze_select_unsqueeze": lambda x, i: x.squeeze(0).index_select(0, i).unsqueeze(0),
    "row_getitem_unsqueeze": lambda x, i: x[0][i].unsqueeze(0),
}
SOURCE_1TH = {  # how the [1, T, H] source is formed from a [T, H] tensor
    "view": lambda x: x.view(1, *x.shape),
    "reshape": lambda x: x.reshape(1, x.shape[0], -1),
    "unsqueeze": lambda x: x.unsqueeze(0),
}


@SETTINGS
@given(rows=st.sampled_from(sorted(ROWS)), tokens=st.sampled_from(sorted(TOKENS)),
       source=st.sampled_from(sorted(SOURCE_1TH)), index_dtype=st.sampled_from(["int32", "int64"]),
       sliced=st.booleans())
@example(rows="getitem", tokens="getitem", source="view", index_dtype="int64", sliced=True)
def test_gdn_spec_split_spellings(rows, tokens, source, index_dtype, sliced):
    rows_fn, tokens_fn, source_fn = ROWS[rows], TOKENS[tokens], SOURCE_1TH[source]
    n = T_SPLIT

    def variant(qkv, g2, beta2, s, ns):
        if sliced:  # vLLM cuts the inputs to the actual tokens first
            qkv, g2, beta2 = qkv[:n], g2[:n], beta2[:n]
        g, beta = source_fn(g2), source_fn(beta2)
        return (rows_fn(qkv, s), rows_fn(qkv, ns), tokens_fn(g, s), tokens_fn(g, ns),
                tokens_fn(beta, s), tokens_fn(beta, ns))

    qkv, g, beta, s, ns = _split_inputs()
    dt = getattr(torch, index_dtype)
    _check("gdn_spec_split", variant, (qkv, g[0], beta[0], s.to(dt), ns.to(dt)), *_split_reference())


# --------------------------------------------------------------------------- gated_norm_merge

T_NORM, NS, HN, D = 11, 4, 2, 16


def _norm_inputs():
    g = gen(101)
    s, ns = partition(g, T_NORM, NS, dtype=torch.int64, sort=False)
    w = (1 + 0.1 * torch.randn(D, generator=g))
    return (randn(g, 1, NS, HN, D), randn(g, 1, T_NORM - NS, HN, D), s, ns, randn(g, T_NORM, HN, D), w)


def norm_canonical(a, b, s, ns, z, w):
    out = torch.empty(1, T_NORM, HN, D, dtype=a.dtype)
    out.index_copy_(1, s, a)
    out.index_copy_(1, ns, b)
    x = out.reshape(-1, D).float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    return (y * F.silu(z.reshape(-1, D).float())).to(a.dtype)


@functools.cache
def _norm_reference():
    return _canonical("gated_norm_merge", norm_canonical, _norm_inputs())


def _merge(how, a, b, s, ns):
    """The merged [T, H, D] or [1, T, H, D] buffer (bytes identical either way)."""
    if how == "index_copy_dim1":
        out = torch.empty(1, T_NORM, HN, D, dtype=a.dtype)
        out.index_copy_(1, s, a)
        out.index_copy_(1, ns, b)
    elif how == "index_copy_dim0":
        out = torch.empty(T_NORM, HN, D, dtype=a.dtype)
        out.index_copy_(0, s, a[0])
        out.index_copy_(0, ns, b[0])
    elif how == "index_put_":
        out = torch.empty(T_NORM, HN, D, dtype=a.dtype)
        out.index_put_((s,), a[0])
        out.index_put_((ns,), b[0])
    elif how == "setitem_dim1":
        out = torch.empty(1, T_NORM, HN, D, dtype=a.dtype)
        out[:, s] = a
        out[:, ns] = b
    else:  # setitem_dim0
        out = torch.empty(T_NORM, HN, D, dtype=a.dtype)
        out[s] = a.squeeze(0)
        out[ns] = b.squeeze(0)
    return out


SQUARES = {"pow": lambda x: x.pow(2), "square": torch.square, "mul": lambda x: x * x,
           "pow_op": lambda x: x ** 2}
MEANS = {"keepdim": lambda v: v.mean(-1, keepdim=True), "unsqueeze": lambda v: v.mean(-1).unsqueeze(-1),
         "dim_kw": lambda v: torch.mean(v, dim=-1, keepdim=True)}
CASTS = {"float": lambda x: x.float(), "to": lambda x: x.to(torch.float32), "type": lambda x: x.type(torch.float32)}
GATES = {"F.silu": F.silu, "nn.SiLU": torch.nn.SiLU()}


@SETTINGS
@given(merge=st.sampled_from(["index_copy_dim1", "index_copy_dim0", "index_put_", "setitem_dim1", "setitem_dim0"]),
       rank=st.sampled_from([2, 3, 4]), reshape=st.booleans(), square=st.sampled_from(sorted(SQUARES)),
       mean=st.sampled_from(sorted(MEANS)), cast=st.sampled_from(sorted(CASTS)), gate=st.sampled_from(sorted(GATES)),
       index_dtype=st.sampled_from(["int32", "int64"]))
@example(merge="index_copy_dim1", rank=4, reshape=False, square="pow", mean="keepdim", cast="float", gate="F.silu",
         index_dtype="int64")  # the norm on [1, T, H, D]
@example(merge="setitem_dim0", rank=3, reshape=True, square="square", mean="unsqueeze", cast="to", gate="nn.SiLU",
         index_dtype="int32")
def test_gated_norm_merge_spellings(merge, rank, reshape, square, mean, cast, gate, index_dtype):
    sq, mn, cs, act = SQUARES[square], MEANS[mean], CASTS[cast], GATES[gate]
    shape = {2: (-1, D), 3: (T_NORM, HN, D), 4: (1, T_NORM, HN, D)}[rank]

    def variant(a, b, s, ns, z, w):
        if merge.startswith("index_copy"):
            s, ns = s.long(), ns.long()  # index_copy_ takes int64 only
        out = _merge(merge, a, b, s, ns)
        xs = out.reshape(shape) if reshape else out.view(shape)
        zs = z.reshape(shape) if reshape else z.view(shape)
        x = cs(xs)
        y = x * torch.rsqrt(mn(sq(x)) + 1e-6) * cs(w)
        return (y * act(cs(zs))).to(a.dtype)

    a, b, s, ns, z, w = _norm_inputs()
    dt = getattr(torch, index_dtype)
    _check("gated_norm_merge", variant, (a, b, s.to(dt), ns.to(dt), z, w), *_norm_reference())


# --------------------------------------------------------------------------- indexer_k_write

WT, BS, NB, HD = 10, 16, 6, 128
ROW = HD + 4


def _write_inputs():
    g = gen(102)
    k = (torch.randn(WT, HD, generator=g) * 3).to(torch.bfloat16)
    k[1] = 0  # an all-zero group: the floor decides its scale
    slots = torch.randperm((NB - 1) * BS, generator=g)[:WT] + BS
    return (k, poison(g, NB, BS, ROW), slots)


def write_canonical(k, cache, slots):
    nb, bs, row = cache.shape
    x = k.float().view(k.shape[0], -1, 128)
    scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-4) / 448.0
    scale = torch.pow(2.0, torch.ceil(torch.log2(scale)))
    q = (x / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(k.shape)
    blk, off = slots // bs, slots % bs
    flat = cache.view(nb, -1)
    flat[blk[:, None], off[:, None] * HD + torch.arange(HD)] = q.view(torch.uint8)
    flat[blk[:, None], bs * HD + off[:, None] * 4 + torch.arange(4)] = scale.view(k.shape[0], -1).view(torch.uint8)


@functools.cache
def _write_reference():
    return _canonical("indexer_k_write", write_canonical, _write_inputs(), mutated=1)


DIVS = {"//": lambda s, b: s // b, "div_floor": lambda s, b: torch.div(s, b, rounding_mode="floor"),
        ">>": lambda s, b: s >> (b.bit_length() - 1)}
MODS = {"%": lambda s, b: s % b, "sub": lambda s, b: s - s // b * b, "&": lambda s, b: s & (b - 1),
        "remainder": lambda s, b: torch.remainder(s, b)}
AMAXES = {"amax_keepdim": lambda a: a.amax(-1, keepdim=True), "amax_unsqueeze": lambda a: a.amax(-1).unsqueeze(-1),
          "max_values": lambda a: a.max(dim=-1, keepdim=True).values, "torch.amax": lambda a: torch.amax(a, -1, True)}
FLOORS = {"clamp": lambda a: a.clamp(min=1e-4), "clamp_min": lambda a: a.clamp_min(1e-4),
          "maximum": lambda a: torch.maximum(a, torch.tensor(1e-4)), "where": lambda a: torch.where(a < 1e-4, 1e-4, a)}
UE8M0 = {"pow": lambda s: torch.pow(2.0, torch.ceil(torch.log2(s))),
         "exp2": lambda s: torch.exp2(torch.ceil(torch.log2(s))),
         "bits": lambda s: ((s.view(torch.int32) + 0x7FFFFF) & 0x7F800000).view(torch.float32)}
GROUPS = {"view": lambda x: x.view(x.shape[0], -1, 128), "unflatten": lambda x: x.unflatten(-1, (-1, 128)),
          "reshape": lambda x: x.reshape(x.shape[0], -1, 128)}


def _store(how, q, scale, cache, blk, off):
    """q uint8 [T, 128], scale float32 [T, 1]; cache 3-D [nb, bs, row] or 2-D [nb, bs * row]."""
    nb = cache.shape[0]
    if how == "index_put":
        flat = cache.view(nb, -1)
        flat[blk[:, None], off[:, None] * HD + torch.arange(HD)] = q
        flat[blk[:, None], BS * HD + off[:, None] * 4 + torch.arange(4)] = scale.view(torch.uint8)
    elif how == "regions":
        flat = cache.view(nb, -1)
        flat[:, : BS * HD].view(nb, BS, HD)[blk, off] = q
        flat[:, BS * HD:].view(torch.float32).view(nb, BS, 1)[blk, off] = scale
    else:  # flat index_copy_
        base = blk * (BS * ROW)
        flat = cache.view(-1)
        flat.index_copy_(0, ((base + off * HD)[:, None] + torch.arange(HD)).reshape(-1), q.reshape(-1))
        flat.index_copy_(0, ((base + BS * HD + off * 4)[:, None] + torch.arange(4)).reshape(-1),
                         scale.view(torch.uint8).reshape(-1))


@SETTINGS
@given(div=st.sampled_from(sorted(DIVS)), mod=st.sampled_from(sorted(MODS)), amax=st.sampled_from(sorted(AMAXES)),
       floor=st.sampled_from(sorted(FLOORS)), ue8m0=st.sampled_from(sorted(UE8M0)),
       group=st.sampled_from(sorted(GROUPS)),
       store=st.sampled_from(["index_put", "regions", "index_copy_"]), cache_2d=st.booleans(),
       slot_dtype=st.sampled_from(["int32", "int64"]))
@example(div="//", mod="%", amax="amax_keepdim", floor="clamp", ue8m0="pow", group="view", store="index_put",
         cache_2d=True, slot_dtype="int64")  # the 2-D page buffer
@example(div=">>", mod="&", amax="amax_unsqueeze", floor="maximum", ue8m0="exp2", group="unflatten",
         store="regions", cache_2d=False, slot_dtype="int32")
def test_indexer_k_write_spellings(div, mod, amax, floor, ue8m0, group, store, cache_2d, slot_dtype):
    dv, md, am, fl, ue, gr = DIVS[div], MODS[mod], AMAXES[amax], FLOORS[floor], UE8M0[ue8m0], GROUPS[group]

    def variant(k, cache, slots):
        x = gr(k.float())
        scale = ue(fl(am(x.abs())) / 448.0)
        q = (x / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(k.shape).view(torch.uint8)
        scale = scale.view(k.shape[0], 1)
        _store(store, q, scale, cache, dv(slots, BS), md(slots, BS))

    k, cache, slots = _write_inputs()
    if cache_2d:
        cache = cache.view(NB, BS * ROW)
    _check("indexer_k_write", variant, (k, cache, slots.to(getattr(torch, slot_dtype))), *_write_reference(),
           mutated=1)


# --------------------------------------------------------------------------- indexer_k_gather

GSEQS, GBS = [5, 0, 37, 1, 20], 16


def _gather_inputs():
    cache, table, cu, n = random_indexer_cache(GSEQS, GBS, 128, table_stride_pad=2, generator=gen(103))
    return (cache, table, cu, torch.empty(n, 0))


def gather_canonical(cache, table, cu, like):
    from kda_inductor.reference import gather_indexer_k
    return gather_indexer_k(cache, table, cu, like.shape[0])


@functools.cache
def _gather_reference():
    return _canonical("indexer_k_gather", gather_canonical, _gather_inputs())


REQUESTS = {
    "searchsorted_right": lambda cu, t: torch.searchsorted(cu, t, right=True) - 1,
    "bucketize": lambda cu, t: torch.bucketize(t, cu[1:], right=True),
    "searchsorted_left_plus1": lambda cu, t: torch.searchsorted(cu, t + 1) - 1,
    "searchsorted_right_clamp":
        lambda cu, t: torch.clamp(torch.searchsorted(cu, t, right=True) - 1, 0, cu.shape[0] - 2),
}
FLATS = {  # cache (3-D or 2-D) -> [nb, block_bytes]
    "view": lambda c: c.view(c.shape[0], -1), "reshape": lambda c: c.reshape(c.shape[0], -1),
    "flatten": lambda c: c.flatten(1),
}


@SETTINGS
@given(search=st.sampled_from(sorted(REQUESTS)), div=st.sampled_from(sorted(DIVS)), mod=st.sampled_from(sorted(MODS)),
       flat=st.sampled_from(sorted(FLATS)), indices=st.sampled_from(["2d", "1d_then_view", "base_1d_cache"]),
       cache_2d=st.booleans(), table_dtype=st.sampled_from(["int32", "int64"]),
       cu_dtype=st.sampled_from(["int32", "int64"]))
@example(search="searchsorted_right", div="//", mod="%", flat="view", indices="2d", cache_2d=True,
         table_dtype="int32", cu_dtype="int32")  # the 2-D page buffer
@example(search="searchsorted_right_clamp", div="div_floor", mod="sub", flat="flatten", indices="1d_then_view",
         cache_2d=False, table_dtype="int64", cu_dtype="int64")
def test_indexer_k_gather_spellings(search, div, mod, flat, indices, cache_2d, table_dtype, cu_dtype):
    rq, dv, md, fl = REQUESTS[search], DIVS[div], MODS[mod], FLATS[flat]

    def variant(cache, table, cu, like):
        n = like.shape[0]
        token = torch.arange(n)
        req = rq(cu, token)
        pos = token - cu[req]
        blk = table[req, dv(pos, GBS)]
        off = md(pos, GBS)
        vcol = (off * 128)[:, None] + torch.arange(128)
        scol = (GBS * 128 + off * 4)[:, None] + torch.arange(4)
        if indices == "2d":
            f = fl(cache)
            values, scales = f[blk[:, None], vcol], f[blk[:, None], scol]
        elif indices == "1d_then_view":
            f = fl(cache)
            values = f[blk[:, None].expand(-1, 128).reshape(-1), vcol.reshape(-1)].view(n, 128)
            scales = f[blk[:, None].expand(-1, 4).reshape(-1), scol.reshape(-1)].view(n, 4)
        else:  # one flat byte index per element into the 1-D cache
            base = (blk.long() * (GBS * 132))[:, None]
            f = cache.view(-1)
            values, scales = f[(base + vcol).reshape(-1)].view(n, 128), f[(base + scol).reshape(-1)].view(n, 4)
        return values.view(torch.float8_e4m3fn), scales.view(torch.float32)

    cache, table, cu, like = _gather_inputs()
    if cache_2d:
        cache = cache.view(cache.shape[0], -1)
    args = (cache, table.to(getattr(torch, table_dtype)), cu.to(getattr(torch, cu_dtype)), like)
    _check("indexer_k_gather", variant, args, *_gather_reference())



# --------------------------------------------------------------------------- gdn_recurrent_step

RT, RB, RHK, RHV, RD = 3, 2, 2, 4, 8


def _recurrent_inputs():
    g = gen(106)
    return [randn(g, RB, RT, RHK, RD), randn(g, RB, RT, RHK, RD), randn(g, RB, RT, RHV, RD),
            -torch.rand(RB, RT, RHV, generator=g), torch.rand(RB, RT, RHV, generator=g).to(torch.bfloat16),
            torch.randn(RB, RHV, RD, RD, generator=g) * 0.5]


def recurrent_canonical(q, k, v, g, beta, cache):
    """The op's own order (its CPU loop's): token-major, GQA by repeat_interleave, l2norm, scale."""
    q, k = (x.float().repeat_interleave(RHV // RHK, dim=2) for x in (q, k))
    q, k = (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    q, v, g, beta, S = q * RD ** -0.5, v.float(), g.float(), beta.float(), cache
    out = torch.zeros(RB, RT, RHV, RD)
    for t in range(RT):
        S = S * g[:, t].exp()[..., None, None]
        delta = (v[:, t] - (S * k[:, t][..., None]).sum(-2)) * beta[:, t][..., None]
        S = S + k[:, t][..., None] * delta[..., None, :]
        out[:, t] = (S * q[:, t][..., None]).sum(-2)
    cache.copy_(S)
    return out.to(torch.bfloat16)


def _recurrent_bytes(out, args):
    return _bytes(out) + _bytes(args[5])


@functools.cache
def _recurrent_reference():
    args = _recurrent_inputs()
    eager_args = [a.clone() for a in args]
    with torch.no_grad():
        eager = _recurrent_bytes(recurrent_canonical(*eager_args), eager_args)
    comp_args = [a.clone() for a in args]
    out, c = _compiled(recurrent_canonical, comp_args)
    assert c.matches["gdn_recurrent_step"] == 1, f"the canonical gdn_recurrent_step form itself: {c.matches}"
    return eager, _recurrent_bytes(out, comp_args)


SQUARE_SUMS = {"mul": lambda x: (x * x).sum(-1, keepdim=True), "pow": lambda x: x.pow(2).sum(-1, keepdim=True),
               "square": lambda x: torch.square(x).sum(dim=-1, keepdim=True)}
OUTERS = {"broadcast": lambda a, b: a[..., None] * b[..., None, :], "unsqueeze": lambda a, b: a.unsqueeze(-1) * b.unsqueeze(-2),
          "einsum": lambda a, b: torch.einsum("bhk,bhv->bhkv", a, b)}


@SETTINGS
@given(head_major=st.booleans(), exp_first=st.booleans(), square=st.sampled_from(sorted(SQUARE_SUMS)),
       outer=st.sampled_from(sorted(OUTERS)), stacked=st.booleans(), cast_late=st.booleans())
@example(head_major=True, exp_first=False, square="mul", outer="broadcast", stacked=False, cast_late=False)
@example(head_major=False, exp_first=True, square="pow", outer="einsum", stacked=True, cast_late=True)
def test_gdn_recurrent_step_spellings(head_major, exp_first, square, outer, stacked, cast_late):
    """Token-major or head-major, ``g.exp()`` before or after the token's select, the l2norm's
    square, the outer product, the outputs stacked or written into a buffer, the float32 upcast
    before or after the GQA repeat: bytes equal to the canonical form's (eager and compiled)."""
    sq, out_prod = SQUARE_SUMS[square], OUTERS[outer]

    def variant(q, k, v, g, beta, cache):
        rep = (lambda x: x.repeat_interleave(RHV // RHK, dim=2).float()) if cast_late else \
            (lambda x: x.float().repeat_interleave(RHV // RHK, dim=2))
        q, k = (rep(x) for x in (q, k))
        q, k = (x * torch.rsqrt(sq(x) + 1e-6) for x in (q, k))
        q, v, g, beta = q * RD ** -0.5, v.float(), g.float(), beta.float()
        if head_major:
            q, k, v, g, beta = (x.transpose(1, 2).contiguous() for x in (q, k, v, g, beta))
        at = (lambda x, t: x[:, :, t]) if head_major else (lambda x, t: x[:, t])
        decay = g.exp() if exp_first else None
        S, outs = cache, []
        buf = torch.zeros(RB, RHV, RT, RD) if head_major else torch.zeros(RB, RT, RHV, RD)
        for t in range(RT):
            S = S * (at(decay, t) if exp_first else at(g, t).exp())[..., None, None]
            delta = (at(v, t) - (S * at(k, t)[..., None]).sum(-2)) * at(beta, t)[..., None]
            S = S + out_prod(at(k, t), delta)
            if stacked:
                outs.append((S * at(q, t)[..., None]).sum(-2))
            elif head_major:
                buf[:, :, t] = (S * at(q, t)[..., None]).sum(-2)
            else:
                buf[:, t] = (S * at(q, t)[..., None]).sum(-2)
        cache.copy_(S)
        out = torch.stack(outs, 1) if stacked else (buf.transpose(1, 2) if head_major else buf)
        return out.to(torch.bfloat16)

    want_eager, want_compiled = _recurrent_reference()
    args = _recurrent_inputs()
    eager_args = [a.clone() for a in args]
    with torch.no_grad():
        eager = _recurrent_bytes(variant(*eager_args), eager_args)
    assert_close_to_eager(eager, want_eager, exact=True)  # the spelling is equivalent
    comp_args = [a.clone() for a in args]
    out, c = _compiled(variant, comp_args)
    expected = {name: int(name == "gdn_recurrent_step") for name in REWRITE_NAMES}
    assert c.matches == expected, [m.check for r in c.records for m in r.misses.get("gdn_recurrent_step", [])]
    got = _recurrent_bytes(out, comp_args)
    assert_close_to_eager(got, want_compiled, exact=True)
    assert_close_to_eager(got, eager, exact=True)
