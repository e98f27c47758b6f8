"""helpers.fusion.onnx_backend: the course GPT exported to ONNX and run in ONNX Runtime equals eager within the
stated tolerance, on one thread, its node counts are read back, the lab prints nothing, and importing the module
loads none of the optional ONNX packages. No test asserts a speed."""
import ast
import inspect

import pytest
import torch

from helpers.fusion import onnx_backend
from helpers.measure import bench

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


@pytest.mark.slow
def test_export_equals_eager_on_one_thread_and_ort_rewrites_the_graph(tmp_path, capsys):
    from helpers.gpt.model import GPT, GPTConfig

    cfg = GPTConfig.preset("tiny", n_layer=1, d_model=32, n_head=2, d_ff=64, seq_len=8)
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    tokens = torch.randint(0, cfg.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        eager = model(tokens)[0]
    with onnx_backend.quiet():
        session, exported, optimized = onnx_backend.export_to_onnx_runtime(
            model, tokens, str(tmp_path), providers=onnx_backend.providers("cpu"))
    options = session.get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 1)
    assert session.get_providers() == ["CPUExecutionProvider"]
    got = onnx_backend.ort_runner(session, tokens)()
    assert got.shape == eager.shape and float((got - eager).abs().max()) <= onnx_backend.TOLERANCE
    counts = onnx_backend.graph_counts(exported, optimized)
    assert all(type(counts[k]) is int and counts[k] > 0 for k in ("exported", "optimized"))
    assert counts["optimized"] <= counts["exported"]
    assert sum(counts["optimized_ops"].values()) == counts["optimized"]
    assert counts["introduced"] and all(k not in counts["exported_ops"] for k in counts["introduced"])
    assert counts["exported"] + sum(counts["put_in"].values()) - sum(counts["took_out"].values()) == counts["optimized"]
    rows = onnx_backend.compare_forwards({"eager": lambda: model(tokens)[0], "ONNX Runtime": onnx_backend.ort_runner(session, tokens)},
                                         eager, {"eager": (3, "aten ops"), "ONNX Runtime": (counts["optimized"], "ORT nodes")},
                                         device="cpu", reps=2)
    assert [r["backend"] for r in rows] == ["eager", "ONNX Runtime"] and rows[0]["max_abs_err"] == 0.0
    assert rows[1]["units"] == counts["optimized"] and isinstance(rows[1]["timing"], bench.Timing)
    assert capsys.readouterr().out == ""  # the lab and the quieted export print nothing


def test_a_variant_off_eager_fails_the_check_and_names_must_match():
    ref = torch.ones(2, 3)
    with pytest.raises(AssertionError, match="above the tolerance"):
        onnx_backend.compare_forwards({"eager": lambda: ref, "bad": lambda: ref + 1e-3}, ref,
                                      {"eager": (1, "ops"), "bad": (1, "ops")}, device="cpu", reps=1)
    with pytest.raises(ValueError, match="same backends"):
        onnx_backend.compare_forwards({"eager": lambda: ref}, ref, {"other": (1, "ops")}, device="cpu", reps=1)


def test_rank_sentence_ranks_only_separated_timings():
    def timing(ms, spread):
        s = ms / 1e3
        return bench.Timing(s, s * (1 - spread), s * (1 + spread), [s])

    apart = [{"backend": "eager", "timing": timing(2.0, 0.05)}, {"backend": "ORT", "timing": timing(1.0, 0.05)}]
    assert onnx_backend.rank_sentence(apart).startswith("ORT was 2.00x")
    close = [{"backend": "eager", "timing": timing(1.0, 0.2)}, {"backend": "ORT", "timing": timing(1.05, 0.2)}]
    assert "cannot rank them" in onnx_backend.rank_sentence(close)
    assert onnx_backend.rank_sentence(close[:1]).startswith("Only one variant")


def test_missing_names_what_is_absent(monkeypatch):
    real = onnx_backend.importlib.util.find_spec
    monkeypatch.setattr(onnx_backend.importlib.util, "find_spec", lambda name: None if name == "onnxruntime" else real(name))
    assert onnx_backend.missing() == "onnxruntime not installed (pip install onnxruntime)"
    assert onnx_backend.forward_device("cuda") == "cpu"  # no ORT: nothing to put on CUDA beside it
    monkeypatch.undo()
    assert onnx_backend.missing() == ""


def test_the_optional_packages_are_imported_only_inside_functions():
    tree = ast.parse(inspect.getsource(onnx_backend))
    top = [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
    top += [n.module for n in tree.body if isinstance(n, ast.ImportFrom)]
    assert not [m for m in top if m and m.split(".")[0] in onnx_backend.PACKAGES]


def test_graph_counts_show_the_rewrite_both_ways_and_add_up(monkeypatch):
    from collections import Counter

    graphs = {"exported": Counter({"MatMul": 7, "Add": 12, "Mul": 4, "Slice": 2, "Softmax": 1}),
              "optimized": Counter({"MatMul": 2, "Gemm": 5, "Add": 7, "Mul": 3, "Split": 1, "Softmax": 1})}
    monkeypatch.setattr(onnx_backend, "op_counts", lambda path: graphs[path])
    counts = onnx_backend.graph_counts("exported", "optimized")
    assert (counts["exported"], counts["optimized"]) == (26, 19)
    assert counts["put_in"] == {"Gemm": 5, "Split": 1}
    assert counts["took_out"] == {"MatMul": 5, "Add": 5, "Slice": 2, "Mul": 1}
    assert counts["introduced"] == {"Gemm": 5, "Split": 1} and counts["removed"] == ["Slice"]
    said = onnx_backend.change_sentence(counts)
    assert "put in 6 node(s) (Gemm 5, Split 1)" in said and "took out 13 (MatMul 5, Add 5, Slice 2, Mul 1)" in said
    assert said.endswith("26 + 6 - 13 = 19.")


def test_the_wrapper_attention_call_is_found_and_its_checks_are_not():
    code = ("        buf6 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(buf4, buf5)\n"
            "        assert_size_stride(buf7, (2, 4), (4, 1), 'torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default')\n"
            "        extern_kernels.addmm(arg6_1, buf3, arg5_1, alpha=1, beta=1, out=buf4)\n")
    assert onnx_backend._ATEN_CALL.findall(code) == ["_scaled_dot_product_flash_attention_for_cpu"]
    assert len(onnx_backend._LIBRARY_CALL.findall(code)) == 1
