"""Compile our Triton kernels ahead of time for an H100/H200 (sm_90), no GPU needed.

Run by tests/test_kernels_compile_for_sm90.py in a subprocess without TRITON_INTERPRET (under
the interpreter ``triton.jit`` returns interpreted functions). Catches what the interpreter
does not: type errors, unsupported ops, constexpr misuse in code CI never runs on a GPU.
Exit 0: all compiled; 3: this Triton cannot compile for CUDA here (no backend or ptxas).
"""

from __future__ import annotations

import itertools
import sys

import triton
import triton.language as tl

try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError:  # pragma: no cover
    sys.exit(3)


def compile_variants(fn, types: dict, consts: dict, options: dict) -> int:
    names = fn.arg_names
    sig = {n: types.get(n, "constexpr") for n in names}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    return len(k.asm["cubin"])


def indexer_variants(debug: dict) -> list[tuple]:
    """``(kernel, arg types, constexprs, options)`` of every indexer kernel variant checked here.

    indexer_k_write: head_dim 128 / 512, with and without the norm, plain / ue8m0 scales, both
    cast paths (asserts on, negative slots skipped: the op's defaults), plus wrap_negative and
    the no-assert variant. indexer_k_gather: both grids with and without asserts (head_dim 128,
    block 64), and the by-block grid for head_dim 512.
    """
    from kda_inductor.lowerings import indexer_k_gather as ikg
    from kda_inductor.lowerings import indexer_k_write as ikw

    out = []
    types = dict(kv_ptr="*u8", k_ptr="*bf16", slot_ptr="*i64", w_ptr="*fp32", b_ptr="*fp32", num_tokens="i32",
                 num_slots="i32", k_stride_t="i32", k_stride_d="i32", kv_block_stride="i32", eps="fp32")
    base = dict(BLOCK_SIZE=64, GROUPS_P2=1, BLOCK_T=4, K_BF16=True, WRAP_NEGATIVE=False, CHECK=True)
    for (hd, g), norm, ue, hw in itertools.product(((128, 1), (512, 4)), (False, True), (False, True), (False, True)):
        consts = dict(base, HEAD_DIM=hd, GROUPS=g, GROUPS_P2=g, NORM=norm, UE8M0=ue, HW_CASTS=hw,
                      ROUND_NORM=not (norm and hw and ue))
        out.append((ikw._write_kernel, types, consts, debug))
    plain = dict(base, HEAD_DIM=128, GROUPS=1, NORM=True, UE8M0=True, HW_CASTS=True, ROUND_NORM=True)
    out.append((ikw._write_kernel, types, dict(plain, WRAP_NEGATIVE=True), debug))
    out.append((ikw._write_kernel, types, dict(plain, WRAP_NEGATIVE=True, CHECK=False), debug))
    out.append((ikw._write_kernel, types, dict(plain, CHECK=False), debug))
    common = dict(kv_ptr="*i32", bt_ptr="*i32", cu_ptr="*i32", dv_ptr="*i32", ds_ptr="*i32", num_tokens="i32",
                  num_reqs="i32", num_blocks="i32", bt_width="i32", kv_block_stride="i64", bt_stride_req="i32",
                  bt_stride_col="i32", dv_stride="i32", ds_stride="i32")
    by_token = dict(common, search_levels="i32", search_span="i32")
    for hd, check in ((128, True), (128, False), (512, True)):
        words = dict(BLOCK_SIZE=64, VALUE_WORDS=hd // 4, VALUE_WORDS_P2=hd // 4, SCALE_WORDS=hd // 128,
                     SCALE_WORDS_P2=hd // 128, BLOCK_T=16, CHECK=check)
        out.append((ikg._gather_by_block_kernel, common, dict(words, SUBTILES=4), debug))
        if hd == 128:
            out.append((ikg._gather_by_token_kernel, by_token, dict(words, FANOUT=16), debug))
    return out


def main() -> None:
    from kda_inductor.lowerings import gated_norm_merge as gnm
    from kda_inductor.lowerings import gdn_spec_split as gss

    debug = {"num_warps": 4, "debug": True, **({"sanitize_overflow": False} if gss.triton_launch_options() else {})}
    done = 0
    # gdn_spec_split: 6 sources (the layer) and 2
    types = {"idx0_ptr": "*i32", "idx1_ptr": "*i32", "n0": "i32", "n1": "i32"}
    for i in range(8):
        types.update({f"s{i}": "*bf16", f"d{i}": "*bf16", f"t{i}": "i32", f"w{i}": "i32", f"st{i}": "i32", f"k{i}": "i32"})
    for num in (2, 6):
        done += bool(compile_variants(gss._gdn_spec_split_kernel, types, {"NUM": num, "BLOCK_W": 1024}, debug))
    # gated_norm_merge: both forms, both gates, rsqrt or 1 / sqrt
    types = dict(src0="*bf16", src1="*bf16", idx0="*i64", idx1="*i64", n0="i32", n1="i32", src_stride0="i32",
                 src_stride1="i32", z_ptr="*bf16", z_stride_row="i32", z_stride_col="i32", w_ptr="*fp32",
                 y_ptr="*bf16", T="i32", R="i32", D="i32", eps="fp32")
    for hf, sigmoid, rsqrt in itertools.product((False, True), repeat=3):
        consts = dict(SIGMOID=sigmoid, HF=hf, RSQRT=rsqrt, IN_DTYPE=tl.bfloat16, HF_DTYPE=tl.float32,
                      BLOCK_R=8, BLOCK_D=128, IDENTITY=False)
        done += bool(compile_variants(gnm._gated_norm_merge_kernel, types, consts, debug))
    consts.update(IDENTITY=True)  # the merge-free norm
    done += bool(compile_variants(gnm._gated_norm_merge_kernel, types, consts, debug))
    for fn, types, consts, options in indexer_variants(debug):
        done += bool(compile_variants(fn, types, consts, options))
    print(f"compiled {done} kernel variants for sm_90")


if __name__ == "__main__":
    main()
