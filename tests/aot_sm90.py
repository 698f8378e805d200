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


def main() -> None:
    from kda_inductor.lowerings import gated_norm_merge as gnm
    from kda_inductor.lowerings import gdn_spec_split as gss
    from kda_inductor.lowerings import indexer_k_write as ikw

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
    # indexer_k_write: head_dim 128 / 512, with and without the norm, plain / ue8m0 scales
    types = dict(kv_ptr="*u8", k_ptr="*bf16", slot_ptr="*i64", w_ptr="*fp32", b_ptr="*fp32", num_tokens="i32",
                 num_slots="i32", k_stride_t="i32", k_stride_d="i32", kv_block_stride="i32", eps="fp32")
    for (hd, g), norm, ue, hw in itertools.product(((128, 1), (512, 4)), (False, True), (False, True), (False, True)):
        consts = dict(BLOCK_SIZE=64, HEAD_DIM=hd, GROUPS=g, GROUPS_P2=g, BLOCK_T=4, NORM=norm, UE8M0=ue, K_BF16=True,
                      HW_CASTS=hw, ROUND_NORM=not (norm and hw and ue))
        done += bool(compile_variants(ikw._write_kernel, types, consts, {"num_warps": 4}))
    print(f"compiled {done} kernel variants for sm_90")


if __name__ == "__main__":
    main()
