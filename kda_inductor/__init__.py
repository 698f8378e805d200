"""kda_inductor: a torch.compile backend that fuses hybrid linear-attention and
sparse-attention serving code into Triton kernels.

    torch.compile(model, backend="kda_inductor")            # no import needed
    torch.compile(model, backend="kda_inductor", options={"kda": {"disable": [...]}})
    print(kda_inductor.explain(fn, *args))

Public surface: ``backend`` (the module; ``backend.kda_inductor`` is the compiler
function that the ``torch_dynamo_backends`` entry point names), ``explain`` and
its ``Report``, ``KdaOptions``, ``REWRITE_NAMES`` and ``__version__``.
"""

from kda_inductor import backend
from kda_inductor.explain import Report, explain
from kda_inductor.options import KdaOptions
from kda_inductor.patterns import REWRITE_NAMES

__version__ = "0.1.0"

__all__ = ["KdaOptions", "REWRITE_NAMES", "Report", "__version__", "backend", "explain"]
