"""``kda_inductor.post_grad_pass`` taken the way vLLM takes a pass named in
``CompilationConfig.inductor_passes`` (vLLM cannot be installed on CI).

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

def resolve(qualname):
    """CompilationConfig.__post_init__ on one inductor_passes value."""
    names = qualname.split(".")
    module, name = ".".join(names[:-1]), names[-1]
    obj = __import__(module).__dict__[name]
    return obj if isinstance(obj, InductorPass) else CallableInductorPass(obj)

mod = types.ModuleType("vllm.compilation.passes.inductor_pass")
mod.InductorPass, mod.CallableInductorPass = InductorPass, CallableInductorPass
for name in ("vllm", "vllm.compilation", "vllm.compilation.passes"):
    sys.modules[name] = types.ModuleType(name)
sys.modules[mod.__name__] = mod
'''


def _run(body: str) -> str:
    code = FAKE_VLLM + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_resolved_as_vllm_does_and_runs_in_its_pass_manager():
    out = _run('''
        assert "kda_inductor" not in sys.modules          # vLLM's config is what imports us
        p = resolve("kda_inductor.post_grad_pass")
        import kda_inductor
        assert p is kda_inductor.post_grad_pass          # used as is, not wrapped in CallableInductorPass
        import kda_inductor.pass_manager as pm
        assert p.uuid() == pm.KdaPostGradPass().uuid()   # our content hash, not a hash of one class's source
        manager = PostGradPassManager(); manager.add(p)
        json_uuid = manager.uuid()                       # JSON-hashable
        import pickle; assert pickle.loads(pickle.dumps(p)) is p   # configs travel to workers by pickle

        # the same pass with options, in Inductor through the manager, as vLLM installs it
        from tests import graph_targets
        from torch._dynamo.utils import counters
        forced = kda_inductor.VllmPostGradPass(force=True)   # on CPU the speed rules leave code to Inductor
        manager = PostGradPassManager(); manager.add(forced)
        fn, args = graph_targets.build()
        torch._inductor.config.force_disable_caches = True
        with torch.inference_mode():
            out = torch.compile(fn, backend="inductor", options={"post_grad_custom_post_pass": manager})(*args)
            ref = fn(*args)
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(out, ref))
        print("matches", counters["kda_inductor"]["indexer_k_gather"])
    ''')
    assert "matches 1" in out


def test_imported_before_vllm_registered_by_the_plugin_hook():
    """kda_inductor imported first: vLLM's ``vllm.general_plugins`` entry point
    (``kda_inductor:register_with_vllm``) registers it, so the resolution still uses it as is."""
    _run('''
        del sys.modules["vllm.compilation.passes.inductor_pass"]
        import kda_inductor                               # before vLLM's pass module exists
        assert kda_inductor.register_with_vllm() is False
        sys.modules[mod.__name__] = mod
        assert not isinstance(kda_inductor.post_grad_pass, InductorPass)
        assert kda_inductor.register_with_vllm() is True  # what vLLM calls at start-up
        assert resolve("kda_inductor.post_grad_pass") is kda_inductor.post_grad_pass
    ''')


def test_plugin_entry_point_and_cheap_import():
    tomllib = pytest.importorskip("tomllib")

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["vllm.general_plugins"] == {"kda_inductor": "kda_inductor:register_with_vllm"}
    code = ("import sys, kda_inductor; assert 'torch' not in sys.modules, 'import kda_inductor imported torch'; "
            "assert 'post_grad_pass' in vars(kda_inductor)")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
