"""A stand-in for fla-core's recurrent entry points, dispatched to as the real fla-core is on CUDA
(fla's decode and chunk entry points traced as our ops, on a CPU machine).

fla-core's Triton kernels need a GPU, and transformers 5.25 sends CPU inputs to its torch reference
anyway (``_PACKAGE_SUPPORTED_DEVICES`` in ``transformers/integrations/hub_kernels.py``). So
:func:`install` puts a small ``fla`` package in ``sys.modules`` whose
``fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule``, ``fla.ops.kda.fused_recurrent_kda``,
``fla.ops.gated_delta_rule.chunk_gated_delta_rule`` and ``fla.ops.kda.chunk_kda`` have fla-core
0.6.0's signatures, compute the recurrence in plain torch (a token loop written here, independent
of kda_inductor's op) and are wrapped in ``torch.compiler.disable`` as fla keeps its kernels out of
graphs; and lets transformers dispatch CPU inputs to ``fla``. :func:`modeling` then
executes a transformers modeling file anew (under a private module name), so that its
``use_kernel_func_from_hub_with_fallback`` decorators resolve the stand-in, as the installed
module's did resolve fla-core on the GPU machine. Neither touches transformers' own modules.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import torch


def _l2norm(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _recurrence(q, k, v, decay, beta, scale, initial_state, use_qk_l2norm_in_kernel):
    """fla's recurrent rule per token in float32: q / k ``[B, T, H, K]`` (value heads grouped over
    them), ``decay [B, T, HV]`` or ``[B, T, HV, K]`` (log), ``beta [B, T, HV]``."""
    rep = v.shape[2] // q.shape[2]
    q, k = (x.float().repeat_interleave(rep, 2) for x in (q, k))
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
    B, T, HV, K = q.shape
    state = q.new_zeros(B, HV, K, v.shape[-1]) if initial_state is None else initial_state.float().clone()
    outs = []
    for t in range(T):
        g = decay[:, t].float().exp()
        state = state * (g[..., None] if g.dim() == 3 else g[..., None, None])
        delta = (v[:, t].float() - (state * k[:, t, :, :, None]).sum(-2)) * beta[:, t].float()[..., None]
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        outs.append((state * q[:, t, :, :, None]).sum(-2))
    return torch.stack(outs, 1).to(v.dtype), state


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                                     A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                                     state_v_first=False, cu_seqlens=None, **kwargs):
    unsupported = (gv, A_log, dt_bias, cu_seqlens) != (None,) * 4 or use_gate_in_kernel or state_v_first
    if unsupported or use_beta_sigmoid_in_kernel or allow_neg_eigval or kwargs:
        raise NotImplementedError("the stand-in computes what transformers asks for, nothing else")
    decay = g if gk is None else gk if g is None else g[..., None] + gk
    o, state = _recurrence(q, k, v, decay, beta, scale, initial_state, use_qk_l2norm_in_kernel)
    return o, state if output_final_state else None


def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,
                        output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None, state_v_first=False,
                        cu_seqlens=None, **kwargs):
    return fused_recurrent_gated_delta_rule(q, k, v, gk=g, beta=beta, scale=scale, initial_state=initial_state,
                                            output_final_state=output_final_state,
                                            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, A_log=A_log,
                                            dt_bias=dt_bias, use_gate_in_kernel=use_gate_in_kernel,
                                            use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                                            allow_neg_eigval=allow_neg_eigval, state_v_first=state_v_first,
                                            cu_seqlens=cu_seqlens, **kwargs)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
    """fla-core 0.6.0's chunked entry point (prefill), here the same token loop."""
    if cu_seqlens is not None or kwargs:
        raise NotImplementedError("the stand-in computes what transformers asks for, nothing else")
    o, state = _recurrence(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel)
    return o, state if output_final_state else None


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
              return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
              cp_context=None, use_graph=False, max_num_seqs=None, **kwargs):
    """fla-core 0.6.0's chunked KDA entry point (Kimi Linear prefill), its signature and forward result:
    ``g`` the log decay per key channel ``[B, T, HV, K]`` (with ``use_gate_in_kernel``, the raw gate:
    ``-exp(A_log) * softplus(g + dt_bias)``), ``beta`` (with ``use_beta_sigmoid_in_kernel``, logits),
    varlen ``cu_seqlens``; ``chunk_size`` 32 or 64 and keywords it does not name ignored, as fla's;
    ``o`` in q's dtype. The same token loop; the rest raises."""
    if (state_v_first or return_intermediate_states or cp_context is not None or use_graph or lower_bound is not None
            or kwargs.get("transpose_state_layout")):
        raise NotImplementedError("the stand-in computes what transformers asks for, nothing else")
    if kwargs.get("chunk_size", 64) not in (32, 64):
        raise ValueError("`chunk_size` must be either 32 or 64 for KDA")
    if cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError("The batch size is expected to be 1 rather than 2 when using `cu_seqlens`.")
    assert initial_state is None or initial_state.dtype == torch.float32, "initial_state must be in float32."
    assert g.shape == (*v.shape[:3], q.shape[-1]), "g must have shape [B, T, HV, K]"
    if use_gate_in_kernel:
        HV, K = g.shape[-2:]
        bias = kwargs["dt_bias"].float().view(HV, K) if kwargs.get("dt_bias") is not None else 0.0
        g = -kwargs["A_log"].float().exp().view(HV, 1) * torch.nn.functional.softplus(g.float() + bias)
    if use_beta_sigmoid_in_kernel:
        beta = beta.float().sigmoid() * (2.0 if allow_neg_eigval else 1.0)
    offsets = [0, q.shape[1]] if cu_seqlens is None else [int(x) for x in cu_seqlens]
    outs, states = [], []
    for n, (s, e) in enumerate(zip(offsets[:-1], offsets[1:])):
        state = None if initial_state is None else initial_state[n:n + 1] if cu_seqlens is not None else initial_state
        o, state = _recurrence(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e], scale, state,
                               use_qk_l2norm_in_kernel)
        outs.append(o)
        states.append(state)
    return torch.cat(outs, 1).to(q.dtype), torch.cat(states) if output_final_state else None


def install(monkeypatch) -> types.SimpleNamespace:
    """The stand-in ``fla`` package in ``sys.modules`` (fresh function objects each time), and
    transformers' dispatch sending CPU inputs to it; undone by ``monkeypatch``."""
    fla, ops = types.ModuleType("fla"), types.ModuleType("fla.ops")
    gdn, kda = types.ModuleType("fla.ops.gated_delta_rule"), types.ModuleType("fla.ops.kda")
    gdn.fused_recurrent_gated_delta_rule = torch.compiler.disable(fused_recurrent_gated_delta_rule)
    kda.fused_recurrent_kda = torch.compiler.disable(fused_recurrent_kda)
    gdn.chunk_gated_delta_rule = torch.compiler.disable(chunk_gated_delta_rule)
    kda.chunk_kda = torch.compiler.disable(chunk_kda)
    fla.ops, ops.gated_delta_rule, ops.kda = ops, gdn, kda
    for module in (fla, ops, gdn, kda):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    if importlib.util.find_spec("transformers") is not None:
        from transformers.integrations import hub_kernels

        devices = getattr(hub_kernels, "_PACKAGE_SUPPORTED_DEVICES", None)  # 5.17 has none: fla on any device
        if devices is not None:
            monkeypatch.setitem(devices, "fla", (*devices.get("fla", ()), "cpu"))
    return types.SimpleNamespace(gdn=gdn.fused_recurrent_gated_delta_rule, kda=kda.fused_recurrent_kda,
                                 gdn_chunk=gdn.chunk_gated_delta_rule, kda_chunk=kda.chunk_kda)


def modeling(monkeypatch, family_module: str) -> types.ModuleType:
    """``transformers.models.<m>.modeling_<m>`` executed anew under a private name, its hub-kernel
    decorators resolving the installed stand-in."""
    path = importlib.util.find_spec(f"transformers.models.{family_module}.modeling_{family_module}").origin
    name = f"transformers.models.{family_module}._modeling_with_fla_standin"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module
