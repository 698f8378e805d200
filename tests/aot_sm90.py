"""Compile our Triton kernels ahead of time for an H100/H200 (sm_90), no GPU needed.

Run by tests/test_kernels_compile_for_sm90.py in a subprocess without TRITON_INTERPRET (under
the interpreter ``triton.jit`` returns interpreted functions). Catches what the interpreter
does not: type errors, unsupported ops, constexpr misuse in code CI never runs on a GPU.
Exit 0: all compiled; 3: this Triton cannot compile for CUDA here (no backend or ptxas).

``python tests/aot_sm90.py --ptx DIR`` also writes each variant's PTX instructions to
``DIR/<module>.<n>.ptx`` (debug lines, label names and assert line numbers dropped): the same
files from two checkouts (``diff -r``) show whether a refactoring changed any kernel's code;
``python tests/aot_sm90.py --compare DIR_A DIR_B`` prints, per module, how many are identical.
``python tests/aot_sm90.py --registers [MODULE]`` also prints each variant's registers a thread and
stack bytes (spills; Triton's ``cuobjdump -res-usage``), only ``MODULE``'s when named (e.g.
``_gdn_chunk_kda_kernels``). ``--as-launched`` compiles each variant as the launcher specializes
it from the values of its ``launch`` (Triton's rule: an int equal to 1 is a constant, one divisible
by 16 is known to be; pointers 16-byte aligned): registers and spills of that launch. Without it, strides stay runtime ``i32``, so
the PTX of two checkouts compares as it always has.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import triton

try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError:  # pragma: no cover
    sys.exit(3)


def compile_variants(fn, types: dict, consts: dict, options: dict, ptx: Path | None = None,
                     registers: bool = False, launch: dict | None = None) -> int:
    """Compile one variant; ``launch`` (the as-launched compile): its integers' values at a launch."""
    names = fn.arg_names
    sig, consts, aligned = specialize(names, types, consts, launch)
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=aligned)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    if ptx is not None:
        ptx.write_text(instructions(k.asm["ptx"]))
    if registers:
        print(f"  {fn.__name__} {options} {consts}: {usage(k.asm['cubin'])}", flush=True)
    return len(k.asm["cubin"])


def specialize(names, types: dict, consts: dict, launch: dict | None) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attributes) of a variant; with ``launch`` (its integers' values at a
    launch) as Triton's launcher specializes it: an int equal to 1 becomes a constant, one divisible
    by 16 (not 0) and every pointer carry ``tt.divisibility`` 16 (our tensors are allocator-aligned)."""
    values = {} if launch is None else launch
    consts = {**consts, **{n: 1 for n, v in values.items() if v == 1}}
    sig = {n: "constexpr" if n in consts else types.get(n, "constexpr") for n in names}
    aligned = {(names.index(n),): [["tt.divisibility", 16]] for n in names if launch is not None and (
        sig[n].startswith("*") or (values.get(n) and values[n] % 16 == 0))}
    return sig, consts, aligned


def usage(cubin: bytes) -> str:
    """``"<registers> registers, <bytes> stack bytes"`` of a cubin (Triton's own ``cuobjdump``)."""
    import os
    import subprocess
    import tempfile

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    reg, stack = (re.search(rf"{key}:(\d+)", out) for key in ("REG", "STACK"))
    return f"{reg and reg.group(1)} registers, {stack and stack.group(1)} stack bytes"


def instructions(ptx: str) -> str:
    """The PTX without what moves when source lines move: debug sections and ``.loc`` lines,
    label names (inlined helpers add labels), the assert's line number and file name."""
    ptx = re.sub(r"\.section\s+\.debug_\w+\s*\{.*?\n\t\}", "", ptx, flags=re.S)
    ptx = re.sub(r"\$L__\w+", "L", ptx)
    ptx = re.sub(r"(st\.param\.b32\s+\[param2\],) \d+;", r"\1 LINE;", ptx)
    keep = [line for line in ptx.splitlines()
            if line.strip() != "L:" and not line.lstrip().startswith((".loc", ".file", "//"))
            and not re.match(r"\.global .* (assertFile|assertFunc)_", line)]
    return "\n".join(keep) + "\n"


def compare(a: Path, b: Path) -> None:
    """Per lowering module: the variants in each directory and how many of the first's have a
    byte-identical twin among the second's (by content: a variant added or removed between two
    checkouts shifts the numbering of the others)."""
    def by_module(d: Path) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for p in sorted(d.glob("*.ptx")):
            out.setdefault(p.name.split(".")[0], []).append(p.read_text())
        return out

    ma, mb = by_module(a), by_module(b)
    for module in sorted(ma.keys() | mb.keys()):
        va, vb = ma.get(module, []), set(mb.get(module, []))
        same = sum(text in vb for text in va)
        print(f"{module}: {len(va)} / {len(mb.get(module, []))} variants, {same} of the first's {len(va)} identical "
              "in the second")


def main() -> None:
    if "--compare" in sys.argv:
        i = sys.argv.index("--compare")
        return compare(Path(sys.argv[i + 1]), Path(sys.argv[i + 2]))
    import importlib
    import pkgutil

    import kda_inductor.lowerings as lowerings

    out = Path(sys.argv[sys.argv.index("--ptx") + 1]) if "--ptx" in sys.argv else None
    regs = "--registers" in sys.argv
    launched = "--as-launched" in sys.argv
    only = sys.argv[sys.argv.index("--registers") + 1:][:1] if regs else []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    done, total, per = 0, 0, []
    for info in sorted(pkgutil.iter_modules(lowerings.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"kda_inductor.lowerings.{info.name}")
        declared = getattr(module, "aot_variants", None)
        if declared is None:
            if any(isinstance(v, triton.runtime.JITFunction) for v in vars(module).values()):
                print(f"FAIL: kda_inductor.lowerings.{info.name} has Triton kernels but declares no aot_variants()")
                sys.exit(1)
            continue
        if only and info.name != only[0]:
            continue
        n = 0
        for j, v in enumerate(declared()):
            total += 1
            ptx = None if out is None else out / f"{info.name}.{j}.ptx"
            launch = (v.launch or {}) if launched else None
            n += bool(compile_variants(v.kernel, v.types, v.constexprs, v.options, ptx, regs, launch))
        done += n
        per.append(f"{info.name} {n}")
    print(f"compiled {done} of {total} kernel variants for sm_90 ({', '.join(per)})")
    sys.exit(0 if done == total and total else 1)


if __name__ == "__main__":
    main()
