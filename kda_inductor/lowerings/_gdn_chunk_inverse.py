"""The inverse ``(I + A)^-1`` of a chunk's strictly lower ``A`` (64 x 64, by 16 x 16 blocks), shared
by ``kda::gdn_chunk``'s kernels (:mod:`~kda_inductor.lowerings._gdn_chunk_kernels`: ``wu_kernel``,
``wu2_kernel``; :mod:`~kda_inductor.lowerings._gdn_chunk_kernels3`: ``solve3_kernel``).

The diagonal blocks by :func:`inverse16` (``INV``: ``"subst"``, forward substitution row by row, two
reductions across the block's rows a row; ``"ieee"`` / ``"tf32"``, the product of factors
``(I - A)(I + A^2)(I + A^4)(I + A^8)``: six 16 x 16 products, no reductions, but ``A``'s powers
grow and cancel; ``"doubling"`` / ``"doubling_tf32"``: :func:`doubling16`, six products, no
reductions, no growth), those below by ``Tinv_ij = -Tinv_ii sum_{j <= m < i} A_im Tinv_mj``
(float32 products; tf32 with ``"tf32"`` / ``"doubling_tf32"``).
JIT helpers only: they compile inside the kernels that call them (no launch of their own).
"""

from __future__ import annotations

from kda_inductor.lowerings._triton import tl, triton

if triton is not None:

    @triton.jit
    def unit_lower_inverse(A, BC: tl.constexpr):
        """``(I + A)^-1`` of a strictly lower ``[BC, BC]`` ``A``, row by row: ``X_i = e_i - sum_j A_ij X_j``."""
        r = tl.arange(0, BC)
        X = tl.zeros((BC, BC), tl.float32)
        for i in tl.static_range(BC):
            a = tl.sum(tl.where(r[:, None] == i, A, 0.0), 0)
            xi = tl.where(r == i, 1.0, 0.0) - tl.sum(a[:, None] * X, 0)
            X = tl.where(r[:, None] == i, xi[None, :], X)
        return X

    @triton.jit
    def mm(a, b, INV: tl.constexpr):
        """A 16 x 16 product of the inverse: float32 (``ieee``; ``"subst"``, ``"doubling"`` too), or tf32
        tensor cores (``INV`` ``"tf32"`` or ``"doubling_tf32"``)."""
        if INV == "tf32" or INV == "doubling_tf32":
            return tl.dot(a, b, input_precision="tf32")
        else:
            return tl.dot(a, b, input_precision="ieee")

    @triton.jit
    def doubling16(A, INV: tl.constexpr):
        """``(I + A)^-1`` of a strictly lower 16 x 16 ``A`` by doubling the blocks it inverts: ``X = I -
        D`` inverts ``I + D``, ``D`` = ``A``'s 2 x 2 diagonal blocks; with ``X`` the inverse on ``s x s``
        diagonal blocks and ``E`` = ``A``'s lower-left ``s x s`` block inside each ``2s x 2s`` one,
        ``(I + D + E)^-1 = X - X E X`` exactly (``E X E = 0``): ``s`` = 2, 4, 8, two products each.
        Every product's factors are inverse entries and ``A``'s: nothing grows, nothing cancels."""
        r = tl.arange(0, 16)
        X = tl.where(r[:, None] == r[None, :], 1.0, 0.0) - tl.where(r[:, None] // 2 == r[None, :] // 2, A, 0.0)
        for s in tl.static_range(1, 4):
            lo = (r[:, None] >> (s + 1) == r[None, :] >> (s + 1)) & (r[:, None] >> s != r[None, :] >> s)
            X = X - mm(X, mm(tl.where(lo, A, 0.0), X, INV), INV)
        return X

    @triton.jit
    def inverse16(A, INV: tl.constexpr):
        """``(I + A)^-1`` of a strictly lower 16 x 16 ``A``: ``INV == "subst"``: forward substitution
        row by row; ``"doubling"`` / ``"doubling_tf32"``: :func:`doubling16`; else ``(I - A)(I + A^2)(I +
        A^4)(I + A^8)`` (``A^16 = 0``; the factors commute, all being polynomials in ``A``): six products,
        no reductions across threads (``A^8``'s entries reach ~1e3 on correlated keys where the inverse's
        stay <= 1: they cancel)."""
        if INV == "subst":
            return unit_lower_inverse(A, 16)
        elif INV == "doubling" or INV == "doubling_tf32":
            return doubling16(A, INV)
        else:
            r = tl.arange(0, 16)
            A2 = mm(A, A, INV)
            A4 = mm(A2, A2, INV)
            X = tl.where(r[:, None] == r[None, :], 1.0, 0.0) - A
            X = X + mm(X, A2, INV)
            X = X + mm(X, A4, INV)
            return X + mm(X, mm(A4, A4, INV), INV)

    @triton.jit
    def inverse(A00, A10, A11, A20, A21, A22, A30, A31, A32, A33, INV: tl.constexpr):
        """The chunk's ``(I + A)^-1`` from its ten 16 x 16 blocks on and below the diagonal: the
        diagonal ones by :func:`inverse16`, those below by ``Tinv_ij = -Tinv_ii sum_{j <= m < i} A_im
        Tinv_mj`` (:func:`mm` products). Returns the ten blocks of ``Tinv`` in the same order."""
        T00, T11, T22, T33 = inverse16(A00, INV), inverse16(A11, INV), inverse16(A22, INV), inverse16(A33, INV)
        T10 = -mm(T11, mm(A10, T00, INV), INV)
        T21 = -mm(T22, mm(A21, T11, INV), INV)
        T20 = -mm(T22, mm(A20, T00, INV) + mm(A21, T10, INV), INV)
        T32 = -mm(T33, mm(A32, T22, INV), INV)
        T31 = -mm(T33, mm(A31, T11, INV) + mm(A32, T21, INV), INV)
        T30 = -mm(T33, mm(A30, T00, INV) + mm(A31, T10, INV) + mm(A32, T20, INV), INV)
        return T00, T10, T11, T20, T21, T22, T30, T31, T32, T33


def aot_variants():
    """None of its own: the helpers compile inside the kernels' variants (``_gdn_chunk_kernels``,
    ``_gdn_chunk_kernels3``)."""
    return iter(())
