"""Fused ops, one file per rewrite: custom op, Triton kernel, CPU and fake impls."""


def arg_error(arg: str, msg: str, exc: type[Exception] = ValueError) -> Exception:
    """The error for a bad argument: its message starts with the argument's name."""
    return exc(f"{arg}: {msg}")
