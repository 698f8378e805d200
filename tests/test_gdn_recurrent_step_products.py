"""``gdn_recurrent_step``: each of the step's four products in each of its spellings.

The state read ``S k`` and the output ``S q`` (einsum either operand first, ``@`` with unsqueeze
either side, ``bmm`` on flattened heads either operand first, a broadcast product summed), the
outer update ``k delta^T`` (einsum, ``@``, ``bmm``, broadcast), the decay (broadcast, einsum, on
flattened heads, the gate first; per head and per key channel). One compile per product holds one
recurrence per spelling (each its own l2norm), so the match count is the number of spellings; every
output and state is compared with eager on fresh random inputs. The near misses say what the
product reads only where that is established (the state before its decay, k of another token),
and that it was not recognised where it was not; the einsum step a new user wrote (head-major
inputs, q / k normalized outside the loop) is matched, never told a false reason."""

from __future__ import annotations

import linecache

import pytest
import torch

from kda_inductor.testing import assert_close_to_eager, compile_for_test, fresh_compile

B, H, T, D = 2, 4, 2, 16
NAME = "gdn_recurrent_step"
FORCED = {"kda": {"force": True, "strict": True}}

READS = ["einsum", "einsum_vec_first", "matmul", "matmul_t", "bmm", "bmm_t", "broadcast"]
OUTERS = ["einsum", "matmul", "bmm", "broadcast"]
DECAYS = ["broadcast", "einsum", "flat", "gate_first"]


def read(S, x, how):
    """``sum_k S[..., k, v] x[..., k]`` spelled ``how``."""
    K, V = S.shape[-2:]
    if how == "einsum":
        return torch.einsum("bhkv,bhk->bhv", S, x)
    if how == "einsum_vec_first":
        return torch.einsum("bhk,bhkv->bhv", x, S)
    if how == "matmul":
        return (x.unsqueeze(-2) @ S).squeeze(-2)
    if how == "matmul_t":
        return (S.transpose(-1, -2) @ x.unsqueeze(-1)).squeeze(-1)
    if how == "bmm":
        return torch.bmm(x.reshape(-1, 1, K), S.reshape(-1, K, V)).view(*x.shape[:-1], V)
    if how == "bmm_t":
        return torch.bmm(S.transpose(-1, -2).reshape(-1, V, K), x.reshape(-1, K, 1)).view(*x.shape[:-1], V)
    assert how == "broadcast"
    return (S * x[..., None]).sum(-2)


def outer(k, d, how):
    """``k (x) d`` spelled ``how``."""
    if how == "einsum":
        return torch.einsum("bhk,bhv->bhkv", k, d)
    if how == "matmul":
        return k.unsqueeze(-1) @ d.unsqueeze(-2)
    if how == "bmm":
        return torch.bmm(k.reshape(-1, k.shape[-1], 1), d.reshape(-1, 1, d.shape[-1])).view(*k.shape, d.shape[-1])
    assert how == "broadcast"
    return k[..., None] * d[..., None, :]


def decay(S, g, how):
    """``S * exp(g)``, ``g [B, H]`` (GDN) or ``[B, H, K]`` (KDA), spelled ``how``."""
    e, kda = g.exp(), g.dim() == 3
    if how == "broadcast":
        return S * (e[..., None] if kda else e[..., None, None])
    if how == "einsum":
        return torch.einsum("bhkv,bhk->bhkv" if kda else "bhkv,bh->bhkv", S, e)
    if how == "flat":
        return (S.reshape(-1, *S.shape[-2:]) * e.reshape(-1, S.shape[-2] if kda else 1, 1)).view(S.shape)
    assert how == "gate_first"
    return (e.unsqueeze(-1) if kda else e.unsqueeze(-1).unsqueeze(-1)) * S


def l2(x):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def recurrence(q, k, v, g, beta, s, r="broadcast", u="broadcast", o_="broadcast", dk="broadcast"):
    """The gated delta rule on head-major ``[B, H, T, D]`` inputs, q / k normalized outside the loop,
    each product spelled as named; the outputs written into a zeros buffer."""
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    q, k = l2(q) * D ** -0.5, l2(k)
    o = torch.zeros_like(v)
    for i in range(q.shape[2]):
        s = decay(s, g[:, :, i], dk)
        d = (v[:, :, i] - read(s, k[:, :, i], r)) * beta[:, :, i, None]
        s = s + outer(k[:, :, i], d, u)
        o[:, :, i] = read(s, q[:, :, i], o_)
    return o, s


def inputs(seed, *, kda=False):
    """Fresh head-major q, k, v, g (log-space, per key channel for KDA), beta, a random state."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=gen) for _ in range(3))
    g = -torch.rand(B, H, T, *((D,) if kda else ()), generator=gen)
    return [q, k, v, g, torch.rand(B, H, T, generator=gen), torch.randn(B, H, D, D, generator=gen) * 0.5]


def _compile(fn, args):
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(fn, options=FORCED)
        out = c(*args)
    with torch.inference_mode():
        want = fn(*args)
    return c, out, want


def _misses(c) -> dict[str, str]:
    return {m.check: m.location for r in c.records for m in r.misses.get(NAME, [])}


@pytest.mark.parametrize("product, spellings, kda", [
    ("r", READS, False), ("o_", READS, False), ("u", OUTERS, False), ("dk", DECAYS, False), ("dk", DECAYS, True)])
def test_every_spelling_of_each_product_matches(product, spellings, kda):
    """One recurrence per spelling of ``product`` (the others broadcast), one op each, equal to
    eager within float32 rounding (a bmm sums in another order)."""

    def fn(*args):
        return [recurrence(*args, **{product: how}) for how in spellings]

    c, out, want = _compile(fn, inputs(len(spellings) + kda, kda=kda))
    assert c.matches[NAME] == len(spellings), (c.matches, _misses(c))
    assert_close_to_eager(out, want)


def new_user_einsum_step(q, k, v, g, beta, s):
    """The step as a new user wrote it: einsums on head-major inputs, the state first."""
    q, k = l2(q) * D ** -0.5, l2(k)
    o = torch.zeros_like(v)
    for i in range(q.shape[2]):
        s = s * g[:, :, i].exp()[..., None, None]
        kv = torch.einsum("bhkv,bhk->bhv", s, k[:, :, i])
        d = (v[:, :, i] - kv) * beta[:, :, i, None]
        s = s + torch.einsum("bhk,bhv->bhkv", k[:, :, i], d)
        o[:, :, i] = torch.einsum("bhkv,bhk->bhv", s, q[:, :, i])
    return o, s


def test_the_new_users_einsum_step_is_rewritten():
    c, out, want = _compile(new_user_einsum_step, inputs(7))
    assert c.matches[NAME] == 1 and not _misses(c), (c.matches, _misses(c))
    assert_close_to_eager(out, want)


# --------------------------------------------------------------------------- near misses


def read_before_decay(q, k, v, g, beta, s):
    q, k = l2(q) * D ** -0.5, l2(k)
    kt = k[:, :, 0]
    kv = torch.einsum("bhkv,bhk->bhv", s, kt)  # the state before its decay
    s = s * g[:, :, 0].exp()[..., None, None]
    s = s + torch.einsum("bhk,bhv->bhkv", kt, (v[:, :, 0] - kv) * beta[:, :, 0, None])
    return torch.einsum("bhkv,bhk->bhv", s, q[:, :, 0]), s


def k_of_another_token(q, k, v, g, beta, s):
    q, k = l2(q) * D ** -0.5, l2(k)
    s = s * g[:, :, 0].exp()[..., None, None]
    kv = torch.einsum("bhkv,bhk->bhv", s, k[:, :, 1])  # k of the next token
    s = s + torch.einsum("bhk,bhv->bhkv", k[:, :, 0], (v[:, :, 0] - kv) * beta[:, :, 0, None])
    return torch.einsum("bhkv,bhk->bhv", s, q[:, :, 0]), s


def read_not_recognised(q, k, v, g, beta, s):
    q, k = l2(q) * D ** -0.5, l2(k)
    kt = k[:, :, 0]
    s = s * g[:, :, 0].exp()[..., None, None]
    kv = (s * kt[..., None]).cumsum(-2)[..., -1, :]  # a sum, spelled as the last of a cumsum
    s = s + kt[..., None] * ((v[:, :, 0] - kv) * beta[:, :, 0, None])[..., None, :]
    return (s * q[:, :, 0, :, None]).sum(-2), s


def output_before_update(q, k, v, g, beta, s):
    q, k = l2(q) * D ** -0.5, l2(k)
    kt = k[:, :, 0]
    s = s * g[:, :, 0].exp()[..., None, None]
    o = torch.einsum("bhkv,bhk->bhv", s, q[:, :, 0])  # the output of the state before the update
    d = (v[:, :, 0] - torch.einsum("bhkv,bhk->bhv", s, kt)) * beta[:, :, 0, None]
    s = s + torch.einsum("bhk,bhv->bhkv", kt, d)
    return o, s


def outer_of_v(q, k, v, g, beta, s):
    q, k = l2(q) * D ** -0.5, l2(k)
    s = s * g[:, :, 0].exp()[..., None, None]
    s = s + torch.einsum("bhk,bhv->bhkv", k[:, :, 0], v[:, :, 0])  # k v^T: no delta rule
    return torch.einsum("bhkv,bhk->bhv", s, q[:, :, 0]), s


@pytest.mark.parametrize("fn, words, line", [
    (read_before_decay, "reads the state before its decay", "# the state before its decay"),
    (k_of_another_token, "reads k of token 1, the update adds k of token 0", "# k of the next token"),
    (read_not_recognised, "the state read (S k in v - S k) is of a form not recognised here", "cumsum"),
    (output_before_update, "no output sum_k(S q) of the updated state was recognised", "s = s + torch.einsum"),
    (outer_of_v, "a gated linear-attention update (S * exp(g) + k v^T): no delta rule", "# k v^T: no delta rule"),
])
def test_near_misses_say_what_is_established(fn, words, line):
    """A true near miss names what the product is (the state read of the state before its decay, or
    of k of another token; an update of k v^T); a form not read here, or an output not found, says
    so (never "not k of the decayed state"); nothing rewritten, the results eager's."""
    c, out, want = _compile(fn, inputs(8))
    assert c.matches[NAME] == 0
    hits = [loc for why, loc in _misses(c).items() if words in why]
    assert hits and not any("is not k of the decayed state" in why for why in _misses(c)), _misses(c)
    path, at = hits[0].rsplit(":", 1)
    assert path == __file__ and line in linecache.getline(path, int(at)), (hits, line)
    assert_close_to_eager(out, want)
