"""helpers.fusion.compiler: the workloads against the library, the bytes counted as the ops run, the code
Inductor writes, regional compilation, the FX-graph cache counts. No test asserts a speed."""
import pytest
import torch

from helpers.fusion import compiler, dynamo

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


@pytest.mark.parametrize("threads", [1, 2])
def test_generated_code_is_captured_with_the_fused_kernel(threads):
    from helpers.measure import bench

    args = compiler.make_inputs("pointwise", ROWS, COLS)
    with bench.cpu_threads("cpu", threads):
        out, codes = compiler.generated_code(torch.compile(dynamo.fresh_copy(compiler.pointwise_chain)), *args)
    torch.testing.assert_close(out, compiler.pointwise_chain(*args), rtol=1e-5, atol=1e-5)
    kernels = {name: body for code in codes for name, body in compiler.fused_kernels(code).items()}
    (name,) = kernels  # one fused kernel for the whole chain
    assert "fused" in name and "gelu" in name and "add" in name and "mul" in name
    body = kernels[name]
    # CPU inputs: C++, split across cores with OpenMP only when torch has more than one thread (notebook 09 says so)
    assert "erf" in body and ("#pragma omp" in body) == (threads > 1)
    assert "#include" not in compiler.kernel_excerpt(body) and len(compiler.kernel_excerpt(body, 5).splitlines()) <= 6


def test_dropout_option_keeps_the_chain_and_drops_about_p():
    x, b = compiler.make_inputs("pointwise", ROWS, COLS)
    p = 0.25
    fn = torch.compile(dynamo.fresh_copy(compiler.pointwise_chain))
    with torch.no_grad():
        y, clean = fn(x, b, 0.5, p), compiler.pointwise_chain(x, b)
    kept = y != 0
    assert abs((~kept).float().mean().item() - p) < 0.01  # 262144 draws: 5 sigma is about 0.004
    torch.testing.assert_close(y[kept], clean[kept] / (1 - p), rtol=1e-5, atol=1e-5)


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
    torch.compile(dynamo.fresh_copy(compiler.pointwise_chain))(x, bias, 0.25)
    after = compiler.fx_cache_counts()
    assert (after["hit"] - before["hit"]) + (after["miss"] - before["miss"]) == 1  # one graph, one lookup
