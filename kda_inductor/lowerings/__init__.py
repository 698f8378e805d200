"""Fused ops, one file per rewrite: custom op, Triton kernel, CPU and fake impls."""


def arg_error(arg: str, msg: str, exc: type[Exception] = ValueError) -> Exception:
    """The error for a bad argument: its message starts with the argument's name."""
    return exc(f"{arg}: {msg}")


def triton_launch_options() -> dict:
    """Extra launch options for our debug-mode kernels: Triton's debug mode (needed for
    ``device_assert``) also adds overflow checks to 32-bit integer arithmetic, which cost
    up to 20% (benchmarks/results/gdn_spec_split.md); keep the asserts, drop those checks
    where this Triton lets us."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:  # pragma: no cover
        return {}
    fields = getattr(CUDAOptions, "__dataclass_fields__", {})
    return {"sanitize_overflow": False} if "sanitize_overflow" in fields else {}
