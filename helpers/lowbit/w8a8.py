"""Activation quantization for notebook 08: int8 activation scales (static, calibrated once on held-out
batches, against dynamic, taken from each call's own input), W8A8 int8 matmuls through `torch._int_mm`
checked against dequantize-then-matmul and timed beside fp32, and PyTorch's CPU int4 weight kernels.

- `act_scale`, `quantize_act`, `w8a8_matmul`: the core, on stage in notebook 08.
- `calibrated_scales`, `static_dynamic_rows`: per block linear, the error of the activations quantized with a
  calibrated scale against a per-call one, and the share of values a static scale clips.
- `w8a8_check`, `w8a8_speed`: the int8 product against dequantize-then-matmul, and its time beside fp32's.
- `int4_cpu_pack`, `int4_cpu_matmul`: a zero-point int4 weight in the layout of
  `torch.ops.aten._weight_int4pack_mm_for_cpu` (None where this torch build lacks the kernels).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from helpers.measure import clock as clocks, protocol
from helpers.measure import bench

INT_MM_ROWS, INT_MM_MULTIPLE = 17, 8  # CUDA's torch._int_mm: more than 16 rows; k and n multiples of 8


def act_scale(x: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """One absmax scale for the whole tensor: the largest |x| maps to the top code 2^(bits-1) - 1."""
    return x.abs().amax().clamp_min(1e-12) / (2 ** (bits - 1) - 1)


def quantize_act(x: torch.Tensor, scale: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """int8 codes of x / scale, rounded to nearest; values beyond the grid are clipped to it (a static scale
    calibrated on other batches can be smaller than this input needs)."""
    qmax = 2 ** (bits - 1) - 1
    return torch.clamp(torch.round(x / scale), -qmax - 1, qmax).to(torch.int8)


def w8a8_matmul(x: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """x (m, k) float, quantized per tensor with x_scale; w_q (n, k) int8 with one scale per output row
    w_scale (n,). The product of the codes runs in int8 with int32 sums (torch._int_mm), then is scaled
    back to float: y = (x_q @ w_qᵀ) · x_scale · w_scale."""
    x_q = quantize_act(x, x_scale)
    acc = int_mm(x_q, w_q.t())  # (m, n) int32, exact
    return acc.to(torch.float32) * (x_scale * w_scale)


def int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch._int_mm(a (m, k) int8, b (k, n) int8) -> (m, n) int32. The CPU kernel takes any shape; CUDA's
    needs m > 16 and k, n multiples of 8, so on a GPU the rows are padded with zeros to 17 (and cut off after),
    and k or n off the multiple is refused with a ValueError."""
    if a.device.type != "cuda":
        return torch._int_mm(a, b)
    m, k = a.shape
    if k % INT_MM_MULTIPLE or b.shape[1] % INT_MM_MULTIPLE:
        raise ValueError(f"torch._int_mm on CUDA needs k and n multiples of {INT_MM_MULTIPLE}: k={k}, n={b.shape[1]}")
    if m < INT_MM_ROWS:
        a = torch.cat([a, a.new_zeros(INT_MM_ROWS - m, k)])
    return torch._int_mm(a, b)[:m]


def rowwise_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (n, k) float -> int8 codes (n, k) and one absmax scale per output row (n,)."""
    s = w.abs().amax(1).clamp_min(1e-12) / 127
    return torch.clamp(torch.round(w / s[:, None]), -128, 127).to(torch.int8), s


def rel_error(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """||x - x_hat|| / ||x||."""
    return float((x - x_hat).norm() / x.norm().clamp_min(1e-30))


# ---------------------------------------------------------------- static against dynamic scales

def calibrated_scales(calib: list[dict[str, torch.Tensor]], bits: int = 8) -> dict[str, torch.Tensor]:
    """Static scales: per layer, the largest `act_scale` over the calibration batches `calib` (each a
    {layer: inputs} dict, as `quant_lab.block_inputs` returns), fixed before the evaluation batch is seen."""
    return {name: torch.stack([act_scale(c[name], bits) for c in calib]).amax() for name in calib[0]}


def static_dynamic_rows(acts: dict[str, torch.Tensor], static: dict[str, torch.Tensor], bits: int = 8) -> list[dict]:
    """Per layer of `acts` (held-out inputs not in the calibration): the relative error of the activations
    quantized with the static scale and with a dynamic per-tensor scale (this input's own absmax), the
    dynamic scale over the static one, and the share of values the static scale clips (|x| beyond its grid)."""
    rows = []
    qmax = 2 ** (bits - 1) - 1
    for name, x in acts.items():
        x = x.float()
        s_stat, s_dyn = static[name], act_scale(x, bits)
        err = {k: rel_error(x, quantize_act(x, s, bits).float() * s) for k, s in (("static", s_stat), ("dynamic", s_dyn))}
        rows.append({"layer": name, "static": err["static"], "dynamic": err["dynamic"],
                     "scale_ratio": float(s_dyn / s_stat), "clipped": float((x.abs() > (qmax + 0.5) * s_stat).float().mean())})
    return rows


# ---------------------------------------------------------------- W8A8 against dequantize-then-matmul

def w8a8_check(x: torch.Tensor, w: torch.Tensor, rtol: float = 1e-5) -> dict:
    """`w8a8_matmul` against the same codes dequantized to fp32 and multiplied by F.linear: the int32 sums
    are exact, so the two differ only by fp32 rounding of the reference's sums. Returns {max_diff,
    scale (max |reference|), rtol, ok (max_diff <= rtol · scale), error_vs_fp32 (the W8A8 product against
    the unquantized x wᵀ, relative)}."""
    w_q, w_s = rowwise_weight(w)
    x_s = act_scale(x)
    y = w8a8_matmul(x, x_s, w_q, w_s)
    ref = F.linear(quantize_act(x, x_s).float() * x_s, w_q.float() * w_s[:, None])
    diff, scale = float((y - ref).abs().max()), float(ref.abs().max())
    return {"max_diff": diff, "scale": scale, "rtol": rtol, "ok": diff <= rtol * scale,
            "error_vs_fp32": rel_error(F.linear(x, w), y)}


def w8a8_speed(x: torch.Tensor, w: torch.Tensor, *, budget_s: float = 2.0, min_reps: int = 12, max_reps: int = 20,
               threads: int = 1, timer=None) -> "protocol.Comparison":
    """fp32 F.linear(x, w) against W8A8 (dynamic activation scale, quantize, torch._int_mm, scale back)
    and against the int8 product alone (activations quantized beforehand), on `threads` CPU threads, timed by
    `protocol.compare` on the thread's clock (one thread) or the wall clock, at least `min_reps` rounds (calls
    under a millisecond: five rounds left W8A8's IQR about a fifth of its median on a busy machine)."""
    w_q, w_s = rowwise_weight(w)
    w_qt = w_q.t()
    x_s = act_scale(x)
    x_q = quantize_act(x, x_s)
    fns = {"fp32 F.linear": lambda: F.linear(x, w),
           "W8A8 (quantize x + int_mm)": lambda: w8a8_matmul(x, act_scale(x), w_q, w_s),
           "int_mm alone": lambda: torch._int_mm(x_q, w_qt)}
    with bench.cpu_threads("cpu", threads):
        timer = timer or protocol.device_timer("cpu", clocks.THREAD if threads == 1 else clocks.WALL)
        return protocol.compare(fns, device="cpu", timer=timer, min_reps=min_reps, max_reps=max_reps, budget_s=budget_s,
                                max_warmup=5)


# ---------------------------------------------------------------- PyTorch's CPU int4 kernels

def int4_cpu_available() -> bool:
    """Whether this torch build has the CPU int4 weight kernels."""
    return all(hasattr(torch.ops.aten, op) for op in ("_convert_weight_to_int4pack_for_cpu",
                                                        "_weight_int4pack_mm_for_cpu"))


def int4_cpu_pack(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Our zero-point int4 weight, codes (n, k) in 0..15 with scale and zero (n, k / group), dequantized as
    (q - zero) · scale, in the CPU kernel's layout: the codes packed by `_convert_weight_to_int4pack_for_cpu`
    and scales-and-zeros (k / group, n, 2), where the kernel dequantizes as (q - 8) · scale + z', so
    z' = (8 - zero) · scale."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
    sz = torch.stack([scale, (8 - zero) * scale], -1).transpose(0, 1).contiguous().float()
    return packed, sz


def int4_cpu_matmul(x: torch.Tensor, packed: torch.Tensor, sz: torch.Tensor, group_size: int) -> torch.Tensor:
    """x (m, k) fp32 @ the packed int4 weightᵀ -> (m, n), in one call of the CPU kernel."""
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group_size, sz)


# ---------------------------------------------------------------- sentences and the ledger's row

def static_dynamic_sentence(rows: list[dict], calib_batches: int) -> str:
    """One sentence from `static_dynamic_rows`: the mean error of each kind of scale, in how many layers the
    static one is lower, and the largest share of values it clipped."""
    n = len(rows)
    st, dy = sum(r["static"] for r in rows) / n, sum(r["dynamic"] for r in rows) / n
    lower = sum(r["static"] < r["dynamic"] for r in rows)
    worst = max(rows, key=lambda r: r["clipped"])
    return (f"Over {n} layer inputs, static scales calibrated on {calib_batches} other held-out batches give a mean "
            f"error of {st:.4f} against {dy:.4f} for dynamic per-call scales; static is lower in {lower} of {n} layers "
            f"(a static scale above this batch's absmax leaves codes unused, a coarser grid than the dynamic one; a "
            f"static scale below it clips: at most {worst['clipped']:.3%} of values, in {worst['layer']}).")


W8A8_CLAIM = dict(notebook="08", source="the first source text, section 5.1",
                  claim="FP32/FP16 to INT8/INT4: memory reduction and faster compute (here: an INT8 matmul with INT8 "
                        "activations, W8A8, against fp32)")


def w8a8_claim(comp: "protocol.Comparison", shape: tuple, base: str = "fp32 F.linear",
               w8a8: str = "W8A8 (quantize x + int_mm)") -> dict:
    """The ledger's keyword arguments for the 'faster compute' claim from `w8a8_speed`'s comparison: fp32's time
    over W8A8's (quantizing the activations included; > 1: int8 faster), median and IQR bounds, claimed at
    least 1x."""
    r = protocol.ratio(comp.timings[base], comp.timings[w8a8])
    m, k, n = shape
    return dict(W8A8_CLAIM, measured=f"a ({m} x {k}) by ({k} x {n}) product on one CPU thread, fp32 time over W8A8's: "
                                     f"{r}" + ("" if r.separated else ", within the noise"),
                value=r.value, spread=(r.lo, r.hi), claimed=(1.0, None), unit="x")
