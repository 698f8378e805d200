"""Compile our Triton kernels ahead of time for an H100/H200 (sm_90), no GPU needed.

Run by tests/test_kernels_compile_for_sm90.py in a subprocess without TRITON_INTERPRET (under
the interpreter ``triton.jit`` returns interpreted functions). Catches what the interpreter
does not: type errors, unsupported ops, constexpr misuse in code CI never runs on a GPU.
Exit 0: all compiled; 3: this Triton cannot compile for CUDA here (no backend or ptxas).
"""

from __future__ import annotations

import sys

import triton

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
    import importlib
    import pkgutil

    import kda_inductor.lowerings as lowerings

    done, total, per = 0, 0, []
    for info in sorted(pkgutil.iter_modules(lowerings.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"kda_inductor.lowerings.{info.name}")
        declared = getattr(module, "aot_variants", None)
        if declared is None:
            if any(isinstance(v, triton.runtime.JITFunction) for v in vars(module).values()):
                print(f"FAIL: kda_inductor.lowerings.{info.name} has Triton kernels but declares no aot_variants()")
                sys.exit(1)
            continue
        n = 0
        for v in declared():
            total += 1
            n += bool(compile_variants(v.kernel, v.types, v.constexprs, v.options))
        done += n
        per.append(f"{info.name} {n}")
    print(f"compiled {done} of {total} kernel variants for sm_90 ({', '.join(per)})")
    sys.exit(0 if done == total and total else 1)


if __name__ == "__main__":
    main()
