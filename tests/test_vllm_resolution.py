"""``kda_inductor.post_grad_pass`` taken the way vLLM takes a pass named in
``CompilationConfig.inductor_passes``, against stand-ins for vLLM's pass module (fast; a real
vLLM serves a model with our pass in ``integration/test_vllm_real.py``, run by ``.ci/run``).

Reproduced from reading vLLM (main, 2026): ``vllm/config/compilation.py``
(``CompilationConfig.__post_init__``: the qualified name is split at its last dot and resolved
as ``__import__(module).__dict__[name]``; an object that is not an ``InductorPass`` is wrapped
in ``CallableInductorPass``), ``vllm/compilation/passes/inductor_pass.py`` (``InductorPass`` is a
torch ``CustomGraphPass``; ``CallableInductorPass`` hashes the source of the object's class as
its uuid), ``vllm/compilation/passes/pass_manager.py`` (``PostGradPassManager.add`` asserts
``isinstance(pass_, InductorPass)``, ``__call__`` asks ``is_applicable_for_range`` then calls
each pass on the graph, ``uuid`` JSON-hashes the passes' uuids) and ``vllm/config/utils.py``
(``normalize_value`` hashes objects by their ``uuid()``). The stand-ins below are written
from that reading, not copied.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_VLLM = '''
import hashlib, inspect, json, sys, types
import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

class InductorPass(CustomGraphPass):
    def uuid(self):
        return InductorPass.hash_source(self)

    @staticmethod
    def hash_source(*srcs):
        h = hashlib.sha256()
        for src in srcs:
            if isinstance(src, str):
                text = src
            elif isinstance(src, (types.FunctionType, type)):
                text = inspect.getsource(src)
            else:
                text = inspect.getsource(src.__class__)
            h.update(text.encode())
        return h.hexdigest()

    @staticmethod
    def hash_dict(d):
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()

    def is_applicable_for_range(self, compile_range):
        return True

class CallableInductorPass(InductorPass):
    def __init__(self, fn, uuid=None):
        self.callable = fn
        self._uuid = self.hash_source(fn) if uuid is None else uuid

    def __call__(self, graph):
        self.callable(graph)

    def uuid(self):
        return self._uuid

class PostGradPassManager(CustomGraphPass):
    def __init__(self):
        self.passes = []

    def add(self, pass_):
        assert isinstance(pass_, InductorPass)
        self.passes.append(pass_)

    def __call__(self, graph):
        for pass_ in self.passes:
            if pass_.is_applicable_for_range((1, 8192)):
                pass_(graph)

    def uuid(self):
        return InductorPass.hash_dict({"passes": [p.uuid() for p in self.passes]})

'''


def _fake_vllm(root: Path) -> None:
    """The stand-ins as an importable package: ``vllm.compilation.passes.inductor_pass``."""
    pkg = root / "vllm" / "compilation" / "passes"
    pkg.mkdir(parents=True)
    for folder in (root / "vllm", root / "vllm" / "compilation", pkg):
        (folder / "__init__.py").write_text("")
    (pkg / "inductor_pass.py").write_text(FAKE_VLLM)


PRELUDE = '''
import sys, torch

def resolve(qualname):
    """CompilationConfig.__post_init__ on one inductor_passes value (vLLM's config module
    imports its pass module at the top)."""
    from vllm.compilation.passes.inductor_pass import CallableInductorPass, InductorPass
    names = qualname.split(".")
    module, name = ".".join(names[:-1]), names[-1]
    obj = __import__(module).__dict__[name]
    return obj if isinstance(obj, InductorPass) else CallableInductorPass(obj)
'''


def _run(body: str, tmp_path: Path, env: dict | None = None) -> str:
    import os

    _fake_vllm(tmp_path)
    code = PRELUDE + textwrap.dedent(body)
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), **(env or {})}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=environ)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow  # a subprocess that compiles with Inductor: ~12 s on 2 cores
def test_resolved_as_vllm_does_and_runs_in_its_pass_manager(tmp_path):
    out = _run('''
        import vllm.compilation.passes.inductor_pass as vp  # vLLM's pass module first
        assert "kda_inductor" not in sys.modules          # vLLM's config is what imports us
        p = resolve("kda_inductor.post_grad_pass")
        import kda_inductor
        import kda_inductor.pass_manager as pm
        # before vLLM's plugins load (LLM(...) builds its config first): used as is, one of vLLM's passes
        assert p is kda_inductor.post_grad_pass and isinstance(p, vp.InductorPass)
        kda_inductor.vllm_plugin()                       # vLLM's plugin loading (vllm.general_plugins)
        p = resolve("kda_inductor.post_grad_pass")
        assert p is kda_inductor.post_grad_pass          # the same after
        assert p.uuid() == pm.KdaPostGradPass().uuid()   # our content hash, not a hash of one class's source
        manager = vp.PostGradPassManager(); manager.add(p)
        json_uuid = manager.uuid()                       # JSON-hashable
        import pickle; assert pickle.loads(pickle.dumps(p)) is p   # configs travel to workers by pickle

        # the same pass with options, in Inductor through the manager, as vLLM installs it
        from tests import graph_targets
        from torch._dynamo.utils import counters
        forced = kda_inductor.VllmPostGradPass(force=True)   # on CPU the speed rules leave code to Inductor
        assert isinstance(forced, vp.InductorPass)
        manager = vp.PostGradPassManager(); manager.add(forced)
        fn, args = graph_targets.build()
        torch._inductor.config.force_disable_caches = True
        with torch.inference_mode():
            out = torch.compile(fn, backend="inductor", options={"post_grad_custom_post_pass": manager})(*args)
            ref = fn(*args)
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(out, ref))
        print("matches", counters["kda_inductor"]["indexer_k_gather"])
    ''', tmp_path)
    assert "matches 1" in out


@pytest.mark.slow  # six subprocesses that import torch: ~40 s on 2 cores
@pytest.mark.parametrize("order", ["kda first", "vllm first", "TORCH_LOGS=kda_inductor"])
@pytest.mark.parametrize("plugins", ["before the config", "after the config"])
def test_in_every_order_vllms_cache_key_is_our_content(order, plugins, tmp_path):
    """Whichever was imported first (``TORCH_LOGS=kda_inductor`` imports us with torch) and whether
    vLLM loads its plugins before it builds the config (``vllm serve``) or after (``LLM(...)``):
    the pass vLLM configures is ours, unwrapped, and its uuid is our content hash: it changes with
    our options. Nothing is put on ``sys.meta_path``."""
    _run(f'''
        hooks = list(sys.meta_path)
        if {order!r} == "vllm first":
            import vllm.compilation.passes.inductor_pass
        import kda_inductor
        import vllm.compilation.passes.inductor_pass as vp
        if {plugins!r} == "before the config":
            kda_inductor.vllm_plugin()
        configured = resolve("kda_inductor.post_grad_pass")
        forced = kda_inductor.VllmPostGradPass(force=True)
        assert configured is kda_inductor.post_grad_pass and isinstance(configured, vp.InductorPass)
        from kda_inductor.options import KdaOptions
        assert configured.uuid() == KdaOptions().pass_uuid()
        assert forced.uuid() != configured.uuid()
        assert [h for h in sys.meta_path if h not in hooks] == []
        import inspect; inspect.getsource(vp.InductorPass)   # vLLM hashes its passes' sources: still readable
    ''', tmp_path, env={"TORCH_LOGS": "kda_inductor"} if order.startswith("TORCH_LOGS") else None)


def test_uuid_covers_sources_and_options(tmp_path):
    """vLLM keys its compile cache on the pass's uuid: it changes with our options (and with our
    sources: the pass manager's content hash)."""
    _run('''
        import vllm.compilation.passes.inductor_pass
        import kda_inductor
        from kda_inductor.options import KdaOptions
        from kda_inductor.pass_manager import KdaPostGradPass
        forced = kda_inductor.VllmPostGradPass(force=True)
        assert forced.uuid() != kda_inductor.post_grad_pass.uuid()
        assert forced.uuid() == KdaPostGradPass(KdaOptions.parse({"force": True})).uuid()
        kda_inductor.vllm_plugin()
        assert resolve("kda_inductor.post_grad_pass").uuid() == KdaPostGradPass().uuid()
    ''', tmp_path)


def test_plugin_entry_point_and_cheap_import():
    tomllib = pytest.importorskip("tomllib")

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["vllm.general_plugins"] == {"kda_inductor": "kda_inductor:vllm_plugin"}
    code = ("import sys; hooks = list(sys.meta_path); import kda_inductor; "
            "assert 'torch' not in sys.modules, 'import kda_inductor imported torch'; "
            "assert sys.meta_path == hooks, 'import kda_inductor added an import hook'; "
            "assert 'post_grad_pass' in vars(kda_inductor)")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
