"""helpers/fusion/xla.py: the course GPT's forward in JAX against torch's, XLA's fusions read from the optimized HLO,
the one-thread CPU client, and no jax import where it is not asked for."""
import ast
import importlib.util
from pathlib import Path

import pytest
import torch

from helpers.fusion import xla
from helpers.measure import bench
from helpers.gpt.model import GPT, GPTConfig

FUSION = Path(xla.__file__).parent


@pytest.fixture(scope="module")
def started():
    """The CPU client, started by `one_thread` before any other jax call of this file (jax is imported here, not at
    the top, so collecting this file costs no jax import)."""
    pytest.importorskip("jax")
    return xla.one_thread()


def _model(**overrides):
    cfg = GPTConfig.preset("tiny", n_layer=1, seq_len=16, **overrides)
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    tokens = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    return cfg, model, tokens


@pytest.mark.slow  # two XLA compiles, seconds on 2 cores
@pytest.mark.parametrize("overrides", [{}, {"n_kv_head": 2, "tie_embeddings": False, "bias": False}],
                         ids=["tied-mha-bias", "untied-gqa-nobias"])
def test_the_jax_forward_equals_torchs_within_1e_5(started, overrides, capsys):
    import jax

    cfg, model, tokens = _model(**overrides)
    w = xla.weights(model)
    assert ("lm_head.weight" in w) == (not cfg.tie_embeddings)  # a tied head is the token table, kept once
    compiled = xla.compile_forward(xla.jax_gpt_forward, w, xla.tokens_for_jax(tokens), cfg)
    got = torch.from_numpy(jax.device_get(compiled["fn"](w, xla.tokens_for_jax(tokens))).copy())
    with torch.no_grad():
        want = model(tokens)[0]
    assert got.shape == want.shape == (2, 16, cfg.vocab_size)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert compiled["compile_s"] > 0 and "fusion" in compiled["hlo"]
    found = xla.fusions(compiled["hlo"])
    assert isinstance(len(found), int) and len(found) > 0
    assert sum(xla.kind_counts(found).values()) == len(found)
    assert all(f["kind"] in xla.KIND_WORDS for f in found)
    rows = xla.fusion_rows(found, most=3)
    assert len(rows) == min(3, len(found)) and all(len(r) == 4 for r in rows)
    assert f"{len(found)} fusions" in xla.fusion_sentence(found, 4) and "4 kernels" in xla.fusion_sentence(found, 4)
    assert capsys.readouterr().out == ""  # the module returns; cells print


@pytest.mark.slow  # starts jax's CPU client: seconds on 2 cores
def test_one_thread_keeps_the_work_on_the_calling_thread(started, capsys):
    import jax

    a = jax.numpy.ones((256, 256))
    f = jax.jit(lambda m: jax.numpy.tanh(m @ m) @ m)

    def call():
        return f(a).block_until_ready()

    call()
    if not started["started_here"] or not started["pinned"]:
        pytest.skip("jax's CPU client was started before this file asked for one thread")
    assert xla.thread_share(call, calls=10) > 0.9
    timed = xla.time_calls({"eager": lambda: torch.ones(8).sum(), "XLA (jax.jit)": call}, 3, on_thread=True)
    assert timed["XLA (jax.jit)"].clock == "thread" and timed.rounds == 3
    assert xla.paired_sentence(timed).startswith("Timed again beside eager in the same 3 rounds")
    assert "(the median of the 3 per-round ratios; the ratio of the two medians is" in xla.paired_sentence(timed)
    assert xla.one_thread() == {"started_here": False, "pinned": False}  # once started, nothing changes
    assert capsys.readouterr().out == ""


@pytest.mark.slow  # starts jax's CPU client: seconds on 2 cores
def test_jax_runs_on_the_cpu_alone_and_the_arrays_are_committed_there(started):
    # where jax has a GPU plugin its default device is the GPU (fp32 matmuls there may run in TF32, 5e-4 off eager's
    # logits on an H200): one_thread narrows jax to the CPU, and weights and tokens are put on the CPU device
    import jax

    if started["started_here"]:
        assert jax.config.jax_platforms == "cpu"
    cfg, model, tokens = _model()
    placed = [*xla.weights(model).values(), xla.tokens_for_jax(tokens)]
    assert {d.platform for a in placed for d in a.devices()} == {"cpu"}
    assert all(a.committed for a in placed)  # a jit of committed arrays compiles for their device, not the default


PLANTED_HLO = """HloModule planted

%fused_computation (param_0: f32[4]) -> f32[4] {
  %param_0 = f32[4]{0} parameter(0)
  %constant.1 = f32[] constant(2)
  %broadcast.1 = f32[4]{0} broadcast(%constant.1), dimensions={}
  %multiply.1 = f32[4]{0} multiply(%param_0, %broadcast.1)
  ROOT %tanh.1 = f32[4]{0} tanh(%multiply.1)
}

%fused_computation.1 (param_0.1: f32[4,4], param_1.1: f32[4,4]) -> f32[4,4] {
  %param_0.1 = f32[4,4]{1,0} parameter(0)
  %param_1.1 = f32[4,4]{1,0} parameter(1)
  ROOT %dot.1 = f32[4,4]{1,0} dot(%param_0.1, %param_1.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (p: f32[4], q: f32[4,4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %q = f32[4,4]{1,0} parameter(1)
  %tanh_fusion = f32[4]{0} fusion(%p), kind=kLoop, calls=%fused_computation
  %ynn_fusion = f32[4,4]{1,0} fusion(%q, %q), kind=kCustom, calls=%fused_computation.1, backend_config={"fusion_config":{"kind":"__ynn_fusion"}}
  ROOT %out = f32[4]{0} fusion(%tanh_fusion), kind=kLoop, calls=%fused_computation
}
"""


def test_fusions_are_read_from_the_hlo_text():
    found = xla.fusions(PLANTED_HLO)
    assert [f["name"] for f in found] == ["tanh_fusion", "ynn_fusion", "out"]
    assert found[0] == {"name": "tanh_fusion", "shape": "f32[4]", "kind": "kLoop", "library": "",
                        "ops": ["constant", "broadcast", "multiply", "tanh"]}
    assert found[1]["library"] == "__ynn_fusion" and found[1]["ops"] == ["dot"]
    assert xla.kind_counts(found) == {"kLoop": 2, "kCustom (ynn_fusion)": 1}
    assert xla.fusion_rows(found, most=1) == [["tanh_fusion", "kLoop", "f32[4]", "multiply, tanh"]]
    said = xla.fusion_sentence(found, None)
    assert "3 fusions: 2 are loops" in said and "1 matmuls and 0 reductions" in said
    assert xla.fusions("HloModule empty") == []
    paired = xla.fusion_sentence(found, 4, library_calls=6, aten_calls=["sdpa_for_cpu", "sdpa_for_cpu"])
    assert "Matmuls: Inductor's wrapper calls the library 6 time(s) (extern_kernels), XLA's HLO 1" in paired
    assert "2 call(s) to ATen ops as they are, uncompiled (sdpa_for_cpu)" in paired
    assert "ATen ops" not in xla.fusion_sentence(found, 4, 6, [])
    assert "4 kernels" in paired and "1 kernel " in xla.fusion_sentence(found, 1)


def _timing(ms, spread=0.1, samples=None):
    s = ms / 1e3
    return bench.Timing(s, s * (1 - spread / 2), s * (1 + spread / 2), samples or [s] * 5)


def test_across_rounds_and_measured_sentences_label_their_rounds():
    rows = [{"backend": "eager", "timing": _timing(0.59), "units": 21, "unit_kind": "aten ops"},
            {"backend": "Inductor", "timing": _timing(0.587), "units": 4, "unit_kind": "Inductor kernels"},
            {"backend": "ONNX Runtime", "timing": _timing(0.31), "units": 38, "unit_kind": "ORT nodes"}]
    xla_row = {"backend": "XLA (jax.jit)", "timing": _timing(0.285, samples=[2.85e-4] * 5)}
    across = xla.across_rounds_sentence(xla_row, rows[1:])
    assert across.startswith("Across rounds (XLA's median from its own rounds")
    assert "XLA (jax.jit) was 2.06x" in across and "eager" not in across
    assert xla.across_rounds_sentence(xla_row, []) == ""
    pair = {"eager": _timing(0.684, samples=[6.84e-4] * 5), "XLA (jax.jit)": xla_row["timing"]}
    said = xla.measured_sentence(rows, pair, library_calls=6)
    assert said.startswith("What this run measured: eager called 21 aten ops; Inductor ran 4 Inductor kernels plus 6 "
                           "library matmul call(s), and its time was within the noise of eager's;")
    assert "ONNX Runtime ran 38 ORT nodes, and it was faster than eager (eager/ONNX Runtime 1.90x" in said
    assert "XLA (jax.jit) was faster than eager (eager/XLA (jax.jit) 2.40x" in said and "own rounds' per-round ratios" in said
    assert "and 1 call(s) to uncompiled ATen ops" in xla.measured_sentence(rows, pair, library_calls=6, aten_calls=1)
    assert "ATen" not in said
    assert "does not say why" in said
    assert "XLA" not in xla.measured_sentence(rows, None, library_calls=6)
    # what a learner could measure to find out, naming only the profilers of the compilers that ran
    assert "To find out, profile each forward" in said and "enable_profiling" in said and "jax.profiler" in said
    no_xla = xla.measured_sentence(rows, None, library_calls=6)
    assert "torch.profiler" in no_xla and "enable_profiling" in no_xla and "jax.profiler" not in no_xla
    assert "enable_profiling" not in xla.measured_sentence(rows[:2], None, library_calls=6)


def test_the_paired_sentence_names_both_ratios():
    from helpers.measure.protocol import Comparison

    eager = _timing(0.8, samples=[8e-4, 9e-4, 6e-4])
    fast = _timing(0.4, samples=[3e-4, 4e-4, 4e-4])
    said = xla.paired_sentence(Comparison({"eager": eager, "XLA (jax.jit)": fast}, {}, 3, "max_reps"))
    assert "was 2.25x" in said and "the ratio of the two medians is 2.00x" in said and "faster than eager" in said


def test_missing_jax_is_one_sentence(monkeypatch):
    assert xla.missing() is None or importlib.util.find_spec("jax") is None
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert xla.missing().endswith("skipped.")


def test_importing_helpers_fusion_does_not_import_jax():
    """No module of helpers.fusion imports jax at its top (only inside functions), so `import helpers.fusion` and
    any of its modules leave jax unimported."""
    for path in sorted(FUSION.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "jax" or n.startswith("jax.") for n in names), f"{path.name} imports jax at its top"


def test_thread_share_refuses_no_calls():
    with pytest.raises(ValueError):
        xla.thread_share(lambda: None, calls=0)
    with pytest.raises(ValueError):
        xla.time_calls({"fn": lambda: None}, 0, on_thread=True)


@pytest.mark.ranks  # a child process with 4 host devices
def test_a_split_mlp_compiles_with_the_all_reduce_xla_inserts():
    pytest.importorskip("jax")
    out = xla.sharded_mlp(4, rows=8, d=16, hidden=32)
    assert out["devices"] == 4 and out["max_abs_err"] <= 1e-5
    assert len(out["collectives"]) == 1 and "all-reduce" in out["collectives"][0] and "f32[8,16]" in out["collectives"][0]
    assert out["local"] == ["f32[8,16]", "f32[16,8]", "f32[8,16]"]  # W_up by columns, W_down by rows: 32 / 4 each


def test_a_split_that_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="divisible"):
        xla.sharded_mlp(8, rows=4, d=16, hidden=12)
