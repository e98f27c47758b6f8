"""FP8 training's layer: the fp8 matmuls, `Float8Linear` and its backward, the model swap, and torchao's
float8 training beside them (notebook 07).

The formats, casts and scaling recipes are `helpers.lowbit.fp8`; the scale convention is its own
(q = cast(x * scale), x ≈ q / scale, so a matmul multiplies by 1 / scale).

* `scaled_mm`: torch._scaled_mm where the device accepts it (CUDA sm_89+; the CPU in torch 2.13), else
  an fp32 emulation (`emulated()` forces it; `scaled_mm_refusal` says why it was used); `blockwise_mm`:
  the K-chunked product with fp32 promotion every 128 along K (on CUDA, torch.nn.functional.scaled_mm's
  blockwise recipes once they have matched it, `BLOCKWISE_PATH` saying which ran).
* `Float8Matmul`, `Float8Linear`, `convert_to_float8`: the autograd function, the layer (one of `RECIPES`)
  and the model swap (LM head and shapes that are not multiples of 16 skipped and reported).
* torchao: `import_torchao` (its float8 training imported quietly), `torchao_problem` (probed per recipe
  and device), `torchao_convert` (its model swap with our skips).
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import warnings
from typing import Callable

import torch
import torch.nn as nn

from helpers.lowbit.fp8 import E4M3, E5M2, DelayedScaler, blockwise, cast, expand_scale, rowwise, tensorwise

RECIPES = ("tensorwise", "delayed", "rowwise", "blockwise")  # what Float8Linear trains with


# ---------------------------------------------------------------- matmuls

_SCALED_MM_REFUSED: dict[tuple, str] = {}
_EMULATE = [False]


@contextlib.contextmanager
def emulated():
    """Within this block every `scaled_mm` takes the fp32 emulation path, not torch._scaled_mm."""
    _EMULATE.append(True)
    try:
        yield
    finally:
        _EMULATE.pop()


def _first_sentence(err: BaseException) -> str:
    """An exception's message cut to what a learner needs: an internal assert's own text is dropped."""
    msg = str(err).splitlines()[0] if str(err) else type(err).__name__
    if "please report a bug to PyTorch." in msg:  # INTERNAL ASSERT FAILED at "...": the reason follows
        msg = msg.split("please report a bug to PyTorch.", 1)[1].strip() or msg
    msg = msg[:160].rstrip()
    return msg if msg.endswith(".") else msg + "."


def scaled_mm_refusal(device: str | torch.device, rowwise: bool = True, aligned: bool = True) -> str | None:
    """Why torch._scaled_mm refused per-row (rowwise=True) or per-tensor scales on `device` in this
    process, so that `scaled_mm` emulated those products in fp32; None if it has not refused them (or
    was not tried yet). torch 2.11 on a CPU, for one, accepts only per-tensor scales.

    aligned=True asks about products whose K and N are multiples of 16 (what every fp8 GEMM of a
    converted layer has when its tokens are too); aligned=False about the others, which CUDA's kernels
    refuse whatever the scales. A refusal of one kind never sends products of the other to the emulation."""
    dev = torch.device(device).type
    return next((why for (d, rw, _, _, al), why in _SCALED_MM_REFUSED.items()
                 if d == dev and rw == rowwise and al == aligned), None)


def mm_aligned(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> bool:
    """Whether a (M, K) @ b (K, N) has K and N multiples of 16, as torch._scaled_mm requires on CUDA
    (torch's own shape check: mat1.size(1) and both sizes of mat2 divisible by 16; M is free). The
    weight gradient dW = dYᵀ X contracts over the tokens, so there K is the number of tokens."""
    return a_shape[1] % 16 == 0 and b_shape[1] % 16 == 0


def _emulated_mm(a, b, inv_a, inv_b, out_dtype):
    return ((a.float() * inv_a) @ (b.float() * inv_b)).to(out_dtype)


def scaled_mm(a: torch.Tensor, b: torch.Tensor, inv_a: torch.Tensor, inv_b: torch.Tensor,
              out_dtype: torch.dtype = torch.float32, fast_accum: bool = False, emulate: bool = False) -> torch.Tensor:
    """(a / scale_a) @ (b / scale_b) for fp8 a (M, K) and b (K, N); inv_* are 1/scale: scalars, or
    (M, 1) and (1, N) for rowwise. Through torch._scaled_mm (b made column-major, as it requires)
    unless `emulate` or the device refused it once (then fp32 emulation; the reason is kept in
    `_SCALED_MM_REFUSED`, per device, scale kind, dtypes and `mm_aligned`: a refused product with, say, a
    token count that is not a multiple of 16 sends only such products to the emulation, not every later one)."""
    key = (a.device.type, inv_a.numel() > 1, a.dtype, b.dtype, mm_aligned(a.shape, b.shape))
    inv_a, inv_b = inv_a.to(a.device), inv_b.to(a.device)
    if not (emulate or _EMULATE[-1]) and key not in _SCALED_MM_REFUSED and hasattr(torch, "_scaled_mm"):
        a_rm, b_cm = a.contiguous(), b.t().contiguous().t()  # row-major a, column-major b
        try:
            out = torch._scaled_mm(a_rm, b_cm, scale_a=inv_a, scale_b=inv_b, out_dtype=out_dtype,
                                   use_fast_accum=fast_accum)
            return out[0] if isinstance(out, tuple) else out  # torch 2.4 returned (out, amax)
        except (RuntimeError, NotImplementedError) as err:
            _SCALED_MM_REFUSED[key] = _first_sentence(err)
    return _emulated_mm(a, b, inv_a, inv_b, out_dtype)


def _emulated_blockwise_mm(qa, sa, qb, sb, block, b_rows, out_dtype):
    M, K = qa.shape
    N = qb.shape[0]
    inv_b = expand_scale(1.0 / sb, (b_rows, 1), (N, sb.shape[1]))  # (N, K/block)
    out = torch.zeros(M, N, dtype=torch.float32, device=qa.device)
    for c, k0 in enumerate(range(0, K, block)):
        part = qa[:, k0:k0 + block].float() @ qb[:, k0:k0 + block].float().t()  # (M, N), one chunk
        out += part * (1.0 / sa[:, c:c + 1]) * inv_b[:, c][None, :]
    return out.to(out_dtype)


BLOCKWISE_PATH: dict[tuple, str] = {}  # (device, b_rows) -> "native, scales <layout>" or "emulated: <why>"
_SCALE_LAYOUTS = {"row-major": lambda s: s.contiguous(), "column-major": lambda s: s.t().contiguous().t()}


def _native_blockwise_mm(qa, sa, qb, sb, b_rows, layout):
    F = torch.nn.functional
    rec_b = F.ScalingType.BlockWise128x128 if b_rows == 128 else F.ScalingType.BlockWise1x128
    fix = _SCALE_LAYOUTS[layout]
    return F.scaled_mm(qa.contiguous(), qb.contiguous().t(), fix(sa.reciprocal()), F.ScalingType.BlockWise1x128,
                       fix(sb.reciprocal()), rec_b, output_dtype=torch.bfloat16)


def blockwise_mm(qa: torch.Tensor, sa: torch.Tensor, qb: torch.Tensor, sb: torch.Tensor,
                 block: int = 128, b_rows: int = 128, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """y = A Bᵀ for A (M, K) in 1 x block tiles (scale sa (M, K/block)) and B (N, K) in b_rows x block
    blocks (scale sb (N/b_rows, K/block); b_rows = block for weights, 1 for activations), as
    DeepSeek-V3 computes it: each K-chunk of `block` is multiplied on its own, its partial sum
    dequantised with that chunk's scales and added in fp32 (the "promotion to fp32 every 128 along
    K"). Emulated with one fp32 matmul per chunk; the result is (M, N) in out_dtype.

    On CUDA, torch.nn.functional.scaled_mm's blockwise recipes are tried once per (device, b_rows):
    a layout is kept only if it reproduces the emulation to bf16 rounding (2**-7 of the output's largest
    value); otherwise the emulation is used, and `BLOCKWISE_PATH` says which path ran and why.
    """
    key = (qa.device.type, b_rows)
    native = (qa.is_cuda and block == 128 and not _EMULATE[-1] and hasattr(torch.nn.functional, "scaled_mm")
              and qa.shape[1] % 128 == 0 and not BLOCKWISE_PATH.get(key, "").startswith("emulated"))
    if native and key in BLOCKWISE_PATH:
        return _native_blockwise_mm(qa, sa, qb, sb, b_rows, BLOCKWISE_PATH[key].split()[-1]).to(out_dtype)
    ref = _emulated_blockwise_mm(qa, sa, qb, sb, block, b_rows, out_dtype)
    if native:
        why = "no scale layout matched the emulation"
        for layout in _SCALE_LAYOUTS:
            try:
                y = _native_blockwise_mm(qa, sa, qb, sb, b_rows, layout).float()
            except (RuntimeError, ValueError, NotImplementedError) as err:
                why = str(err).splitlines()[0][:150]
                continue
            if (y - ref.float()).abs().max() <= 2.0 ** -7 * ref.float().abs().max():
                BLOCKWISE_PATH[key] = f"native, scales {layout}"
                return y.to(out_dtype)
        BLOCKWISE_PATH[key] = f"emulated: {why}"
    elif key not in BLOCKWISE_PATH:
        BLOCKWISE_PATH[key] = "emulated: " + ("torch.nn.functional.scaled_mm's blockwise recipes need CUDA"
                                              if not qa.is_cuda else "K is not a multiple of 128, or emulation asked for")
    return ref


# ---------------------------------------------------------------- the layer

def _matmul_fwd(x, w, recipe, scalers):
    """y = x wᵀ for x (M, K), w (N, K) cast per recipe; also the forward's (x, w) scales for backward."""
    if recipe in ("tensorwise", "delayed"):  # one scale per operand: this step's amax, or earlier steps' (delayed)
        (qx, sx), (qw, sw) = ((scalers[0].cast(x), scalers[1].cast(w)) if recipe == "delayed"
                              else (tensorwise(x), tensorwise(w)))
        # the fp8 product accumulates in fp32; the two inverse scales are applied to its output
        return scaled_mm(qx, qw.t(), sx.reciprocal(), sw.reciprocal(), x.dtype, fast_accum=True), (sx, sw)
    if recipe == "rowwise":  # per row of x, per output row of w; torchao's rowwise kernel returns bf16
        (qx, sx), (qwt, sw) = rowwise(x, -1), rowwise(w.t(), 0)
        return scaled_mm(qx, qwt, sx.reciprocal(), sw.reciprocal(), torch.bfloat16, fast_accum=True).to(x.dtype), None
    # blockwise (DeepSeek-V3): 1 x 128 tiles of x, 128 x 128 blocks of w, partial sums promoted to fp32 per 128 of K
    (qx, sx), (qw, sw) = blockwise(x, (1, 128)), blockwise(w, (128, 128))
    return blockwise_mm(qx, sx, qw, sw, 128, 128, x.dtype), None


def _rowwise_mm(a, a_dim, b, b_dim, dtype, out_dtype):
    """a @ b with a scaled along a_dim and b along b_dim, torchao's rowwise backward: an unscaled fp8
    product in bf16, then multiplied by both inverse scales (an fp32 (M, N) factor) in bf16."""
    (qa, sa), (qb, sb) = rowwise(a, a_dim, dtype), rowwise(b, b_dim, dtype)
    one = torch.ones((), device=a.device)
    out = scaled_mm(qa, qb, one, one, torch.bfloat16)
    out *= sa.reciprocal() * sb.reciprocal()
    return out.to(out_dtype)


def _matmul_bwd(x, w, dy, recipe, scalers, fwd_scales):
    """(dx, dw) = (dy w, dyᵀ x) for dy (M, N), with dy cast per recipe (e5m2 for tensorwise/delayed)."""
    if recipe in ("tensorwise", "delayed"):
        if recipe == "delayed":
            (qg, sg), (sx, sw) = scalers[2].cast(dy), fwd_scales
            qx, qw = cast(x.float() * sx), cast(w.float() * sw)
        else:
            (qg, sg), (qx, sx), (qw, sw) = tensorwise(dy, E5M2), tensorwise(x), tensorwise(w)
        inv_g = sg.reciprocal()
        dx = scaled_mm(qg, qw, inv_g, sw.reciprocal(), x.dtype)
        dw = scaled_mm(qg.t(), qx, inv_g, sx.reciprocal(), x.dtype)
        return dx, dw
    if recipe == "rowwise":  # e4m3 for the gradient too; scales along each product's outer dims
        return _rowwise_mm(dy, -1, w, 0, E4M3, x.dtype), _rowwise_mm(dy.t(), -1, x, 0, E4M3, x.dtype)
    qg, sg = blockwise(dy, (1, 128))
    qwt, swt = blockwise(w.t(), (128, 128))
    dx = blockwise_mm(qg, sg, qwt, swt, 128, 128, x.dtype)  # (M, K): contraction over N
    qgt, sgt = blockwise(dy.t(), (1, 128))  # 128 x 1 tiles of dy: contraction over tokens
    qxt, sxt = blockwise(x.t(), (1, 128))
    return dx, blockwise_mm(qgt, sgt, qxt, sxt, 128, 1, x.dtype)


class Float8Matmul(torch.autograd.Function):
    """y = x Wᵀ with both operands in fp8 per `recipe`; backward dX = dY W and dW = dYᵀ X in fp8.

    x (M, K) and W (N, K) are kept in high precision for backward (casts are recomputed there, as
    torchao does), except that "delayed" reuses its forward scales.
    """

    @staticmethod
    def forward(ctx, x, w, recipe, scalers):
        y, fwd_scales = _matmul_fwd(x, w, recipe, scalers)  # x and w cast to fp8, one fp8 product
        ctx.save_for_backward(x, w)  # the high-precision operands, not their fp8 casts
        ctx.recipe, ctx.scalers, ctx.fwd_scales = recipe, scalers, fwd_scales
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        # dY is cast too, then two fp8 products: dX = dY W and dW = dYᵀ X
        dx, dw = _matmul_bwd(x, w, dy.contiguous(), ctx.recipe, ctx.scalers, ctx.fwd_scales)
        return dx, dw, None, None  # recipe and scalers get no gradient


class Float8Linear(nn.Linear):
    """nn.Linear computing y = x Wᵀ + b through `Float8Matmul`; x (..., in_features) -> (..., out_features).

    recipe: one of RECIPES; "delayed" keeps a `DelayedScaler` for x, W (e4m3) and dY (e5m2) with
    `history_len`. The bias is added in high precision after the product. `matmul` is the autograd Function
    the layer applies (Float8Matmul; an instance may be given an identical twin, as notebook 07's own cell).
    """

    matmul = Float8Matmul

    def __init__(self, in_features: int, out_features: int, bias: bool = True, recipe: str = "tensorwise",
                 history_len: int = 16, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        if recipe not in RECIPES:
            raise ValueError(f"recipe={recipe!r}; choose one of {', '.join(map(repr, RECIPES))}")
        self.recipe = recipe
        self.scalers = ((DelayedScaler(history_len), DelayedScaler(history_len), DelayedScaler(history_len, dtype=E5M2))
                        if recipe == "delayed" else None)

    @classmethod
    def from_linear(cls, lin: nn.Linear, recipe: str, history_len: int = 16) -> "Float8Linear":
        """A Float8Linear sharing `lin`'s weight and bias (the same Parameter objects)."""
        new = cls(lin.in_features, lin.out_features, bias=lin.bias is not None, recipe=recipe,
                  history_len=history_len, device="meta")
        new.weight, new.bias = lin.weight, lin.bias
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        if torch.is_autocast_enabled(device):  # as F.linear under autocast (and torchao): the input is
            x = x.to(torch.get_autocast_dtype(device))  # cast to the autocast dtype, so y comes out in it
        with torch.autocast(device, enabled=False):  # the recipe's own arithmetic, untouched by autocast
            y = self.matmul.apply(x.reshape(-1, x.shape[-1]), self.weight, self.recipe, self.scalers)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y + self.bias.to(y.dtype) if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe}"


def convert_to_float8(model: nn.Module, recipe: str, module_filter: Callable[[nn.Module, str], bool] | None = None,
                      history_len: int = 16, skip: tuple[str, ...] = ("lm_head",)) -> dict[str, object]:
    """Swap the nn.Linear layers of `model` for Float8Linear in place; return what was done.

    Skipped, with the reason: names in `skip` (the LM head: the logits' precision matters most and
    the course GPT ties it to the embedding), layers whose in or out features are not multiples of
    16 (what fp8 matmul kernels require), and layers `module_filter(module, name)` refuses.
    Returns {"converted": [names], "skipped": {name: reason}}.
    """
    if recipe not in RECIPES:
        raise ValueError(f"recipe={recipe!r}; choose one of {', '.join(map(repr, RECIPES))}")
    converted, skipped = [], {}
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is not nn.Linear:
                continue
            if child_name in skip or full in skip:
                skipped[full] = "LM head"
            elif child.in_features % 16 or child.out_features % 16:
                skipped[full] = f"{child.in_features}x{child.out_features} not multiples of 16"
            elif module_filter is not None and not module_filter(child, full):
                skipped[full] = "refused by module_filter"
            else:
                setattr(module, child_name, Float8Linear.from_linear(child, recipe, history_len))
                converted.append(full)
    return {"converted": converted, "skipped": skipped}


# ---------------------------------------------------------------- torchao, quietly

def import_torchao():
    """torchao.float8, imported with its import-time noise silenced (logged warnings about optional
    CUDA extensions, deprecation warnings); returns (module, None) or (None, reason)."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            import torchao.float8 as ao_float8  # heavy and noisy: imported here, with its warnings silenced
        return ao_float8, None
    except Exception as err:  # ImportError, or a torch/torchao version mismatch raising at import
        return None, f"torchao could not be imported ({type(err).__name__}: {str(err).splitlines()[0][:120]})"
    finally:
        logging.disable(previous)


TORCHAO_RECIPES = ("tensorwise", "rowwise")  # the torchao recipes this course compares against
_TORCHAO_PROBLEMS: dict[tuple[str, str], str | None] = {}


def torchao_problem(recipe: str, device: str | torch.device = "cpu") -> str | None:
    """None when torchao's float8 training with `recipe` runs here; else one sentence saying why not.

    The probe: a tiny fp32 linear (32 -> 32, bias, 16 tokens) converted by torchao with `recipe`, one
    forward and backward on `device`; its outcome is cached per (recipe, device type). Catches, for
    example, torch 2.11 on a CPU, whose torch._scaled_mm accepts only per-tensor scales, so that
    torchao's rowwise recipe raises there while its tensorwise recipe runs.
    Raises ValueError for a recipe outside TORCHAO_RECIPES.
    """
    if recipe not in TORCHAO_RECIPES:
        raise ValueError(f"recipe={recipe!r}; choose one of {', '.join(map(repr, TORCHAO_RECIPES))}")
    dev = torch.device(device)
    key = (recipe, dev.type)
    if key not in _TORCHAO_PROBLEMS:
        ao, why = import_torchao()
        if ao is None:
            _TORCHAO_PROBLEMS[key] = why.rstrip(".") + "."
        else:
            try:
                with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
                    torch.manual_seed(0)
                    lin = torchao_convert(nn.Sequential(nn.Linear(32, 32, device=dev)), recipe)
                    x = torch.randn(16, 32, device=dev, requires_grad=True)
                    lin(x).sum().backward()
                _TORCHAO_PROBLEMS[key] = None
            except Exception as err:  # noqa: BLE001: any failure means "cannot compare here", said once
                _TORCHAO_PROBLEMS[key] = (f"torchao's {recipe} recipe does not run on {dev.type} with torch "
                                          f"{torch.__version__}, which raises {type(err).__name__}: {_first_sentence(err)}")
    return _TORCHAO_PROBLEMS[key]


def torchao_convert(model: nn.Module, recipe: str, skip: tuple[str, ...] = ("lm_head",),
                    emulate: bool = False) -> nn.Module:
    """torchao's convert_to_float8_training on `model` in place with its named recipe and our skips.

    emulate=True sets torchao's own `emulate` option: each fp8 product runs as an fp32 matmul of the
    same fp8 values and scales (what `emulated()` does for ours), not torch._scaled_mm.
    Raises RuntimeError saying why when torchao cannot be imported."""
    ao, why = import_torchao()
    if ao is None:
        raise RuntimeError(why)
    config = ao.Float8LinearConfig.from_recipe_name(recipe)
    if emulate:
        config = dataclasses.replace(config, emulate=True)
    keep = lambda mod, fqn: fqn.split(".")[-1] not in skip and fqn not in skip  # noqa: E731
    return ao.convert_to_float8_training(model, config=config, module_filter_fn=keep)
