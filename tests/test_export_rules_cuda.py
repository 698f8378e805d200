"""``kda_inductor.exporting`` on CUDA (skipped without a GPU): ``torch.export`` of transformers'
Qwen3-Next GDN layer (bf16, K = V = 128, a prefill of 300 tokens: four chunks and a partial one)
traces its chunked core as ONE ``kda::gdn_chunk`` with the speed rules on (not forced: on CUDA the
GDN core's rule holds, ``docs/speed-rules.md``), whichever core the layer holds (fla-core's
``chunk_gated_delta_rule`` where installed, else transformers' torch reference); the AOTInductor
package of that export calls the op, its output within bf16 rounding of eager's."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kda_inductor

pytestmark = pytest.mark.cuda  # the kda_inductor pytest plugin skips these without a GPU
pytest.importorskip("transformers")
modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


def _layer():
    from transformers import Qwen3NextConfig

    from benchmarks import hf_models

    config = hf_models.config_for(hf_models.BY_NAME["qwen3_next"], Qwen3NextConfig, tiny=True)
    config.linear_key_head_dim = config.linear_value_head_dim = 128  # the released head dims
    torch.manual_seed(0)
    return modeling.Qwen3NextGatedDeltaNet(config, 0).to("cuda", torch.bfloat16).eval(), config


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def _package_in_child(tmp_path, disable: str, post_grad: bool = True) -> subprocess.CompletedProcess:
    """Export the layer, package it with AOTInductor, load the package and call it twice (fresh inputs), in a
    child process: on an H100 (torch 2.11, 2026-12-07) ``aoti_load_package`` of the package with our op died
    with SIGSEGV, which took the whole test worker with it. The child says how far it got, and which of
    our ops the package calls (``post_grad``: our post-grad pass in the package's compile, whose rewrites add
    ops of their own)."""
    code = textwrap.dedent(f"""
        import zipfile, torch, kda_inductor
        from kda_inductor import KdaOptions
        from kda_inductor.pass_manager import KdaPostGradPass
        from tests.test_export_rules_cuda import _layer, _rel
        from tests.test_export_rules_cuda import modeling
        layer, config = _layer()
        if {disable!r} and hasattr(layer, "chunk_gated_delta_rule"):  # the control: the torch reference, fla or not
            layer.chunk_gated_delta_rule = modeling.torch_chunk_gated_delta_rule
        x = torch.randn(1, 300, config.hidden_size, device="cuda", dtype=torch.bfloat16)
        opts = {{"disable": [{disable!r}]}} if {disable!r} else None
        with torch.no_grad():
            want = layer(x)
            with kda_inductor.exporting(layer, opts):  # the speed rules on
                ep = torch.export.export(layer, (x,))
            print("OPS", sum(1 for n in ep.graph.nodes if "kda.gdn_chunk" in str(n.target)), flush=True)
            pkg = torch._inductor.aoti_compile_and_package(
                ep, package_path={str(tmp_path / "gdn.pt2")!r},
                inductor_configs={{"post_grad_custom_post_pass": KdaPostGradPass(KdaOptions())}} if {post_grad!r} else {{}})
            with zipfile.ZipFile(pkg) as z:
                said = b"".join(z.read(n) for n in z.namelist() if n.endswith(".wrapper.json")).decode()
            import re
            print("PACKAGED", sorted(set(re.findall(r"kda::[a-z_0-9]+", said))), flush=True)
            run = torch._inductor.aoti_load_package(pkg)
            print("LOADED", flush=True)
            got = run(x)
            x2 = torch.randn_like(x)  # fresh input: the package is no replay of the traced one
            want2, got2 = layer(x2), run(x2)
        print("ERRORS", _rel(got, want), _rel(got2, want2), flush=True)
        with zipfile.ZipFile(pkg) as z:
            wrappers = [n for n in z.namelist() if n.endswith(".wrapper.json")]
            print("CALLS_OP", bool(wrappers) and all(b"kda::gdn_chunk" in z.read(n) for n in wrappers))
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                          cwd=str(Path(__file__).resolve().parents[1]))


def _said(r: subprocess.CompletedProcess) -> str:
    return f"rc {r.returncode}\n" + r.stdout[-3000:] + r.stderr[-3000:]


def _plain_package_in_child(tmp_path, import_ours: bool) -> subprocess.CompletedProcess:
    """A package of a plain ``Linear`` + ``relu`` (no transformers, no op of ours, no pass of ours) exported,
    packaged, loaded and called in a child process; ``import_ours``: ``kda_inductor`` imported first (its ops
    registered). On an H100 (torch 2.11, 2026-12-08) the layer's package crashed in ``aoti_load_package``
    even with none of our ops in it: these two say whether the loader crashes on that machine whatever the
    package holds, and whether importing kda_inductor is what makes it crash."""
    code = textwrap.dedent(f"""
        import torch
        if {import_ours!r}:
            import kda_inductor.backend  # registers torch.ops.kda.*
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()).cuda().eval()
        x = torch.randn(8, 64, device="cuda")
        with torch.no_grad():
            ep = torch.export.export(m, (x,))
            pkg = torch._inductor.aoti_compile_and_package(ep, package_path={str(tmp_path / "plain.pt2")!r})
            print("PACKAGED", flush=True)
            run = torch._inductor.aoti_load_package(pkg)
            print("LOADED", flush=True)
            x2 = torch.randn_like(x)
            print("ERRORS", (run(x2) - m(x2)).abs().max().item(), flush=True)
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          cwd=str(Path(__file__).resolve().parents[1]))


def _loader_verdict(r: subprocess.CompletedProcess, tmp_path) -> None:
    """After a layer package's child died of a signal: a plain package's child (without kda_inductor) that
    dies too means this machine's loader crashes whatever the package holds, so the layer test can say
    nothing about our ops: it is skipped saying so (the plain controls below fail, naming the machine)."""
    if r.returncode >= 0:
        return
    (tmp_path / "plain").mkdir(exist_ok=True)
    plain = _plain_package_in_child(tmp_path / "plain", import_ours=False)
    if plain.returncode != 0 and "PACKAGED" in plain.stdout and "LOADED" not in plain.stdout:
        pytest.skip(f"aoti_load_package crashes on this machine (torch {torch.__version__}, "
                    f"{torch.cuda.get_device_name()}) for a plain Linear package without kda_inductor too "
                    f"(rc {plain.returncode}): the layer's package (rc {r.returncode}) says nothing about our ops")


def test_aotinductor_package_of_a_gdn_prefill_calls_the_op_on_cuda(tmp_path):
    r = _package_in_child(tmp_path, "")
    _loader_verdict(r, tmp_path)
    assert r.returncode == 0 and "OPS 1" in r.stdout and "CALLS_OP True" in r.stdout, _said(r)
    errors = [float(e) for e in r.stdout.split("ERRORS")[1].split()[:2]]
    assert max(errors) < 2e-2, errors


def test_aotinductor_package_without_the_op_loads_on_cuda(tmp_path):
    """The control for the test above: the same layer exported with ``gdn_chunk`` disabled (Inductor's code
    for the torch reference), so a failure of the one above that this one does not share is our op's."""
    r = _package_in_child(tmp_path, "gdn_chunk")
    _loader_verdict(r, tmp_path)
    assert r.returncode == 0 and "OPS 0" in r.stdout and "CALLS_OP False" in r.stdout, _said(r)
    assert max(float(e) for e in r.stdout.split("ERRORS")[1].split()[:2]) < 2e-2, _said(r)


def test_aotinductor_package_of_the_op_without_our_post_grad_pass_on_cuda(tmp_path):
    """The second control: the export's op, the package compiled without our post-grad pass (so the only op
    of ours in it is ``kda::gdn_chunk``): with the two above, it says which op a load failure comes from."""
    r = _package_in_child(tmp_path, "", post_grad=False)
    _loader_verdict(r, tmp_path)
    assert r.returncode == 0 and "PACKAGED ['kda::gdn_chunk']" in r.stdout, _said(r)
    assert max(float(e) for e in r.stdout.split("ERRORS")[1].split()[:2]) < 2e-2, _said(r)


def test_aotinductor_package_with_none_of_our_ops_on_cuda(tmp_path):
    """The third control: the layer exported without the op and packaged without our post-grad pass, so the
    package holds none of our ops. On an H100 (torch 2.11, 2026-12-07) the three above all died with SIGSEGV
    (each package named one of our ops or two, every one with a dtype argument, which torch 2.11's proxy
    executor misreads: docs/aotinductor.md); since then no op of ours in a package takes a dtype on such a
    torch, and this control says whether the loader crashes whatever the package holds: it did (H100, torch
    2.11, 4e7884a, 2026-12-08), hence the plain controls at the end."""
    r = _package_in_child(tmp_path, "gdn_chunk", post_grad=False)
    _loader_verdict(r, tmp_path)
    assert r.returncode == 0 and "PACKAGED []" in r.stdout and "CALLS_OP False" in r.stdout, _said(r)
    assert max(float(e) for e in r.stdout.split("ERRORS")[1].split()[:2]) < 2e-2, _said(r)


@pytest.mark.parametrize("import_ours", [False, True], ids=["plain torch", "kda_inductor imported"])
def test_aotinductor_loads_a_plain_package_on_cuda(tmp_path, import_ours):
    """The machine's own control: a package of a plain Linear + relu loads and matches eager, with and
    without kda_inductor imported (its ops registered, nothing of ours in the package)."""
    r = _plain_package_in_child(tmp_path, import_ours)
    assert r.returncode == 0 and "LOADED" in r.stdout, _said(r)
    assert float(r.stdout.split("ERRORS")[1].split()[0]) < 1e-2, _said(r)
