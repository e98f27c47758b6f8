"""helpers.fusion.compiler: the workloads against the library, the bytes counted as the ops run, the code
Inductor writes, graph breaks and recompilations. No test asserts a speed."""
import pytest
import torch

from helpers.fusion import compiler

ROWS, COLS = 256, 1024  # notebook 09's smoke size, so that it finds these graphs in Inductor's on-disk cache


@pytest.mark.parametrize("name", ["layernorm", "softmax"])
def test_the_hand_written_ops_equal_the_library(name):
    args = compiler.make_inputs(name, 5, 33)
    w = compiler.WORKLOADS[name]
    torch.testing.assert_close(w.fn(*args), w.library(*args), rtol=1e-5, atol=1e-5)


def test_bytes_counted_as_the_ops_run():
    x, b = compiler.make_inputs("pointwise", 8, 48)
    n, bias = 8 * 48 * 4, 48 * 4
    counted = compiler.eager_bytes(compiler.pointwise_chain, x, b)
    assert counted["ops"] == ["add.Tensor", "gelu.default", "mul.Tensor"]
    assert counted["total"] == 6 * n + bias == compiler.chain_bytes(8, 48, 3, 4, fused=False) + bias
    assert compiler.fused_bytes(compiler.pointwise_chain, x, b) == 2 * n + bias == compiler.chain_bytes(8, 48, 3, 4, True) + bias
    with pytest.raises(ValueError, match="rows"):
        compiler.make_inputs("softmax", 0, 4)
    with pytest.raises(ValueError, match="unknown"):
        compiler.make_inputs("gemm", 4, 4)


def test_generated_code_is_captured_with_the_fused_kernel():
    args = compiler.make_inputs("pointwise", ROWS, COLS)
    out, codes = compiler.generated_code(torch.compile(compiler.fresh_copy(compiler.pointwise_chain)), *args)
    torch.testing.assert_close(out, compiler.pointwise_chain(*args), rtol=1e-5, atol=1e-5)
    kernels = {name: body for code in codes for name, body in compiler.fused_kernels(code).items()}
    (name,) = kernels  # one fused kernel for the whole chain
    assert "fused" in name and "gelu" in name and "add" in name and "mul" in name
    body = kernels[name]
    assert "erf" in body and "#pragma omp" in body  # CPU inputs: C++ with OpenMP, on any machine
    assert "#include" not in compiler.kernel_excerpt(body) and len(compiler.kernel_excerpt(body, 5).splitlines()) <= 6


def test_dropout_option_keeps_the_chain_and_drops_about_p():
    x, b = compiler.make_inputs("pointwise", ROWS, COLS)
    p = 0.25
    fn = torch.compile(compiler.fresh_copy(compiler.pointwise_chain))
    with torch.no_grad():
        y, clean = fn(x, b, 0.5, p), compiler.pointwise_chain(x, b)
    kept = y != 0
    assert abs((~kept).float().mean().item() - p) < 0.01  # 262144 draws: 5 sigma is about 0.004
    torch.testing.assert_close(y[kept], clean[kept] / (1 - p), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("which", list(compiler.BREAKS))
def test_explain_finds_each_planted_break_and_none_after_the_fix(which):
    broken, fixed = compiler.BREAKS[which]
    x = torch.randn(4, 6)
    before, after = compiler.explain(broken, x), compiler.explain(fixed, x)
    assert (before["graphs"], before["breaks"], len(before["reasons"])) == (2, 1, 1)
    assert (after["graphs"], after["breaks"], after["reasons"]) == (1, 0, [])
    word = {"print": "builtin", "item": "item()", "branch": "jump"}[which]
    assert word in before["reasons"][0]
    torch.testing.assert_close(fixed(x), broken(x))  # the fix computes the same thing


def test_recompile_counts_for_a_scripted_shape_sequence():
    sizes = [8, 8, 16, 32, 5]
    auto = compiler.count_compiles(sizes)
    assert auto["after_each"] == [1, 1, 2, 2, 2]  # static for 8, then one dynamic graph for every other size
    assert compiler.count_compiles(sizes, dynamic=False)["after_each"] == [1, 1, 2, 3, 4]  # one per new size
    assert compiler.count_compiles(sizes, mark_dynamic=True)["compiles"] == 1
    limited = compiler.count_compiles([8, 16, 32, 5, 6, 7], dynamic=False, limit=2)
    assert limited["compiles"] == 2  # past the limit Dynamo stops compiling and runs the function eagerly
    with pytest.raises(ValueError, match="sizes"):
        compiler.count_compiles([1, 8])


def test_captured_logs_hold_what_torch_logs_prints_and_are_reset_after():
    with compiler.captured_logs(graph_breaks=True, recompiles=True) as lines:
        torch.compile(compiler.fresh_copy(compiler.with_branch), backend="eager")(torch.randn(8, 16))
        f = torch.compile(compiler.fresh_copy(compiler.fixed_print), backend="eager", dynamic=False)
        f(torch.randn(8, 16)), f(torch.randn(16, 16))
    logs = compiler.log_entries(lines)
    assert any("Graph break" in m for m in logs["graph_breaks"])
    assert sum(m.startswith("Recompiling") for m in logs["recompiles"]) == 1  # one new size, one recompile
    with compiler.captured_logs() as quiet:  # nothing asked: nothing logged
        torch.compile(compiler.fresh_copy(compiler.with_branch), backend="eager")(torch.randn(8, 16))
    assert compiler.log_entries(quiet).get("graph_breaks", []) == []
    with pytest.raises(ValueError, match="unknown log artifact"):
        with compiler.captured_logs(graph_brakes=True):
            pass


def test_log_entries_parse_the_prefix_and_skip_other_lines():
    lines = ["V1202 00:28:58.359000 6218 torch/_dynamo/symbolic_convert.py:5124] [0/0] [__graph_breaks] Graph break in user code",
             "V1202 00:29:00.256000 6218 torch/_dynamo/guards.py:5396] [2/1] [__recompiles] Recompiling function f",
             "some other line"]
    assert compiler.log_entries(lines) == {"graph_breaks": ["Graph break in user code"], "recompiles": ["Recompiling function f"]}


def test_fullgraph_refuses_a_data_dependent_branch_and_passes_its_fix():
    err = compiler.fullgraph_refusal(compiler.with_branch, torch.randn(4, 4))
    assert err is not None and err.startswith("Unsupported") and "branch" in err.lower()
    assert compiler.fullgraph_refusal(compiler.fixed_branch, torch.randn(4, 4)) is None


def test_compile_blocks_compiles_every_block_and_refuses_a_model_without_blocks():
    from helpers.gpt.model import GPT, GPTConfig

    model = GPT(GPTConfig.preset("tiny", n_layer=2, seq_len=8))
    assert compiler.compile_blocks(model, backend="eager") == 2
    assert all(b._compiled_call_impl is not None for b in model.blocks)
    with pytest.raises(ValueError, match="blocks"):
        compiler.compile_blocks(torch.nn.Linear(2, 2))


def test_fx_cache_counts_count_a_compile_as_a_hit_or_a_miss():
    before = compiler.fx_cache_counts()
    x, bias = compiler.make_inputs("pointwise", 4, 8)
    torch.compile(compiler.fresh_copy(compiler.pointwise_chain))(x, bias, 0.25)
    after = compiler.fx_cache_counts()
    assert (after["hit"] - before["hit"]) + (after["miss"] - before["miss"]) == 1  # one graph, one lookup
