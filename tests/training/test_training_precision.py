"""helpers.training.precision: number formats, rounding, the hand-written loss scaler against
torch.amp.GradScaler, master weights, and exercise 03.scaler_update against GradScaler."""
import math
import re

import pytest
import torch

from helpers.course import check
from helpers.course.exercises import nb03
from helpers.training import precision


# ---------------------------------------------------------------- formats

@pytest.mark.parametrize("name", [n for n in precision.FORMATS if n != "tf32"])
def test_facts_match_torch_finfo(name):
    f, fi = precision.facts(name), torch.finfo(precision.TORCH_DTYPES[name])
    assert (f.bits, f.max, f.smallest_normal, f.eps) == (fi.bits, fi.max, fi.smallest_normal, fi.eps)
    assert f.sign_bits + f.exponent_bits + f.mantissa_bits == fi.bits
    assert f.smallest_subnormal == fi.smallest_normal * fi.eps
    # the smallest subnormal and the max really are values of the format, and the next ones are not
    for value in (f.smallest_subnormal, f.max):
        assert torch.tensor(value).to(precision.TORCH_DTYPES[name]).float().item() == value
    assert torch.tensor(f.smallest_subnormal / 2).to(precision.TORCH_DTYPES[name]).float().item() == 0.0


def test_known_layouts():
    layout = {n: (precision.facts(n).exponent_bits, precision.facts(n).mantissa_bits) for n in precision.FORMATS}
    assert layout == {"fp32": (8, 23), "tf32": (8, 10), "fp16": (5, 10), "bf16": (8, 7),
                      "fp8-e4m3fn": (4, 3), "fp8-e5m2": (5, 2)}
    assert precision.facts("fp8-e4m3fn").max == 448 and precision.facts("fp8-e5m2").max == 57344  # OCP FP8 spec
    tf32 = precision.facts("tf32")
    assert tf32.bits == 19 and tf32.eps == 2**-10 and tf32.smallest_normal == torch.finfo(torch.float32).tiny
    assert tf32.max == (2 - 2**-10) * 2.0**127 and tf32.smallest_subnormal == 2.0**-136
    with pytest.raises(ValueError, match="fp64"):
        precision.facts("fp64")


def _spread(n=20000, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-150, 128, (n,), generator=g).float())
    edges = [0.0, -0.0, 2.0**-25, 2.0**-24, 65504.0, 65519.9, 65520.0, 448.0, 464.0, 464.1, 3.0e38, -3.4e38]
    return torch.cat([x, torch.tensor(edges)])


@pytest.mark.parametrize("name", precision.FORMATS)
def test_rounding_is_idempotent_and_monotone(name):
    x = _spread()
    r = precision.round_to(x, name)
    assert r.dtype == torch.float32 and not torch.isnan(r).any()
    torch.testing.assert_close(precision.round_to(r, name), r, rtol=0, atol=0)
    xs, _ = torch.sort(x)
    rs = precision.round_to(xs, name)
    assert (rs[1:] >= rs[:-1]).all()  # inf - inf is NaN, so compare neighbours rather than diff()
    f = precision.facts(name)
    finite = r[torch.isfinite(r)]
    assert finite.abs().max() <= f.max
    nonzero = finite[finite != 0].abs()
    assert nonzero.min() >= f.smallest_subnormal
    ok = torch.isfinite(r) & (x.abs() >= f.smallest_normal)  # normal range: relative error at most eps/2
    assert (((r - x) / x)[ok].abs() <= f.eps / 2).all()


@pytest.mark.parametrize("name", [n for n in precision.FORMATS if n != "fp32"])
def test_where_values_become_zero_or_inf(name):
    f = precision.facts(name)
    below, at, above = f.underflow_threshold * 0.99, f.underflow_threshold, f.underflow_threshold * 1.01
    r = precision.round_to(torch.tensor([below, at, above, -above]), name)
    assert r.tolist() == [0.0, 0.0, f.smallest_subnormal, -f.smallest_subnormal]
    thr = f.overflow_threshold
    r = precision.round_to(torch.tensor([f.max, thr * (1 - 1e-6), thr, thr * 1.01, -thr * 1.01, math.inf, math.nan]), name)
    assert r[:2].tolist() == [f.max, f.max]
    assert r[2].item() == (math.inf if f.overflow_at_threshold else f.max)
    assert r[3].item() == math.inf and r[4].item() == -math.inf and r[5].item() == math.inf and math.isnan(r[6])


def test_round_mantissa_reproduces_bf16_and_fp32():
    x = _spread(200000, seed=1)
    torch.testing.assert_close(precision.round_mantissa(x, 7), x.bfloat16().float(), rtol=0, atol=0)  # bf16 = 7 bits
    torch.testing.assert_close(precision.round_mantissa(x, 23), x, rtol=0, atol=0)
    one = torch.tensor([1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-11 + 2**-20])  # ties go to even
    assert (precision.round_to(one, "tf32") - 1).tolist() == [0.0, 2**-9, 2**-10]


def test_classify_counts_fractions():
    x = torch.tensor([1e-9, 1e-6, 1.0, 1e6, 0.0, math.inf])  # zeros and inf are left out
    c = precision.classify(x, "fp16")
    assert c == {"underflow": 0.25, "subnormal": 0.25, "normal": 0.25, "overflow": 0.25, "n": 4}
    assert precision.classify(x, "bf16")["normal"] == 1.0


# ---------------------------------------------------------------- loss scaler against GradScaler

def _trajectory(scaler, grads_seq, *, explicit_unscale=False, n_opt=1):
    """Feed recorded (scaled) gradients to a scaler; return scales, skips and the final parameters."""
    torch.manual_seed(0)
    params = [[torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(4))] for _ in range(n_opt)]
    opts = [torch.optim.SGD(ps, lr=0.1) for ps in params]
    scales, skipped = [], []
    for grads in grads_seq:
        before = scaler.get_scale()
        for ps in params:
            for p, g in zip(ps, grads):
                p.grad = scaler.scale(g.clone())  # what backward of scale(loss) would have produced
        if explicit_unscale:
            scaler.unscale_(opts[0])
        for opt in opts:
            scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        skipped.append(scaler.get_scale() < before)
    return scales, skipped, [p.detach().clone() for ps in params for p in ps]


def _grads_with_infs(steps, bad):
    g = torch.Generator().manual_seed(0)
    seq = []
    for i in range(steps):
        grads = [torch.randn(5, 3, generator=g) * 1e-3, torch.randn(4, generator=g) * 1e-3]
        if i in bad:
            grads[i % 2].view(-1)[i % 4] = bad[i]
        seq.append(grads)
    return seq


BAD = {2: math.inf, 3: math.nan, 9: -math.inf, 17: math.nan, 18: math.inf, 30: math.nan}


@pytest.mark.parametrize("kwargs", [dict(growth_interval=3), dict(init_scale=2.0**10, growth_interval=1),
                                    dict(init_scale=1000.0, growth_factor=1.7, backoff_factor=0.3, growth_interval=4)],
                         ids=["interval3", "interval1", "odd-factors"])
@pytest.mark.parametrize("explicit_unscale", [False, True])
def test_scaler_trajectory_equals_gradscaler(kwargs, explicit_unscale):
    seq = _grads_with_infs(40, BAD)
    ours = _trajectory(precision.DynamicLossScaler(**kwargs), seq, explicit_unscale=explicit_unscale)
    ref = _trajectory(torch.amp.GradScaler("cpu", **kwargs), seq, explicit_unscale=explicit_unscale)
    assert ours[0] == ref[0], "scale after every update"
    assert ours[1] == ref[1] and sum(ours[1]) == len(BAD), "skipped steps"
    for a, b in zip(ours[2], ref[2]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # identical bits: same 1/scale, same skips


def test_scaler_growth_tracker_and_two_optimizers():
    seq = _grads_with_infs(12, {5: math.inf})
    ours = _trajectory(precision.DynamicLossScaler(growth_interval=2), seq, n_opt=2)
    ref = _trajectory(torch.amp.GradScaler("cpu", growth_interval=2), seq, n_opt=2)
    assert ours[:2] == ref[:2]
    # grows every 2 clean steps (steps 1, 3), backs off at 5, and the counter restarts from there
    assert ours[0][:8] == [2.0**16, 2.0**17, 2.0**17, 2.0**18, 2.0**18, 2.0**17, 2.0**17, 2.0**18]


def test_scaler_does_not_grow_past_fp32_and_state_dict_round_trips():
    seq = _grads_with_infs(4, {})
    ours = precision.DynamicLossScaler(init_scale=2.0**126, growth_interval=1)
    ref = torch.amp.GradScaler("cpu", init_scale=2.0**126, growth_interval=1)
    a, b = _trajectory(ours, seq), _trajectory(ref, seq)
    assert a[0] == b[0] == [2.0**127] * 4  # 2**128 is inf in fp32, so the growth is dropped
    state = ours.state_dict()
    assert state == ref.state_dict()
    fresh = precision.DynamicLossScaler()
    fresh.load_state_dict(ref.state_dict())
    assert fresh.get_scale() == 2.0**127 and fresh.state_dict() == state



def test_scaler_loads_what_gradscaler_saves_enabled_or_disabled():
    enabled = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=7)
    disabled = torch.amp.GradScaler("cpu", enabled=False)
    assert disabled.state_dict() == {}  # what a disabled scaler saves
    ours = precision.DynamicLossScaler()
    ours.load_state_dict(enabled.state_dict())
    assert ours.get_scale() == 8.0 and ours.state_dict() == enabled.state_dict()
    off = precision.DynamicLossScaler(enabled=False)
    off.load_state_dict(disabled.state_dict())  # nothing to restore, as in GradScaler
    off.load_state_dict(enabled.state_dict())
    assert off.state_dict() == {} and off.get_scale() == 1.0 and not off.is_enabled()
    with pytest.raises(ValueError, match=r"this state is empty, which is what a disabled scaler saves") as err:
        precision.DynamicLossScaler().load_state_dict(disabled.state_dict())
    assert "\n" not in str(err.value)
    with pytest.raises(RuntimeError, match="empty"):  # GradScaler refuses it too
        torch.amp.GradScaler("cpu").load_state_dict(disabled.state_dict())
    untouched = precision.DynamicLossScaler(init_scale=4.0)
    with pytest.raises(ValueError, match=r"the scaler state lacks 'scale', '_growth_tracker': a state_dict\(\)"):
        untouched.load_state_dict({k: v for k, v in enabled.state_dict().items() if k not in ("scale", "_growth_tracker")})
    assert untouched.get_scale() == 4.0  # a refused state changes nothing


@pytest.mark.parametrize("key, value, words", [
    ("scale", float("inf"), "scale=inf must be a positive finite number"),
    ("scale", "big", "must be numbers"),
    ("growth_factor", 1.0, "growth_factor=1.0 must be > 1"),
    ("growth_interval", 0, "growth_interval=0 must be a positive int"),
    ("_growth_tracker", -1, "_growth_tracker=-1 must be a non-negative int"),
])
def test_scaler_refuses_a_state_with_a_wrong_value(key, value, words):
    state = {**torch.amp.GradScaler("cpu").state_dict(), key: value}
    with pytest.raises(ValueError, match=re.escape(words)):
        precision.DynamicLossScaler().load_state_dict(state)
    with pytest.raises(TypeError, match="must be a dict"):
        precision.DynamicLossScaler().load_state_dict(None)

def test_scaler_scale_and_errors():
    s = precision.DynamicLossScaler(init_scale=4.0)
    loss16 = torch.tensor(30000.0, dtype=torch.float16)
    ref = torch.amp.GradScaler("cpu", init_scale=4.0)
    assert s.scale(loss16).dtype == ref.scale(loss16).dtype == torch.float32  # no fp16 overflow at 120000
    assert [t.item() for t in s.scale([torch.tensor(1.0), torch.tensor(2.0)])] == [4.0, 8.0]
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=1.0)
    p.grad = torch.ones(2)
    s.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        s.unscale_(opt)
    s.step(opt)
    with pytest.raises(RuntimeError, match="step"):
        s.step(opt)
    s.update()
    with pytest.raises(RuntimeError, match="No inf checks"):
        s.update()
    p16 = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    p16.grad = torch.ones(2, dtype=torch.float16)
    with pytest.raises(ValueError, match="FP16"):
        s.unscale_(torch.optim.SGD([p16], lr=1.0))
    with pytest.raises(ValueError, match="growth_factor"):
        precision.DynamicLossScaler(growth_factor=1.0)
    off = precision.DynamicLossScaler(enabled=False)
    assert off.get_scale() == 1.0 and off.scale(loss16) is loss16


def test_step_without_gradients_is_refused_like_gradscaler():
    p = torch.nn.Parameter(torch.ones(2))
    for scaler in (precision.DynamicLossScaler(), torch.amp.GradScaler("cpu")):
        scaler.scale(torch.tensor(1.0))
        with pytest.raises((RuntimeError, AssertionError), match="No inf checks"):
            scaler.step(torch.optim.SGD([p], lr=1.0))


def test_scale_of_a_16_bit_vector_overflows_in_its_own_dtype_like_gradscaler():
    x = torch.full((3,), 30000.0, dtype=torch.float16)
    ours, ref = precision.DynamicLossScaler(init_scale=4.0).scale(x), torch.amp.GradScaler("cpu", init_scale=4.0).scale(x)
    assert ours.dtype == ref.dtype == torch.float16 and torch.isinf(ours).all() and torch.isinf(ref).all()
    assert precision.DynamicLossScaler(init_scale=4.0).scale(x.float().sum()).item() == 360000.0  # widen, reduce: no overflow


# ---------------------------------------------------------------- master weights

def test_small_update_vanishes_in_bf16_and_survives_in_fp32_master():
    w = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    master = precision.MasterWeights(torch.nn.ParameterList([w]))
    opt = torch.optim.SGD(master.params, lr=1.0)
    plain = torch.ones(4, dtype=torch.bfloat16)
    for _ in range(10):
        w.grad = torch.full((4,), -2.0**-10, dtype=torch.bfloat16)  # an update of 0.00098 < eps/2 = 0.0039
        plain -= w.grad  # bf16 += 0.00098: rounds back to 1.0 every time
        master.grads_to_master()
        assert master.params[0].grad.dtype == torch.float32
        opt.step()
        master.master_to_model()
    assert plain.tolist() == [1.0] * 4
    assert master.params[0].tolist() == [1 + 10 * 2.0**-10] * 4  # ten updates kept, exactly, in fp32
    assert w.dtype == torch.bfloat16 and w.float().tolist() == [1.0078125] * 4  # 1.0098 rounded into bf16


def test_fp16_model_with_master_weights_and_scaler():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).half()
    master = precision.MasterWeights(model)
    opt = torch.optim.SGD(master.params, lr=0.1)
    scaler = precision.DynamicLossScaler(init_scale=2.0**10)
    x = torch.randn(8, 4, dtype=torch.float16)
    before = [m.detach().clone() for m in master.params]
    scaler.scale(model(x).float().pow(2).mean()).backward()
    master.grads_to_master()  # fp16 grads widened: the scaler unscales them in fp32
    scaler.step(opt)
    scaler.update()
    master.master_to_model()
    assert all(not torch.equal(m, b) for m, b in zip(master.params, before))
    torch.testing.assert_close(model.weight, master.params[0].detach().half(), rtol=0, atol=0)
    model.weight.grad = torch.full_like(model.weight, math.inf)  # an overflowing step is skipped
    master.grads_to_master()
    kept = [m.detach().clone() for m in master.params]
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0**9 and all(torch.equal(m, k) for m, k in zip(master.params, kept))


# ---------------------------------------------------------------- exercise 03.scaler_update against GradScaler

def test_scaler_exercise_cases_cover_the_edges_and_our_scaler_agrees_with_gradscaler():
    cases = check.get("03.scaler_update").cases()
    labels = " | ".join(c.label for c in cases)
    assert "growth_interval=1" in labels and "×1.7/×0.3" in labels and "a NaN" in labels and "a -inf" in labels
    assert any(s[4].find("II") >= 0 or s[4].find("NN") >= 0 for s in nb03.SCRIPTS)  # overflows in a row
    grew_after_skip = False
    for case in cases:
        want = nb03.gradscaler_update(*case.args)
        assert nb03.reference_update(*case.args) == pytest.approx(want, rel=1e-6), case.label
        grads, scale, tracker, grow, back, interval = case.args
        ours = precision.DynamicLossScaler(scale, growth_factor=grow, backoff_factor=back, growth_interval=interval)
        ours.load_state_dict({**ours.state_dict(), "_growth_tracker": tracker})
        params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt = torch.optim.SGD(params, lr=1.0)
        ours.step(opt)
        ours.update()
        stepped = any(bool(p.detach().ne(0).any()) for p in params)
        assert (stepped, ours.get_scale(), ours.state_dict()["_growth_tracker"]) == want, case.label
        grew_after_skip |= "after a skip" in case.label and want[1] > scale
    assert grew_after_skip


def test_the_course_solution_passes_the_scaler_exercise(capsys):
    check.exercise("03.scaler_update", nb03.reference_update)
    assert capsys.readouterr().out.startswith("PASS")
