"""How a learner's output is compared with the reference's, in words that never reveal the reference.

* `dtype_name`: torch's name of a dtype without "torch.";
* `how_far`: how far a wrong number is from the expected one, in words (a band, or an exact power of two);
* `describe`: a case's argument in a few words (a tensor's shape and dtype, a list's length, a function's name);
* `compare`: None when an output matches the expected one (tensors, numbers, and tuples, lists or dicts of
  them, at a stated tolerance, with the dtypes and counts the task states), else the sentence saying how it
  differs: which item, shape, dtype or count, and the largest difference, without printing the answer.

`helpers.course.check` calls these for every code exercise.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Sequence


def dtype_name(dtype: Any) -> str:
    """torch's name of a dtype without "torch." (e.g. "float8_e4m3fn")."""
    return str(dtype).replace("torch.", "")


def _power_of_two(factor: float) -> bool:
    """Whether factor (>= 1) is 2**k for a whole k >= 1, to fp64 rounding of the two numbers' quotient."""
    k = math.log2(factor)
    return round(k) >= 1 and abs(k - round(k)) < 1e-9


def how_far(given: float, expected: float, rtol: float | None = None) -> str:
    """Say how far `given` is from `expected` in a band of words, without revealing `expected`. With `rtol`
    (the exercise's relative tolerance), a close miss also says the precision the answer needs."""
    if expected == 0:
        return "too high" if given > 0 else "too low"
    if given == 0:
        return "zero is not the answer"
    if (given > 0) != (expected > 0):
        return "the sign is wrong"
    ratio = given / expected
    word = "too high" if ratio > 1 else "too low"
    factor = max(ratio, 1 / ratio)
    if factor < 1.1:
        precision = f": give it to within {100 * rtol:.2g}% (relative), more digits than you gave" if rtol else ""
        return f"close, but {word} by less than 10%{precision}"
    if _power_of_two(factor) and not (isinstance(given, int) and isinstance(expected, int)):  # counts have no exponent
        return (f"{word} by an exact power of two (a factor 2^k for a whole k): check each exponent, and the "
                "sign of each exponent")
    if factor < 1.5:
        return f"{word} by 10% to 50%"
    if factor < 2.5:
        return f"{word} by a factor of 1.5 to 2.5"
    if factor < 10:
        return f"{word} by a factor between 2.5 and 10"
    return f"{word} by a factor of about 10^{round(math.log10(factor))}: check the units and powers of ten"


def describe(value: Any) -> str:
    """A short description of a case's argument: shape and dtype of a tensor, else its repr."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"tensor{tuple(value.shape)} {str(value.dtype).replace('torch.', '')}"
    if isinstance(value, (list, tuple)) and len(value) > 4:
        return f"{type(value).__name__} of {len(value)}"
    if isinstance(value, (list, tuple)):
        return f"({', '.join(describe(v) for v in value)})" if isinstance(value, tuple) else \
            f"[{', '.join(describe(v) for v in value)}]"
    if callable(value):
        return getattr(value, "__name__", "a function")
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def compare(got: Any, want: Any, rtol: float, atol: float, names: Sequence[str] = (),
            dtypes: Iterable[Any] = (), stated: Iterable[str] = ()) -> str | None:
    """None when `got` matches `want` (tensors, numbers, and tuples/lists/dicts of them), else why not.

    `names` name the items of a returned tuple in the message ("new_scale: ..." rather than "item 1").
    `stated`: names of whole-number items whose expected value the task itself states (a count such as
    "graphs", where the lesson is "it must be 1"): a mismatch there says "2 graphs; it must be 1".
    `dtypes` (torch dtypes or their names): where `want` is a tensor of one of them, `got` must have the
    same dtype ("expected dtype int8, got float32"). A meta tensor (no values) or a sparse one is refused
    with a sentence, never compared.
    """
    import torch  # heavy: value and choice exercises, and the registry itself, need no torch

    dtypes = frozenset(dtype_name(d) for d in dtypes)
    if isinstance(want, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(want):
            return f"expected a {type(want).__name__} of {len(want)} values, got {describe(got)}"
        stated = frozenset(stated)
        for i, (g, w) in enumerate(zip(got, want)):
            name = names[i] if i < len(names) else None
            if name in stated and isinstance(w, int) and not isinstance(w, bool):
                if g != w:
                    return f"{describe(g)} {name}; it must be {w}"
                continue
            why = compare(g, w, rtol, atol, dtypes=dtypes)
            if why:
                return f"{names[i] if i < len(names) else f'item {i}'}: {why}"
        return None
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return f"expected a dict with keys {sorted(want)}, got {describe(got)}"
        for key in want:
            why = compare(got[key], want[key], rtol, atol, dtypes=dtypes)
            if why:
                return f"[{key!r}]: {why}"
        return None
    if isinstance(want, str) or isinstance(want, bool) or want is None:
        return None if got == want else f"got {describe(got)}, which is not what a correct version returns here"
    if isinstance(want, torch.Tensor) and not isinstance(got, torch.Tensor):
        return f"expected a tensor of shape {tuple(want.shape)}, got {describe(got)}"
    if isinstance(got, torch.Tensor):
        if got.is_meta:
            return (f"got a meta tensor of shape {tuple(got.shape)}, which has no values (it was made with "
                    f"device='meta'); return a tensor on the CPU or the GPU")
        if got.layout != torch.strided:
            return (f"got a tensor of layout {str(got.layout).replace('torch.', '')}; return an ordinary dense "
                    f"tensor (call .to_dense() on it)")
        if isinstance(want, torch.Tensor) and dtype_name(want.dtype) in dtypes and got.dtype != want.dtype:
            return f"expected dtype {dtype_name(want.dtype)}, got {dtype_name(got.dtype)}"
    counts = _integral(got) and _integral(want)
    try:
        g = torch.as_tensor(got, dtype=torch.float64) if not isinstance(got, torch.Tensor) else got.double()
    except (TypeError, ValueError, RuntimeError):
        return f"expected a number, got {describe(got)}"
    w = torch.as_tensor(want, dtype=torch.float64) if not isinstance(want, torch.Tensor) else want.double()
    if g.shape != w.shape:
        return f"shape {tuple(g.shape)}, expected {tuple(w.shape)}"
    g, w = g.cpu(), w.cpu()
    try:
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError:
        return _difference(g, w, rtol, atol, counts)
    return None


def _integral(x: Any) -> bool:
    """Whether x is a Python int or an integer tensor (not a float that happens to be whole)."""
    import torch  # heavy: as in compare

    if isinstance(x, torch.Tensor):
        return not (x.is_floating_point() or x.is_complex())
    return isinstance(x, int) and not isinstance(x, bool)


def _difference(got, want, rtol: float, atol: float, counts: bool = False) -> str:
    """How `got` differs from `want`, without printing `want` (that would be the answer); `counts`: both were
    whole numbers before the comparison made them float64."""
    import torch  # heavy: as in compare

    if got.numel() == 1:
        g, w = float(got.reshape(())), float(want.reshape(()))
        if not (torch.isfinite(got).all() and torch.isfinite(want).all()):
            return f"got {g}, which is not what a correct version gives here (infinities and NaNs must match)"
        if counts:  # whole numbers (a count, a size): said as ints, and no talk of exponents
            g, w = int(g), int(w)
        return f"got {g:.6g}: {how_far(g, w)}"
    same_nan = torch.isnan(got) & torch.isnan(want)
    close = torch.isclose(got, want, rtol=rtol, atol=atol) | same_nan
    bad = (~close).nonzero()
    first = tuple(bad[0].tolist())
    nonfinite = ~(torch.isfinite(got) & torch.isfinite(want)) & ~close
    text = f"{len(bad)} of {got.numel()} values differ (tolerance rtol={rtol:g}, atol={atol:g}); the first at index {first}"
    if nonfinite.any():
        where = tuple(nonfinite.nonzero()[0].tolist())
        g = float(got[where])
        phrase = (f"you have {g}, an infinity or NaN that a correct version does not give there"
                  if not math.isfinite(g) else f"you have {g}, where a correct version gives an infinity or NaN")
        count = int(nonfinite.sum())
        at = f", where {phrase}" if where == first else \
            f" (yours there: {float(got[first]):.6g}); at index {where} {phrase}"
        return text + at + (f" ({count} such entries)" if count > 1 else "")
    text += f" (yours there: {float(got[first]):.6g})"  # the learner's own value, never the expected one
    diff = (got - want).abs()[~close]
    nonzero = want.abs()[~close] != 0  # a relative difference means nothing where the right value is 0
    rel = f", largest relative {float((diff[nonzero] / want.abs()[~close][nonzero]).max()):.3g}" if nonzero.any() else ""
    return text + f"; largest absolute difference {float(diff.max()):.3g}{rel}"
