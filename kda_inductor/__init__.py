"""kda_inductor: a torch.compile backend that fuses hybrid linear-attention and
sparse-attention serving code into Triton kernels.

    torch.compile(model, backend="kda_inductor")            # no import needed
    torch.compile(model, backend="kda_inductor", options={"kda": {"disable": [...]}})
    print(kda_inductor.explain(fn, *args))
"""

from kda_inductor.backend import kda_inductor as backend
from kda_inductor.explain import Report, explain
from kda_inductor.options import KdaOptions
from kda_inductor.patterns import REWRITE_NAMES

__version__ = "0.1.0"

__all__ = ["KdaOptions", "REWRITE_NAMES", "Report", "__version__", "backend", "explain"]
