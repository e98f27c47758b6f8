"""Number formats, rounding, the hand-written loss scaler against torch.amp.GradScaler, master weights."""
import math

import matplotlib.pyplot as plt
import pytest
import torch

from helpers.measure import bench
from helpers.training import mixed_precision as MP
from helpers.training import precision as P
from helpers.gpt.model import GPT, GPTConfig


# ---------------------------------------------------------------- formats

@pytest.mark.parametrize("name", [n for n in P.FORMATS if n != "tf32"])
def test_facts_match_torch_finfo(name):
    f, fi = P.facts(name), torch.finfo(P.TORCH_DTYPES[name])
    assert (f.bits, f.max, f.smallest_normal, f.eps) == (fi.bits, fi.max, fi.smallest_normal, fi.eps)
    assert f.sign_bits + f.exponent_bits + f.mantissa_bits == fi.bits
    assert f.smallest_subnormal == fi.smallest_normal * fi.eps
    # the smallest subnormal and the max really are values of the format, and the next ones are not
    for value in (f.smallest_subnormal, f.max):
        assert torch.tensor(value).to(P.TORCH_DTYPES[name]).float().item() == value
    assert torch.tensor(f.smallest_subnormal / 2).to(P.TORCH_DTYPES[name]).float().item() == 0.0


def test_known_layouts():
    layout = {n: (P.facts(n).exponent_bits, P.facts(n).mantissa_bits) for n in P.FORMATS}
    assert layout == {"fp32": (8, 23), "tf32": (8, 10), "fp16": (5, 10), "bf16": (8, 7),
                      "fp8-e4m3fn": (4, 3), "fp8-e5m2": (5, 2)}
    assert P.facts("fp8-e4m3fn").max == 448 and P.facts("fp8-e5m2").max == 57344  # OCP FP8 spec
    tf32 = P.facts("tf32")
    assert tf32.bits == 19 and tf32.eps == 2**-10 and tf32.smallest_normal == torch.finfo(torch.float32).tiny
    assert tf32.max == (2 - 2**-10) * 2.0**127 and tf32.smallest_subnormal == 2.0**-136
    with pytest.raises(ValueError, match="fp64"):
        P.facts("fp64")


def _spread(n=20000, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-150, 128, (n,), generator=g).float())
    edges = [0.0, -0.0, 2.0**-25, 2.0**-24, 65504.0, 65519.9, 65520.0, 448.0, 464.0, 464.1, 3.0e38, -3.4e38]
    return torch.cat([x, torch.tensor(edges)])


@pytest.mark.parametrize("name", P.FORMATS)
def test_rounding_is_idempotent_and_monotone(name):
    x = _spread()
    r = P.round_to(x, name)
    assert r.dtype == torch.float32 and not torch.isnan(r).any()
    torch.testing.assert_close(P.round_to(r, name), r, rtol=0, atol=0)
    xs, _ = torch.sort(x)
    rs = P.round_to(xs, name)
    assert (rs[1:] >= rs[:-1]).all()  # inf - inf is NaN, so compare neighbours rather than diff()
    f = P.facts(name)
    finite = r[torch.isfinite(r)]
    assert finite.abs().max() <= f.max
    nonzero = finite[finite != 0].abs()
    assert nonzero.min() >= f.smallest_subnormal
    ok = torch.isfinite(r) & (x.abs() >= f.smallest_normal)  # normal range: relative error at most eps/2
    assert (((r - x) / x)[ok].abs() <= f.eps / 2).all()


@pytest.mark.parametrize("name", [n for n in P.FORMATS if n != "fp32"])
def test_where_values_become_zero_or_inf(name):
    f = P.facts(name)
    below, at, above = f.underflow_threshold * 0.99, f.underflow_threshold, f.underflow_threshold * 1.01
    r = P.round_to(torch.tensor([below, at, above, -above]), name)
    assert r.tolist() == [0.0, 0.0, f.smallest_subnormal, -f.smallest_subnormal]
    thr = f.overflow_threshold
    r = P.round_to(torch.tensor([f.max, thr * (1 - 1e-6), thr, thr * 1.01, -thr * 1.01, math.inf, math.nan]), name)
    assert r[:2].tolist() == [f.max, f.max]
    assert r[2].item() == (math.inf if f.overflow_at_threshold else f.max)
    assert r[3].item() == math.inf and r[4].item() == -math.inf and r[5].item() == math.inf and math.isnan(r[6])


def test_round_mantissa_reproduces_bf16_and_fp32():
    x = _spread(200000, seed=1)
    torch.testing.assert_close(P.round_mantissa(x, 7), x.bfloat16().float(), rtol=0, atol=0)  # bf16 = 7 bits
    torch.testing.assert_close(P.round_mantissa(x, 23), x, rtol=0, atol=0)
    one = torch.tensor([1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-11 + 2**-20])  # ties go to even
    assert (P.round_to(one, "tf32") - 1).tolist() == [0.0, 2**-9, 2**-10]


def test_classify_counts_fractions():
    x = torch.tensor([1e-9, 1e-6, 1.0, 1e6, 0.0, math.inf])  # zeros and inf are left out
    c = P.classify(x, "fp16")
    assert c == {"underflow": 0.25, "subnormal": 0.25, "normal": 0.25, "overflow": 0.25, "n": 4}
    assert P.classify(x, "bf16")["normal"] == 1.0


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
    ours = _trajectory(P.DynamicLossScaler(**kwargs), seq, explicit_unscale=explicit_unscale)
    ref = _trajectory(torch.amp.GradScaler("cpu", **kwargs), seq, explicit_unscale=explicit_unscale)
    assert ours[0] == ref[0], "scale after every update"
    assert ours[1] == ref[1] and sum(ours[1]) == len(BAD), "skipped steps"
    for a, b in zip(ours[2], ref[2]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # identical bits: same 1/scale, same skips


def test_scaler_growth_tracker_and_two_optimizers():
    seq = _grads_with_infs(12, {5: math.inf})
    ours = _trajectory(P.DynamicLossScaler(growth_interval=2), seq, n_opt=2)
    ref = _trajectory(torch.amp.GradScaler("cpu", growth_interval=2), seq, n_opt=2)
    assert ours[:2] == ref[:2]
    # grows every 2 clean steps (steps 1, 3), backs off at 5, and the counter restarts from there
    assert ours[0][:8] == [2.0**16, 2.0**17, 2.0**17, 2.0**18, 2.0**18, 2.0**17, 2.0**17, 2.0**18]


def test_scaler_does_not_grow_past_fp32_and_state_dict_round_trips():
    seq = _grads_with_infs(4, {})
    ours = P.DynamicLossScaler(init_scale=2.0**126, growth_interval=1)
    ref = torch.amp.GradScaler("cpu", init_scale=2.0**126, growth_interval=1)
    a, b = _trajectory(ours, seq), _trajectory(ref, seq)
    assert a[0] == b[0] == [2.0**127] * 4  # 2**128 is inf in fp32, so the growth is dropped
    state = ours.state_dict()
    assert state == ref.state_dict()
    fresh = P.DynamicLossScaler()
    fresh.load_state_dict(ref.state_dict())
    assert fresh.get_scale() == 2.0**127 and fresh.state_dict() == state


def test_scaler_scale_and_errors():
    s = P.DynamicLossScaler(init_scale=4.0)
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
        P.DynamicLossScaler(growth_factor=1.0)
    off = P.DynamicLossScaler(enabled=False)
    assert off.get_scale() == 1.0 and off.scale(loss16) is loss16


# ---------------------------------------------------------------- master weights and training variants

def test_small_update_vanishes_in_bf16_and_survives_in_fp32_master():
    w = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    master = P.MasterWeights(torch.nn.ParameterList([w]))
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


def _tiny_model():
    torch.manual_seed(0)
    return GPT(GPTConfig.preset("tiny", n_layer=1, seq_len=16))


def test_training_variants_step_and_memory():
    base = _tiny_model()
    x, y = torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))
    results = {}
    for name in MP.VARIANTS:
        run = MP.make_run(name, base, lr=1e-3, device="cpu", growth_interval=2)
        results[name] = [run.step(x, y) for _ in range(3)]
        assert all(math.isfinite(r["loss"]) for r in results[name])
        if run.scaler:
            assert [r["scale"] for r in results[name]] == [2.0**16, 2.0**16, 2.0**17]
    assert [r["loss"] for r in results["fp16 + our scaler"]] == [r["loss"] for r in results["fp16 + GradScaler"]]
    n = sum(p.numel() for p in base.parameters())
    fp32 = MP.memory_breakdown(MP.make_run("fp32", base, lr=1e-3, device="cpu"), x, y)
    assert fp32["weights"] == fp32["grads"] == 4 * n and fp32["optimizer"] >= 8 * n and fp32["weight_copies"] == 0
    bf16 = MP.memory_breakdown(MP.make_run("bf16 autocast", base, lr=1e-3, device="cpu"), x, y)
    assert bf16["weights"] == 4 * n and bf16["weight_copies"] > 0 and bf16["activations"] < fp32["activations"]
    master = MP.memory_breakdown(MP.make_run("bf16 weights + fp32 master", base, lr=1e-3, device="cpu"), x, y)
    assert master["weights"] == 2 * n and master["master"] == 4 * n and master["grads"] == 6 * n
    with pytest.raises(ValueError, match="fp8 training"):
        MP.make_run("fp8 training", base, lr=1e-3, device="cpu")


def test_gradient_samples_and_range_panel(capsys):
    base = _tiny_model()
    x, y = torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))
    samples = MP.gradient_samples(base, x, y)
    assert samples["weight gradients"].numel() == sum(p.numel() for p in base.parameters())
    assert (samples["activation gradients"] >= 0).all()
    fig = P.range_panel("fp16", "activation gradients", 0, samples=samples)
    low = capsys.readouterr().out
    P.range_panel("fp16", "activation gradients", 16, samples=samples)
    high = capsys.readouterr().out
    underflow = lambda text: float(text.split(": ")[1].split("%")[0])  # noqa: E731
    assert underflow(high) <= underflow(low) and "2^16" in high
    assert fig.axes[0].get_title() == "activation gradients × 2^0 in fp16"
    with pytest.raises(ValueError, match="distribution"):
        P.range_panel("fp16", "weights", samples=samples)
    assert len(P.bit_layout_figure().axes[0].patches) == 3 * len(P.FORMATS)
    plt.close("all")


def test_interleaved_timings_and_thin():
    calls = []
    t = bench.benchmark_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                                    reps=3, device="cpu")
    assert calls == ["a", "b"] * 4  # one warm-up round, then three timed rounds, alternating
    assert set(t) == {"a", "b"} and len(t["a"].samples) == 3 and t["a"].q25 <= t["a"].median <= t["a"].q75
    x, y = torch.arange(10.0), torch.arange(30.0)
    thinned = MP.thin([x, y], 10)
    assert thinned.tolist() == [0.0, 4.0, 8.0, 0.0, 4.0, 8.0, 12.0, 16.0, 20.0, 24.0, 28.0]  # every 4th: 40 / 10
    assert MP.thin([x], 100).tolist() == x.tolist()


def test_step_without_gradients_is_refused_like_gradscaler():
    p = torch.nn.Parameter(torch.ones(2))
    for scaler in (P.DynamicLossScaler(), torch.amp.GradScaler("cpu")):
        scaler.scale(torch.tensor(1.0))
        with pytest.raises((RuntimeError, AssertionError), match="No inf checks"):
            scaler.step(torch.optim.SGD([p], lr=1.0))


def test_fp16_model_with_master_weights_and_scaler():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).half()
    master = P.MasterWeights(model)
    opt = torch.optim.SGD(master.params, lr=0.1)
    scaler = P.DynamicLossScaler(init_scale=2.0**10)
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


# ---------------------------------------------------------------- figures: bands from data, overflow shown

def _spans(fig):
    """(label, x0, x1) of every axvspan in the figure's first axes."""
    from matplotlib.patches import Polygon, Rectangle

    out = []
    for patch in fig.axes[0].patches:
        if isinstance(patch, Polygon):  # axvspan draws a polygon (older matplotlib) ...
            xs = patch.get_xy()[:, 0]
            out.append((patch.get_label(), xs.min(), xs.max(), xs[0] <= xs[2]))
        elif isinstance(patch, Rectangle) and patch.get_label() and not patch.get_label().startswith("_"):
            x0, w = patch.get_x(), patch.get_width()  # ... or a rectangle (newer)
            out.append((patch.get_label(), min(x0, x0 + w), max(x0, x0 + w), w >= 0))
    return out


def test_range_panel_draws_no_reversed_band_when_the_data_lies_above_the_underflow_threshold(capsys):
    # the case of issue 11: fp32, values around 1e-4 scaled by 2^-1 lie far above 2^-150
    samples = {"weight gradients": torch.logspace(-6, -2, 1000).float()}
    fig = P.range_panel("fp32", "weight gradients", -1, samples=samples)
    spans = _spans(fig)
    lo, hi = fig.axes[0].get_xlim()
    assert spans == [] or all(ok and lo <= a < b <= hi for _, a, b, ok in spans), spans
    assert "rounds to 0" not in [s[0] for s in spans] and "overflows" not in [s[0] for s in spans]
    out = capsys.readouterr().out
    assert "not drawn: rounds to 0, subnormal, overflows" in out
    assert lo > -30 and hi < 0  # the view follows the data, not fp32's range
    plt.close("all")


def test_range_panel_bands_where_the_data_reaches_them(capsys):
    samples = {"wide": torch.exp2(torch.linspace(-40, 20, 601)).float()}
    fig = P.range_panel("fp16", "wide", 0, samples=samples)
    spans = {label: (a, b) for label, a, b, ok in _spans(fig) if ok}
    assert set(spans) == {"rounds to 0", "subnormal (fewer bits)", "overflows"}
    assert spans["rounds to 0"] == (-41.0, -25.0) and spans["subnormal (fewer bits)"] == (-25.0, -14.0)
    assert spans["overflows"][0] == pytest.approx(16.0, abs=1e-3) and spans["overflows"][1] == 21.0
    assert "not drawn" not in capsys.readouterr().out
    plt.close("all")


def test_visible_span():
    assert P.visible_span(-math.inf, -151.0, (-30.0, 0.0)) is None  # entirely left of the view
    assert P.visible_span(-math.inf, -25.0, (-41.0, 21.0)) == (-41.0, -25.0)
    assert P.visible_span(128.0, math.inf, (-41.0, 21.0)) is None
    assert P.visible_span(-25.0, -14.0, (-20.0, 0.0)) == (-20.0, -14.0)


def test_scaling_is_done_in_fp64_so_overflow_past_fp32_is_counted(capsys):
    samples = {"big": torch.tensor([2.0**100, 2.0**-100])}
    P.range_panel("fp32", "big", 40, samples=samples)  # 2^140 overflows fp32; fp32 arithmetic dropped it as inf
    out = capsys.readouterr().out
    assert "50.00% overflow (n=2)" in out and "50.00% normal" in out
    P.range_panel("fp32", "big", -60, samples=samples)  # 2^-160 underflows fp32 instead of vanishing before counting
    assert "50.00% underflow to 0" in capsys.readouterr().out
    rows = MP.underflow_rows({0: {"g": torch.tensor([2.0**100])}}, 2.0**40)
    assert rows[0][-1] == "100.00%"
    with pytest.raises(ValueError, match="log2_scale"):
        P.range_panel("fp32", "big", 5000, samples=samples)
    plt.close("all")


def test_static_scaling_sweep_and_its_figure_show_the_overflow_edge():
    base = _tiny_model()
    x, y = torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))
    rows = MP.static_scaling_sweep(base, x, y, [0, 8, 60, 90], "cpu")
    assert [r["finite"] for r in rows][:2] == [True, True] and rows[-1]["finite"] is False
    assert rows[-1]["rel_error"] == math.inf and 0 <= rows[0]["zero_fraction"] < 1
    fig = MP.scaling_sweep_figure(rows)
    labels = [c.get_label() for c in fig.axes[0].collections]
    assert "overflow: inf/NaN in the gradients" in labels
    over = next(c for c in fig.axes[0].collections if c.get_label().startswith("overflow"))
    assert sorted(over.get_offsets()[:, 0].tolist()) == [r["log2_scale"] for r in rows if not r["finite"]]
    with pytest.raises(ValueError, match="log2 scale"):
        MP.static_scaling_sweep(base, x, y, [-1], "cpu")
    with pytest.raises(ValueError, match="LOG2_SCALES"):
        MP.check_log2_scales("LOG2_SCALES", [0, 4.0])
    assert MP.check_log2_scales("LOG2_SCALES", (0, 4)) == [0, 4]
    plt.close("all")


def _row(k, lost, finite=True, err=1e-3):
    return {"log2_scale": k, "zero_fraction": lost, "finite": finite, "rel_error": err if finite else math.inf}


def test_scaling_sweep_sentence_names_the_window():
    rows = [_row(0, 0.005, err=3.6e-4), _row(8, 0.0001, err=3.2e-4), _row(16, 0.0, err=3.3e-4),
            _row(20, 0, False), _row(24, 0, False)]
    text = MP.scaling_sweep_sentence(rows)
    assert "finite from 2^0 to 2^16" in text and "between 2^16 and 2^20" in text and "2^20, 2^24" in text
    assert "smallest error was 3.20e-04 at S = 2^8" in text and "within 1.5×" in text
    assert "beyond this sweep" in MP.scaling_sweep_sentence(rows[:3])
    assert "Every scale" in MP.scaling_sweep_sentence([_row(0, 0, False)])
    assert "already overflowed" in MP.scaling_sweep_sentence([_row(0, 0, False), _row(4, 0.1)])


def _summary(**loss):
    names = ["fp32", "fp16 no scaling", "fp16 + our scaler", "fp16 + GradScaler", "bf16 autocast"]
    zero = {"fp32": 1e-5, "fp16 no scaling": 3e-3, "fp16 + our scaler": 0.0, "fp16 + GradScaler": 0.0,
            "bf16 autocast": 0.0}
    skipped = loss.pop("skipped", 0)
    return {n: {"final_loss": loss.get(n.split()[0].replace("+", ""), 4.046), "zero_grad_fraction": zero[n],
                "skipped_steps": skipped if "+" in n else 0} for n in names}


def test_training_sentences_follow_the_numbers():
    same = MP.training_sentences(_summary(), 12)
    assert "300× fp32's" in same[0] and "scaling recovered" in same[0]
    assert "does not show the lost gradients" in same[1] and len(same) == 2
    s = _summary(skipped=1)
    for n in ("fp16 + our scaler", "fp16 + GradScaler"):
        s[n]["final_loss"] = 4.131
    text = MP.training_sentences(s, 12)
    assert "skipped 1 of 12 steps" in text[2] and "skipped updates cost it more than rounding" in text[2]
    s = _summary()
    s["fp16 no scaling"]["final_loss"] = 4.2
    assert "slowed training" in MP.training_sentences(s, 12)[1]
    s = _summary()
    s["fp16 no scaling"]["zero_grad_fraction"] = 1e-5
    assert "recovered" not in MP.training_sentences(s, 12)[0]


def test_compare_scalers_matches_on_the_course_gpt():
    base = _tiny_model()
    batches = [(torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))) for _ in range(3)]
    both = MP.compare_scalers(base, batches, init_scale=2.0**10, growth_interval=2, steps=6,
                              inject={1: math.nan, 2: math.inf}, device="cpu")
    assert both["ours"] == both["torch"] and [k for _, k in both["ours"]] == [False, True, True, False, False,
                                                                            False]
    for a, b in zip(*both["params"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---------------------------------------------------------------- exercise 03.scaler_update against GradScaler

def test_scaler_exercise_cases_cover_the_edges_and_our_scaler_agrees_with_gradscaler():
    from helpers.course.exercises import nb03

    cases = nb03._cases()
    labels = " | ".join(c.label for c in cases)
    assert "growth_interval=1" in labels and "×1.7/×0.3" in labels and "a NaN" in labels and "a -inf" in labels
    assert any(s[4].find("II") >= 0 or s[4].find("NN") >= 0 for s in nb03.SCRIPTS)  # overflows in a row
    grew_after_skip = False
    for case in cases:
        want = nb03.gradscaler_update(*case.args)
        assert nb03.reference_update(*case.args) == pytest.approx(want, rel=1e-6), case.label
        grads, scale, tracker, grow, back, interval = case.args
        ours = P.DynamicLossScaler(scale, growth_factor=grow, backoff_factor=back, growth_interval=interval)
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
    from helpers.course import check
    from helpers.course.exercises import nb03

    check.exercise("03.scaler_update", nb03.reference_update)
    assert capsys.readouterr().out.startswith("PASS")


# ---------------------------------------------------------------- notebook 03's parameters fail fast

def _validate_nb03(tmp_path, **parameters):
    """Run notebook 03's parameters cell and the cell that validates it, with `parameters` injected."""
    from pathlib import Path

    import nbformat

    nb = nbformat.read(Path(__file__).resolve().parent.parent / "notebooks" / "03_mixed_precision.ipynb", as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    ns: dict = {}
    exec(code[0], ns)  # noqa: S102 - the notebook's own cells
    ns.update(PROFILE="smoke", INTERACTIVE=False, RESULTS_DIR=str(tmp_path), **parameters)
    threads = torch.get_num_threads()
    try:
        exec(code[1], ns)  # noqa: S102
    finally:
        torch.set_num_threads(threads)
    return ns


@pytest.mark.parametrize("name, value", [("REPS", 0), ("STEPS", -2), ("GROWTH_INTERVAL", 0), ("INIT_SCALE", 0.0),
                                         ("LR", -1e-3), ("LOG2_SCALES", []), ("LOG2_SCALES", [0, -4]),
                                         ("MODEL", "huge"), ("BATCH", 2.5), ("CPU_THREADS", 0)])
def test_notebook_03_rejects_a_bad_parameter_naming_it(tmp_path, capsys, name, value):
    with pytest.raises(ValueError, match=name):
        _validate_nb03(tmp_path, **{name: value})


def test_notebook_03_defaults_and_an_int_scale(tmp_path, capsys):
    ns = _validate_nb03(tmp_path, INIT_SCALE=65536, GROWTH_INTERVAL=None)
    assert ns["INIT_SCALE"] == 65536.0 and isinstance(ns["INIT_SCALE"], float)
    assert ns["GROWTH_INTERVAL"] == ns["STEPS"] == 12 and ns["LOG2_SCALES"] == [0, 4, 8, 12, 16, 20, 24]
    assert _validate_nb03(tmp_path)["INIT_SCALE"] == 2.0**12


def test_scale_of_a_16_bit_vector_overflows_in_its_own_dtype_like_gradscaler():
    x = torch.full((3,), 30000.0, dtype=torch.float16)
    ours, ref = P.DynamicLossScaler(init_scale=4.0).scale(x), torch.amp.GradScaler("cpu", init_scale=4.0).scale(x)
    assert ours.dtype == ref.dtype == torch.float16 and torch.isinf(ours).all() and torch.isinf(ref).all()
    assert P.DynamicLossScaler(init_scale=4.0).scale(x.float().sum()).item() == 360000.0  # widen, reduce: no overflow
