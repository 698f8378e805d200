"""``benchmarks/tune_causal_conv1d.py`` (the launch-config sweep run on the GPU:
``.ci/gpu tune-causal_conv1d``) on CPU under the interpreter, tiny: every candidate's launch
bit-exact with the table's, and the tables it prints are valid Python of the tables' form,
each measured class naming its measurement."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parent.parent


def test_tune_smoke_prints_tables_to_paste():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tune_causal_conv1d.py"), "--smoke"],
                          capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    timed = [line for line in proc.stdout.splitlines() if line.startswith(("prefill C=", "decode C="))]
    assert timed and all(line.endswith("exact yes") for line in timed), timed
    paste = proc.stdout.split("paste into kda_inductor/lowerings/_conv_configs.py ----\n")[1].rsplit("\n(", 1)[0]
    from kda_inductor.lowerings import causal_conv1d as L

    tables = {}
    exec(paste, {"LaunchConfig": L.LaunchConfig, "UpdateConfig": L.UpdateConfig}, tables)
    assert [row[:2] for row in tables["PREFILL_CONFIGS"]] == [row[:2] for row in L.PREFILL_CONFIGS]
    assert [row[0] for row in tables["UPDATE_CONFIGS"]] == [row[0] for row in L.UPDATE_CONFIGS]
    for row in tables["PREFILL_CONFIGS"]:
        assert isinstance(row[2], L.LaunchConfig)
    notes = [row[-1] for row in tables["PREFILL_CONFIGS"] + tables["UPDATE_CONFIGS"]]
    measured = [n for n in notes if "not measured" not in n]
    # the smoke's widths (40, 136) fall in the narrowest class: T >= 1 and T >= 64, and decode
    assert len(measured) == 3 and all("CPU smoke: NOT a measurement" in n for n in measured), measured
    assert all("tune_causal_conv1d.md" in n for n in notes if n not in measured)


def test_tune_registers_without_a_gpu():
    """``--registers``: each candidate (smoke: the tables' configs and the taps tiles) compiled for sm_90 here (no
    GPU), its registers and spills read from the cubin; the taps tiles under 128, no spills."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tune_causal_conv1d.py"), "--registers", "--smoke",
                           "--widths", "8192"], capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    if proc.returncode != 0 and ("GPUTarget" in proc.stderr or "cuobjdump" in proc.stderr):
        pytest.skip("this Triton cannot compile for CUDA here")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if " registers, " in line]
    assert len(lines) >= 8 and all(" 0 bytes local" in line for line in lines), lines
    for line in lines:
        if "LaunchConfig" in line and "False)" in line:
            assert int(line.split(": ")[1].split(" ")[0]) < 128, line
