"""Every new Triton kernel compiles for sm_90 (H100/H200) ahead of time, on a machine
without a GPU: the interpreter runs kernels but never compiles them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


def test_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("aot_sm90.py")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=900,
                          cwd=script.parent.parent)
    if proc.returncode == 3:
        pytest.skip("this Triton cannot compile for CUDA here")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    # every lowering declares its launches (aot_variants()); all of them must compile
    assert re.search(r"compiled (\d+) of \1 kernel variants for sm_90", proc.stdout), proc.stdout


def test_ptx_compare_matches_variants_by_content(tmp_path):
    """``aot_sm90.py --compare``: a variant inserted between two checkouts shifts the numbering of
    the others; they still count as identical (their text has a twin), a changed one does not."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    for i, text in enumerate(["k0", "k1", "k2"]):
        (a / f"mod.{i}.ptx").write_text(text)
    for i, text in enumerate(["k0", "new", "k1", "k2 changed"]):
        (b / f"mod.{i}.ptx").write_text(text)
    (a / "other.0.ptx").write_text("x")
    script = Path(__file__).with_name("aot_sm90.py")
    proc = subprocess.run([sys.executable, str(script), "--compare", str(a), str(b)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "mod: 3 / 4 variants, 2 of the first's 3 identical in the second" in proc.stdout, proc.stdout
    assert "other: 1 / 0 variants, 0 of the first's 1 identical in the second" in proc.stdout, proc.stdout


def test_as_launched_specializes_as_triton_launcher_does():
    """``--as-launched``: a 1 becomes a constant, a multiple of 16 and every pointer aligned; 0 and
    other ints stay runtime; without a launch the signature is the declared one (PTX comparisons)."""
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from aot_sm90 import specialize
    finally:
        sys.path.pop(0)
    names = ["x_ptr", "n", "s0", "s1", "s2", "BLOCK"]
    types = {"x_ptr": "*bf16", "n": "i32", "s0": "i32", "s1": "i32", "s2": "i32"}
    sig, consts, attrs = specialize(names, types, {"BLOCK": 64}, {"n": 48, "s0": 1, "s1": 0, "s2": 7})
    assert sig == {"x_ptr": "*bf16", "n": "i32", "s0": "constexpr", "s1": "i32", "s2": "i32", "BLOCK": "constexpr"}
    assert consts == {"BLOCK": 64, "s0": 1}
    assert attrs == {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
    sig, consts, attrs = specialize(names, types, {"BLOCK": 64}, None)
    assert sig["s0"] == "i32" and consts == {"BLOCK": 64} and attrs == {}


def test_recorded_launch_takes_the_launchers_integers_without_running_the_kernel():
    """``recorded_launch``: the runtime ints our launcher passes (strides of the real tensors, not
    constexprs), the kernel not run (the output keeps its poison), the module's kernel put back."""
    import torch

    from kda_inductor.lowerings import _conv_kernels, recorded_launch
    from kda_inductor.lowerings._conv_launch import conv_triton

    kernel = _conv_kernels.prefill_kernel
    x = torch.randn(2, 40, 24).transpose(1, 2)  # [B, C, T] over token-major memory
    out = torch.full((2, 40, 24), float("nan")).transpose(1, 2)
    launch = recorded_launch(_conv_kernels, "prefill_kernel",
                             lambda: conv_triton(x, torch.randn(24, 4), out=out))
    assert _conv_kernels.prefill_kernel is kernel
    assert out.isnan().all()
    assert launch["T"] == 40 and launch["num_seqs"] == 2
    assert (launch["sx_b"], launch["sx_t"], launch["sx_c"]) == (960, 24, 1)
    assert launch["sw_c"] == 4 and launch["sw_k"] == 1
    assert not set(launch) & {"BLOCK_T", "C", "K", "HAS_STATE"}
