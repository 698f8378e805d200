"""``kda::gdn_chunk``'s launches compiled for sm_90 (H100 / H200) without a GPU: per launch config of
``bench_gdn_chunk.py --sweep``, each kernel it launches at Qwen3-Next's dims (16 q / k heads, 32 v
heads, K = V = 128, bf16 inputs, l2norm, no state) with the arguments, constexprs and options the
launcher passes, specialized as Triton specializes them at run time (an integer equal to 1 a
constant, one divisible by 16 marked so, pointers 16-byte aligned): registers a thread, stack
(spilled) bytes, shared memory and the PTX's CTA barriers (``bar.sync``: each a point where the
block's warps wait for each other). The launcher runs on CPU tensors with every launch recorded,
never run: what is compiled is what it would launch.

    python benchmarks/gdn_chunk_registers.py                              # FAST, its inverse variants, FAST3
    python benchmarks/gdn_chunk_registers.py --configs "FAST,FAST3 fused w8"   # any of the sweep's labels

Exit 3 where this Triton cannot compile for CUDA (no backend or ptxas), as ``tests/aot_sm90.py``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

os.environ.pop("TRITON_INTERPRET", None)  # compiled, never interpreted (before triton is imported)
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

DEFAULT_CONFIGS = ("FAST,FAST inv doubling,FAST inv doubling tf32,FAST inv ieee,FAST inv doubling wu w8,FAST3,"
                   "FAST3 inv doubling,FAST3 fused w8")
_PTR = {torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.float16: "*fp16", torch.int32: "*i32",
        torch.int64: "*i64"}


def record_launches(config, T: int = 256) -> list[tuple]:
    """``(kernel, positional args, keyword args)`` of each launch :func:`chunk_triton` makes with
    ``config`` at Qwen3-Next's dims (CPU tensors; every kernel's ``[grid]`` records instead of running,
    the interpreter's ``DOT = "bf16emu"`` recorded as the GPU's ``"bf16"``)."""
    from kda_inductor.lowerings import _gdn_chunk_kernels as kern
    from kda_inductor.lowerings import _gdn_chunk_kernels3 as kern3
    from kda_inductor.lowerings import _gdn_chunk_kernels4 as kern4
    from kda_inductor.lowerings import gdn_chunk as L

    calls: list[tuple] = []

    class _Record:
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):  # on CPU tensors the launcher picks "bf16emu": what CUDA runs is "bf16"
            return lambda *args, **kw: calls.append(
                (self.fn, args, dict(kw, DOT="bf16") if kw.get("DOT") == "bf16emu" else kw))

    patched = [(m, n, getattr(m, n)) for m in (kern, kern3, kern4) for n in dir(m) if n.endswith("_kernel")]
    for m, n, fn in patched:
        setattr(m, n, _Record(fn))
    try:
        q, k = (torch.randn(1, T, 16, 128, dtype=torch.bfloat16) for _ in range(2))
        v = torch.randn(1, T, 32, 128, dtype=torch.bfloat16)
        g, beta = -torch.rand(1, T, 32), torch.rand(1, T, 32, dtype=torch.bfloat16)
        L.chunk_triton(q, k, v, g, beta, None, None, True, config=config)
    finally:
        for m, n, fn in patched:
            setattr(m, n, fn)
    return calls


def specialize(fn, args, kw) -> tuple[dict, dict, dict, dict]:
    """``(signature, constexprs, attrs, options)`` for ``ASTSource`` / ``triton.compile``, as the run
    time would specialize this call."""
    names = fn.arg_names
    bound = dict(zip(names, args), **{n: v for n, v in kw.items() if n in names})
    options = {n: kw[n] for n in ("num_warps", "num_stages") if n in kw}
    sig, consts, attrs = {}, {}, {}
    for i, n in enumerate(names):
        x = bound.get(n)
        if isinstance(x, torch.Tensor):
            sig[n], attrs[(i,)] = _PTR[x.dtype], [["tt.divisibility", 16]]
        elif isinstance(x, bool) or isinstance(x, str) or n in kw or x is None or x == 1 and isinstance(x, int):
            sig[n], consts[(i,)] = "constexpr", x
        elif isinstance(x, float):
            sig[n] = "fp32"
        else:
            sig[n] = "i32" if -2**31 <= x < 2**31 else "i64"
            if x % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, consts, attrs, options


def usage(fn, args, kw) -> dict:
    """Registers, stack bytes, shared memory and CTA barriers of one recorded launch, for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, consts, attrs, options = specialize(fn, args, kw)
    compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options=options)
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        res = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True).stdout
    regs, stack = (int(re.search(rf"{k}:(\d+)", res).group(1)) for k in ("REG", "STACK"))
    return {"kernel": fn.fn.__name__, "warps": options.get("num_warps"), "stages": options.get("num_stages"),
            "regs": regs, "stack": stack, "smem": compiled.metadata.shared,
            "barriers": compiled.asm["ptx"].count("bar.sync")}


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help="the sweep's labels, comma-separated")
    args = p.parse_args(argv)
    try:
        import triton.backends.nvidia  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except ImportError:
        sys.exit(3)
    import bench_gdn_chunk as bench

    rows = []
    for label, cfg in bench.selected_configs(False, args.configs).items():
        for fn, a, kw in record_launches(cfg):
            rows.append({"config": label, **usage(fn, a, kw)})
            r = rows[-1]
            print(f"{label:24s} {r['kernel']:16s} {r['warps']} warps {r['stages']} stages: {r['regs']} registers, "
                  f"{r['stack']} B stack, {r['smem']} B shared, {r['barriers']} bar.sync", flush=True)
    return rows


if __name__ == "__main__":
    main()
