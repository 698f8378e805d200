"""The launch configs ``bench_gdn_chunk.py --sweep`` times (``--configs`` picks rows by label) and
``gdn_chunk_registers.py`` compiles for sm_90: ``kda::gdn_chunk``'s :class:`LaunchConfig` variants
(:data:`FAST`, its inverse choices, the v3 launches, the v4 scan and output, the older launches)
and, with ``--kda``, those of a decay per key channel."""

from __future__ import annotations

import torch

from kda_inductor.lowerings import gdn_chunk as L


def _inverse_configs(fast) -> dict[str, object]:
    """:data:`FAST` with ``wu2``'s inverse by a product of factors (``LaunchConfig.wu_inverse``: no
    reductions across rows in its diagonal blocks); ``tf32`` for its time only (inaccurate on
    correlated keys with slow decay: the attribute's docstring); the scan's own stages
    (``LaunchConfig.scan_stages``)."""
    return {"FAST inv doubling": fast._replace(wu_inverse="doubling"),
            "FAST inv doubling tf32": fast._replace(wu_inverse="doubling_tf32"),
            "FAST inv ieee": fast._replace(wu_inverse="ieee"),
            "FAST inv doubling wu w8": fast._replace(wu_inverse="doubling", warps=8),
            "FAST inv ieee wu w8": fast._replace(wu_inverse="ieee", warps=8), "FAST inv tf32": fast._replace(
                wu_inverse="tf32"),
            # the 1-stage NaN split (scan2 alone at 1 stage; all but scan2), then the scan's own stages
            "FAST scan 1 stage": fast._replace(scan_stages=1), "FAST 1 stage scan 2": fast._replace(
                num_stages=1, scan_stages=2), "FAST scan 3 stages": fast._replace(scan_stages=3),
            "FAST scan 4 stages": fast._replace(scan_stages=4)}


def sweep_configs(smoke: bool) -> dict[str, object]:
    C = L.LaunchConfig
    base = C()  # the four float32 launches (the default before 2026-12-05)
    cfgs = {"default": base, "scan bv64": base._replace(scan_block_v=64), "scan bv16": base._replace(scan_block_v=16),
            "scan w4": base._replace(scan_warps=4), "out bv32": base._replace(out_block_v=32),
            "2 stages": base._replace(num_stages=2), "bf16 inter": base._replace(inter_dtype=torch.bfloat16),
            "bf16 inter bv64": base._replace(inter_dtype=torch.bfloat16, scan_block_v=64),
            "pre kd": base._replace(precompute_kd=True),
            "pre kd bf16 inter": base._replace(precompute_kd=True, inter_dtype=torch.bfloat16),
            "pre kd 2 stages": base._replace(precompute_kd=True, num_stages=2)}
    fast = L.FAST
    cfgs_v2 = {"FAST": fast, "FAST scan bv64": fast._replace(scan_block_v=64),
               "FAST scan bv16": fast._replace(scan_block_v=16), "FAST scan w8": fast._replace(scan_warps=8),
               "FAST 3 stages": fast._replace(num_stages=3), "FAST 1 stage": fast._replace(num_stages=1),
               "FAST out bv128": fast._replace(out_block_v=128), "FAST out bv32": fast._replace(out_block_v=32),
               "FAST out w8": fast._replace(out_warps=8), "FAST wu w8": fast._replace(warps=8),
               "FAST all w8": fast._replace(warps=8, scan_warps=8, out_warps=8),
               "FAST out bv128 3 stages": fast._replace(out_block_v=128, num_stages=3),
               "FAST all w2": fast._replace(warps=2, scan_warps=2, out_warps=2),
               "v2 fp32 tf32": fast._replace(lowp=False), "v2 bf16 inter tf32":
               fast._replace(lowp=False, inter_dtype=torch.bfloat16)}
    f3 = L.FAST3
    cfgs_v3 = {  # most telling first: the budget may end the sweep
        "FAST3": f3, "FAST3 fused w8": f3._replace(fuse_wu=True, warps=8),
        "FAST3 inv tf32": f3._replace(solve_inverse="tf32"), "FAST3 inv subst": f3._replace(solve_inverse="subst"),
        "FAST3 out v last": f3._replace(out_v_first=False), "FAST out v first": fast._replace(out_v_first=True),
        "FAST3 solve w2": f3._replace(solve_warps=2), "FAST3 solve w8": f3._replace(solve_warps=8),
        "FAST3 wu w8": f3._replace(warps=8), "FAST3 out bv128 w8": f3._replace(out_block_v=128, out_warps=8),
        "FAST3 out bv128": f3._replace(out_block_v=128), "FAST3 scan bv16": f3._replace(scan_block_v=16),
        "FAST3 fused w4": f3._replace(fuse_wu=True), "FAST3 3 stages": f3._replace(num_stages=3),
        "FAST3 1 stage": f3._replace(num_stages=1), "FAST3 out bv32": f3._replace(out_block_v=32),
        "FAST3 scan bv64": f3._replace(scan_block_v=64), "FAST3 wu w2": f3._replace(warps=2),
        "FAST3 inv tf32 solve w2": f3._replace(solve_inverse="tf32", solve_warps=2),
        "FAST3 inv subst solve w2": f3._replace(solve_inverse="subst", solve_warps=2),
        "FAST3 inv doubling": f3._replace(solve_inverse="doubling"),
        "FAST3 inv doubling tf32": f3._replace(solve_inverse="doubling_tf32")}
    cfgs_inv = _inverse_configs(fast)
    cfgs_v4 = _v4_configs(fast, f3)
    if smoke:  # the old default, FAST and FAST3 (bf16 inputs: bf16emu products under the interpreter)
        return {"default": base, "FAST": fast, "FAST inv ieee": cfgs_inv["FAST inv ieee"], "FAST3": f3,
                "FAST3 inv subst": cfgs_v3["FAST3 inv subst"], "FAST scan4 s3": cfgs_v4["FAST scan4 s3"],
                "FAST out4": cfgs_v4["FAST out4"], "FAST4": cfgs_v4["FAST4"],
                "FAST scanout4": cfgs_v4["FAST scanout4"]}
    # the op's default (FAST with wu2's tf32 inverse by doubling, scan4 at 3 stages, out4 per GQA group: 292 /
    # 1,117 us against the default before it, 357 / 1,391, at T 4,096 / 16,384, H100 2026-12-06) and
    # candidates on top of it, FAST, its inverse variants and the v3 / v4 launches (the budget may end the
    # sweep), then the rest
    dflt = L.DEFAULT
    before = fast._replace(wu_inverse=dflt.wu_inverse)
    head = {"DEFAULT": dflt, "DEFAULT before (scan2, output2)": before,
            "DEFAULT scan4 s4": dflt._replace(scan_stages=4), "DEFAULT scan4 bv64 s3": dflt._replace(scan_block_v=64),
            "DEFAULT scan4 w2 s3": dflt._replace(scan_warps=2), "DEFAULT out4 bv128 w8":
            dflt._replace(out_block_v=128, out_warps=8), "DEFAULT 3 stages": dflt._replace(num_stages=3),
            "DEFAULT scanout4": before._replace(scan4_out=True)}
    return {**head, "FAST": fast, **cfgs_inv, **cfgs_v3, **cfgs_v4, **cfgs_v2, **cfgs}


def _v4_configs(fast, f3) -> dict[str, object]:
    """``LaunchConfig.scan4`` (v2's scan laid out as fla's) at fla's Hopper choices (BV 32 / 64, 2 / 4
    warps, 2-4 stages) and ``LaunchConfig.out4`` (the output with q k^T shared by a GQA group, or a
    program per head; fla's 64 x 4 warps and 128 x 8 warps tiles), then both with v3's ``wu``, then the
    scan with the output fused (``LaunchConfig.scan4_out``) at the tiles that do not spill for sm_90."""
    s4 = fast._replace(scan4=True)
    return {"FAST scan4": s4, "FAST scan4 s3": s4._replace(scan_stages=3), "FAST scan4 s4": s4._replace(scan_stages=4),
            "FAST scan4 bv64": s4._replace(scan_block_v=64),
            "FAST scan4 bv64 s3": s4._replace(scan_block_v=64, scan_stages=3),
            "FAST scan4 w2 s3": s4._replace(scan_warps=2, scan_stages=3),
            "FAST scan4 bv16 s3": s4._replace(scan_block_v=16, scan_stages=3),
            "FAST out4": fast._replace(out4="group"), "FAST out4 head": fast._replace(out4="head"),
            "FAST out4 bv128 w8": fast._replace(out4="group", out_block_v=128, out_warps=8),
            "FAST out4 head bv128 w8": fast._replace(out4="head", out_block_v=128, out_warps=8),
            "FAST out4 bv32": fast._replace(out4="group", out_block_v=32),
            "FAST4": f3._replace(scan4=True, scan_stages=3, out4="group"),
            "FAST4 s2": f3._replace(scan4=True, out4="group"),
            # the scan with the output fused (scan4_out): no per-chunk states or v_new stored, no output launch
            "FAST scanout4": fast._replace(scan4_out=True),
            "FAST scanout4 bv16": fast._replace(scan4_out=True, scan_block_v=16),
            "FAST scanout4 bv16 s3": fast._replace(scan4_out=True, scan_block_v=16, scan_stages=3),
            "FAST scanout4 bv16 w8 s3": fast._replace(scan4_out=True, scan_block_v=16, scan_warps=8, scan_stages=3),
            "FAST scanout4 w8": fast._replace(scan4_out=True, scan_warps=8),
            "FAST4 fused": f3._replace(scan4_out=True),
            "FAST4 fused bv16": f3._replace(scan4_out=True, scan_block_v=16),
            "FAST4 fused w8 s3": f3._replace(scan4_out=True, scan_block_v=16, scan_warps=8, scan_stages=3),
            # v3's inverse with the key dimension in a loop of 32 columns (solve_bk, fla's kkt_solve shape)
            "FAST3 solve4": f3._replace(solve_bk=32), "FAST3 solve4 w2": f3._replace(solve_bk=32, solve_warps=2),
            "FAST4 fused solve w2": f3._replace(scan4_out=True, solve_warps=2)}


def selected_configs(smoke: bool, labels: str | None) -> dict[str, object]:
    """:func:`sweep_configs`, or only those of the full sweep named in ``labels`` (comma-separated, in
    that order; ``smoke`` or not)."""
    if not labels:
        return sweep_configs(smoke)
    cfgs = sweep_configs(False)
    names = [n.strip() for n in labels.split(",") if n.strip()]
    unknown = [n for n in names if n not in cfgs]
    if unknown:
        raise SystemExit(f"--configs: unknown {unknown}; the sweep's: {', '.join(cfgs)}")
    return {n: cfgs[n] for n in names}


def kda_sweep_configs(smoke: bool) -> dict[str, object]:
    """``--kda --sweep``: :data:`~kda_inductor.lowerings.gdn_chunk.KDA` and one change at a time (the
    intra launch's products and warps first: its tf32 products spill 968 bytes for sm_90 at 8 warps,
    bf16 ones 320; at 4 warps 1,264 with bf16; ``kda_intra_cols``: ``A`` / ``Aqk`` block by block over
    key column blocks, 88 bytes at 32 columns, 8 warps)."""
    k = L.KDA
    cfgs = {"KDA": k, "KDA intra bf16": k._replace(kda_intra_dot=""),
            "KDA intra bf16 w4": k._replace(kda_intra_dot="", warps=4), "KDA intra w16": k._replace(warps=16),
            "KDA intra w4": k._replace(warps=4),
            "KDA scan w8": k._replace(scan_warps=8), "KDA scan bv64": k._replace(scan_block_v=64),
            "KDA scan bv16": k._replace(scan_block_v=16), "KDA out bv128": k._replace(out_block_v=128),
            "KDA out w8": k._replace(out_warps=8), "KDA out v first": k._replace(out_v_first=True),
            "KDA 1 stage": k._replace(num_stages=1), "KDA 3 stages": k._replace(num_stages=3),
            "KDA fp32 inter": k._replace(lowp=False),
            # A / Aqk block by block over 32-column key blocks (sm_90, Triton 3.9: 88 stack bytes at 8 warps)
            "KDA cols 32": k._replace(kda_intra_cols=32), "KDA cols 16": k._replace(kda_intra_cols=16),
            "KDA cols 64": k._replace(kda_intra_cols=64), "KDA cols 32 w4": k._replace(kda_intra_cols=32, warps=4),
            "KDA cols 32 bf16": k._replace(kda_intra_cols=32, kda_intra_dot=""),
            # the inverse's diagonal blocks by doubling (the GDN default's) instead of the substitution
            "KDA cols 32 inv doubling": k._replace(kda_intra_cols=32, wu_inverse="doubling"),
            "KDA cols 32 inv doubling_tf32": k._replace(kda_intra_cols=32, wu_inverse="doubling_tf32"),
            # A / Aqk one program per block pair, then the rest (fla's split; sm_90, Triton 3.9: pairs 232
            # registers, no spills at 64 columns, 4 warps; rest 254 / 16 stack bytes at 8 warps)
            "KDA split": k._replace(kda_intra_split=True), "KDA split cols 32": k._replace(kda_intra_split=True,
                                                                                            kda_intra_cols=32),
            "KDA split w4": k._replace(kda_intra_split=True, warps=4),
            "KDA split inv doubling_tf32": k._replace(kda_intra_split=True, wu_inverse="doubling_tf32")}
    return {"KDA": k, "KDA intra bf16": cfgs["KDA intra bf16"], "KDA fp32 inter": cfgs["KDA fp32 inter"],
            "KDA cols 32": cfgs["KDA cols 32"], "KDA split": cfgs["KDA split"]} if smoke else cfgs
