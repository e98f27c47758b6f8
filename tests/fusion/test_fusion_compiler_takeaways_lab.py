"""helpers.fusion.compiler_takeaways_lab: notebook 09's closing sentences carry the numbers given."""
from helpers.fusion import compiler_takeaways_lab
from helpers.measure.protocol import Ratio


def _inputs(**over):
    result = lambda name, eager, gbps: {"name": name, "kernels": {"eager": eager, "compiled": 1},  # noqa: E731
                                        "gbps": {"compiled": gbps}, "bytes_fused": 2_000_000}
    cold = {"cold_s": 1.6, "cold": (1.6, 1.5, 1.7), "warm_s": 0.08, "warm": (0.08, 0.07, 0.09),
            "cold_samples": [1.6, 1.5, 1.7, 1.6, 1.6]}
    regional = {"repeats": 3, "each block": {"first_step_s": 0.5}, "whole model": {"first_step_s": 0.9},
                "ratio": Ratio(1.8, 1.5, 2.0, True)}
    kw = dict(results=[result("pointwise", 3, 5.0), result("softmax", 5, 9.0)],
              pred={"pointwise": {"eager": 6.0, "fused": 2.0}, "softmax": {"eager": 8.0, "fused": 2.0}},
              ratios={"pointwise": Ratio(0.9, 0.8, 1.0, False)}, spread=0.5, copy_gbps=10.0,
              copy_source="notebook 00: copy", llc=None, cold=cold,
              gpt_step={"first_step_s": 0.6, "speedup": Ratio(1.03, 0.99, 1.05, False)}, gpt_even_text="cannot tell",
              regional=regional, regional_layers=4, regional_backend="aot_eager",
              recompiles={"automatic dynamic (default)": {"compiles": 2}, "dynamic=False": {"compiles": 6},
                          "mark_dynamic(x, 0)": {"compiles": 1}},
              sizes=[8, 8, 16], refused=["with_print"], n_breaks=3,
              claim_rows={"compile-1-5-2x": {"verdict": "not testable", "reason": "a GPU claim; more"}},
              device="cpu", checks=["fp16"], shape="256 x 1024 fp32")
    kw.update(over)
    return kw


def test_the_sentences_carry_the_numbers_given():
    lines = compiler_takeaways_lab.takeaways(**_inputs())
    assert len(lines) == 6 and all(line.startswith("- ") for line in lines)
    assert "pointwise 3 -> 1, softmax 5 -> 1" in lines[0] and "4.0x less traffic at 256 x 1024 fp32" in lines[0]
    assert "the compiled softmax reached 0.9x the copy bandwidth (notebook 00)" in lines[1]
    assert "medians of 5 on the CPU clock" in lines[2]  # as many as the cold compiles timed
    assert "compiled 2 times for 2 sizes" in lines[3] and "refused 1 of the 3" in lines[3]
    assert "compile-1-5-2x not testable (a GPU claim)" in lines[4]
    assert lines[5].endswith("in Triton's interpreter (not timed).")


def test_a_triton_softmax_that_did_not_run_says_so():
    assert "did not run" in compiler_takeaways_lab.takeaways(**_inputs(checks=[]))[-1]


def test_the_compilers_line_carries_each_backend_and_the_largest_error():
    from helpers.measure.bench import Timing

    timing = lambda s: Timing(median=s, q25=s, q75=s, samples=[s, s, s])  # noqa: E731
    rows = [{"backend": "eager", "timing": timing(1e-3), "units": 21, "unit_kind": "aten ops", "max_abs_err": 0.0},
            {"backend": "ONNX Runtime", "timing": timing(5e-4), "units": 38, "unit_kind": "ORT nodes after optimization",
             "max_abs_err": 6e-7}]
    lines = compiler_takeaways_lab.takeaways(**_inputs(compilers=rows))
    line = next(x for x in lines if x.startswith("- One forward"))
    assert "eager and 1 compiler(s)" in line and "eager 1 ms (21 aten ops)" in line and "ONNX Runtime 0.5 ms (38 ORT nodes" in line
    assert "within 6.0e-07 of eager's" in line and "rounds of its own" not in line
    assert not any(x.startswith("- One forward") for x in compiler_takeaways_lab.takeaways(**_inputs()))
    xla = {"backend": "XLA (jax.jit)", "timing": timing(4e-4), "units": 37, "unit_kind": "XLA fusions", "max_abs_err": 6e-7}
    pair = {"eager": Timing(median=1.2e-3, q25=1.2e-3, q75=1.2e-3, samples=[1.2e-3] * 3), "XLA (jax.jit)": xla["timing"]}
    line = next(x for x in compiler_takeaways_lab.takeaways(**_inputs(compilers=rows + [xla], xla_pair=pair))
                if x.startswith("- One forward"))
    assert "eager and 2 compiler(s)" in line
    assert "XLA (jax.jit) 0.4 ms (37 XLA fusions; timed in rounds of its own, beside eager at 1.2 ms: eager/XLA 3.00x" in line
    from helpers.measure.protocol import Comparison

    compared = Comparison(timings=pair, warmup_calls={k: 1 for k in pair}, rounds=3, stopped="max_reps")
    assert line in compiler_takeaways_lab.takeaways(**_inputs(compilers=rows + [xla], xla_pair=compared))


def test_the_graph_passes_line_carries_the_node_counts():
    nodes = {"traced": 11, "after dead-code elimination": 9, "after constant folding": 4}
    lines = compiler_takeaways_lab.takeaways(**_inputs(pass_nodes=nodes))
    assert len(lines) == 7
    line = next(x for x in lines if "shrinks the graph" in x)
    assert "traced 11 nodes, after dead-code elimination 9 nodes, after constant folding 4 nodes" in line
