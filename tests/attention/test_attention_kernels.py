"""helpers.attention.kernels: online softmax, FlashAttention-2 in PyTorch tiles, the dispatcher, the models."""
import pytest
import torch

from helpers.attention import kernels
from helpers.gpt.model import GPT, GPTConfig, naive_attention

FP32 = dict(rtol=1e-5, atol=1e-5)  # fp32 sums taken in a different order differ by ~1e-6


def reference(q, k, v, is_causal, do):
    """Output and gradients of naive attention in float64: the ground truth for every test here."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = naive_attention(q, k, v, is_causal)
    return (out, *torch.autograd.grad(out, (q, k, v), do.double()))


def run(fn, q, k, v, do):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), do))


def qkv(shape_q, n_k=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape_k = (*shape_q[:-2], n_k or shape_q[-2], shape_q[-1])
    return [torch.randn(s, generator=g).to(dtype) for s in (shape_q, shape_k, shape_k, shape_q)]  # q, k, v, dO


# ---------------------------------------------------------------- online softmax

def test_online_softmax_equals_softmax_for_every_block_size():
    x = torch.randn(3, 5, 37) * 4
    x[0, 0, :20] = float("-inf")  # a masked prefix: the first block's max is -inf
    for block in (1, 7, 16, 37, 64):
        p, m, l = kernels.online_softmax(x, block)
        torch.testing.assert_close(p, torch.softmax(x, dim=-1), **FP32)
        torch.testing.assert_close(m, x.amax(dim=-1))
        torch.testing.assert_close(m + l.log(), torch.logsumexp(x, dim=-1), **FP32)


def test_softmax_merge_is_order_free():
    a, b = torch.randn(4, 10), torch.randn(4, 6) + 3
    stats = lambda x: (x.amax(-1), torch.exp(x - x.amax(-1, keepdim=True)).sum(-1))
    m1, l1 = kernels.softmax_merge(*stats(a), *stats(b))
    m2, l2 = kernels.softmax_merge(*stats(b), *stats(a))
    torch.testing.assert_close(m1 + l1.log(), torch.logsumexp(torch.cat([a, b], -1), -1), **FP32)
    torch.testing.assert_close((m1, l1), (m2, l2))


# ---------------------------------------------------------------- FlashAttentionPyTorch

@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape_q,n_k,blocks", [((2, 3, 37, 16), None, (16, 16)), ((3, 45, 32), None, (32, 8)),
                                                ((2, 29, 16), 50, (8, 16)), ((2, 50, 16), 29, (16, 64))],
                         ids=["4d-odd", "3d-odd", "nq<nk", "nq>nk"])
def test_flash_pytorch_matches_reference_forward_and_backward(shape_q, n_k, blocks, is_causal):
    q, k, v, do = qkv(shape_q, n_k)
    ours = run(lambda q, k, v: kernels.FlashAttentionPyTorch.apply(q, k, v, is_causal, *blocks), q, k, v, do)
    for got, want in zip(ours, reference(q, k, v, is_causal, do)):
        torch.testing.assert_close(got, want.float(), **FP32)


def test_flash_pytorch_saves_q_k_v_output_and_logsumexp_only(check_keeps_only_qkv_o_lse):
    q, k, v, _ = qkv((2, 3, 40, 16))
    check_keeps_only_qkv_o_lse(lambda q, k, v, c: kernels.FlashAttentionPyTorch.apply(q, k, v, c, 16, 16), q, k, v, True)


def test_flash_pytorch_fp16_meets_the_flash_attn_tolerance_rule():
    """Error vs the fp32-or-better reference at most 2x naive's own error in fp16 (+ a 1e-4 floor)."""
    q, k, v, do = qkv((1, 2, 70, 32), dtype=torch.float16)
    want = reference(q, k, v, True, do)
    ours = run(lambda q, k, v: kernels.FlashAttentionPyTorch.apply(q, k, v, True, 32, 16), q, k, v, do)
    naive = run(lambda q, k, v: naive_attention(q, k, v, True), q, k, v, do)
    for got, base, ref in zip(ours, naive, want):
        assert got.dtype == torch.float16
        assert (got.double() - ref).abs().max() <= 2 * (base.double() - ref).abs().max() + 1e-4


def test_flash_pytorch_rejects_bad_blocks():
    q, k, v, _ = qkv((1, 8, 16))
    with pytest.raises(ValueError, match="block_q=0"):
        kernels.FlashAttentionPyTorch.apply(q, k, v, False, 0, 16)


# ---------------------------------------------------------------- dispatcher

def test_availability_on_cpu_gives_reasons_for_what_cannot_run():
    if torch.cuda.is_available():
        pytest.skip("checks the CPU's answers")
    why = kernels.availability("cpu", torch.float32)
    assert set(why) == set(kernels.IMPLEMENTATIONS)
    for impl in ("naive", "sdpa", "sdpa_math", "flash_pytorch"):
        assert why[impl] is None
    for impl in ("sdpa_efficient", "sdpa_cudnn", "flash_attn"):
        assert isinstance(why[impl], str) and why[impl]
    assert "bf16" in kernels.availability("cpu", torch.bfloat16)["flash_triton"]
    assert kernels.available("cpu", torch.float32) == [i for i in kernels.IMPLEMENTATIONS if why[i] is None]


def test_every_available_implementation_agrees_with_naive_with_gqa():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 33, 16, generator=g)
    k, v = torch.randn(2, 2, 33, 16, generator=g), torch.randn(2, 2, 33, 16, generator=g)  # 2 kv heads for 4 q heads
    want = naive_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), True)
    for impl in kernels.available("cpu" if not torch.cuda.is_available() else "cuda", torch.float32):
        torch.testing.assert_close(kernels.attention(q, k, v, impl, is_causal=True), want, **FP32, msg=impl)


def test_dispatcher_rejects_unknown_impl_and_bad_head_counts():
    q, k, v, _ = qkv((1, 4, 8, 16))
    with pytest.raises(ValueError, match="impl='fast'"):
        kernels.attention(q, k, v, "fast")
    with pytest.raises(ValueError, match="must divide"):
        kernels.attention(q, k[:, :3], v[:, :3], "naive")


def test_course_kernels_train_the_gpt_like_sdpa():
    kernels.register_course_kernels()
    torch.manual_seed(0)
    m = GPT(GPTConfig.preset("tiny", seq_len=32, n_kv_head=2))
    idx, tgt = torch.randint(0, 256, (2, 21)), torch.randint(0, 256, (2, 21))
    m.attn_impl = "sdpa"
    want = m(idx, tgt)[1]
    want.backward()
    grad = m.blocks[0].attn.q_proj.weight.grad.clone()
    m.zero_grad()
    m.attn_impl = "flash_pytorch"
    got = m(idx, tgt)[1]
    got.backward()
    torch.testing.assert_close(got, want, **FP32)
    torch.testing.assert_close(m.blocks[0].attn.q_proj.weight.grad, grad, **FP32)


# ---------------------------------------------------------------- FLOPs, memory, traffic

def test_flop_convention():
    assert kernels.attention_flops(2, 3, 128, 64) == 4 * 2 * 3 * 128**2 * 64
    assert kernels.attention_flops(2, 3, 128, 64, is_causal=True) == 2 * 2 * 3 * 128**2 * 64
    assert kernels.attention_flops(1, 1, 8, 16, backward=True) == 3.5 * kernels.attention_flops(1, 1, 8, 16)


@pytest.mark.parametrize("is_causal", [False, True])
def test_saved_bytes_model_matches_what_autograd_keeps(is_causal):
    q, k, v, _ = qkv((2, 3, 48, 16))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    from helpers.measure.memory import saved_tensor_bytes

    for impl, kind in (("naive", "naive"), ("flash_pytorch", "tiled")):
        got = saved_tensor_bytes(lambda: kernels.attention(q, k, v, impl, is_causal))
        assert got == kernels.saved_bytes(kind, 48, 16, batch_heads=6, itemsize=4, is_causal=is_causal), impl


def test_traffic_model():
    n, d = 4096, 64
    assert kernels.tiled_traffic_bytes(n, d, block_q=n) == (4 * n * d) * 2 + 4 * n  # one tile: everything once
    per_block = [kernels.tiled_traffic_bytes(n, d, block_q=b) for b in (16, 32, 64, 128)]
    assert per_block == sorted(per_block, reverse=True)  # bigger query tiles, fewer K/V re-reads
    s = 2  # bytes per element
    assert kernels.naive_traffic_bytes(n, d) == (4 * n * n + 6 * n * d) * s  # scale q, S = q kᵀ, softmax, P v
    quadratic = kernels.tiled_traffic_bytes(n, d, block_q=128) - (2 * n * d * s + 4 * n)  # minus Q, O and L
    assert quadratic == 2 * d / 128 * n * n * s  # K and V re-read once per query tile: 2d/B_r N² elements
    assert kernels.traffic_crossover(d) == 32
    assert kernels.tiled_traffic_bytes(n, d, block_q=16) > kernels.naive_traffic_bytes(n, d)  # below the crossover
    assert kernels.tiled_traffic_bytes(n, d, block_q=64) < kernels.naive_traffic_bytes(n, d)  # above it
    full, causal = kernels.tiled_traffic_bytes(n, d, 128), kernels.tiled_traffic_bytes(n, d, 128, is_causal=True)
    assert 0.5 < causal / full < 0.55  # causal reads K and V about half as often
    assert kernels.naive_traffic_bytes(n, d, is_causal=True) > kernels.naive_traffic_bytes(n, d)


@pytest.mark.slow
def test_triton_kernels_are_refused_with_a_reason_on_a_gpu_older_than_sm80():
    import subprocess
    import sys

    code = ("import torch; torch.cuda.is_available = lambda: True; "
            "torch.cuda.get_device_capability = lambda *a: (7, 5)\n"
            "from helpers.attention import kernels\n"
            "print(kernels.TRITON_MISSING)\n"
            "print(kernels._static_reason('flash_triton', 'cuda', torch.float16))")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    reason, static = done.stdout.strip().splitlines()[-2:]
    assert "sm_80 or newer" in reason and "sm_75" in reason and static == reason


def test_a_broken_cuda_context_is_not_mistaken_for_a_kernel_refusal():
    from helpers.measure.bench import recoverable_failure

    assert recoverable_failure(RuntimeError("cuDNN Frontend error: No execution plans support the graph."))
    assert recoverable_failure(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not recoverable_failure(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not recoverable_failure(ValueError("shapes"))


def test_probe_reason_joins_sdpa_warning_header_and_detail():
    reason = kernels._reason_from(RuntimeError("No available kernel. Aborting execution."),
                                  ["Flash attention kernel not used because:", "Flash attention only supports sm80+",
                                   "unrelated"])
    assert reason == "Flash attention kernel not used because: Flash attention only supports sm80+"
    assert kernels._reason_from(RuntimeError("No available kernel.\nmore"), []) == "No available kernel."


# ---------------------------------------------------------------- exercise 06.tile and the loop it plugs into

@pytest.mark.parametrize("is_causal", [False, True])
def test_tiled_forward_with_the_exercise_tile_is_full_attention(is_causal):
    from helpers.course.exercises import nb06

    q, k, v, _ = qkv((2, 3, 53, 16))  # 53: no tile size divides it
    o, lse = kernels.tiled_forward(nb06._tile, q, k, v, is_causal, block_q=16, block_k=12)
    torch.testing.assert_close(o, naive_attention(q, k, v, is_causal), **FP32)
    s = q @ k.mT / 4.0
    if is_causal:
        s = s.masked_fill(torch.ones(53, 53, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(s, dim=-1), **FP32)
    o_ref, lse_ref = kernels.tiled_forward(nb06.tile_reference, q, k, v, is_causal, block_q=16, block_k=12)
    torch.testing.assert_close(o_ref, o, **FP32)
    with pytest.raises(ValueError, match="block_q"):
        kernels.tiled_forward(nb06._tile, q, k, v, block_q=0)
    with pytest.raises(ValueError, match="expected"):
        kernels.tiled_forward(lambda q, *rest: (q[..., :1, :], q[..., 0]), q, k, v)


def test_the_correct_exercise_tile_passes_its_checker_and_the_merge_matches_whole_rows(capsys):
    from helpers.course import check
    from helpers.course.exercises import nb06

    check.exercise("06.tile", nb06._tile)  # the loop the planted wrong answers are made from, unplanted
    assert capsys.readouterr().out.startswith("PASS")
    s, vals = torch.randn(4, 11) * 5, torch.randn(11, 3)
    s[0] = float("-inf")  # a row that sees nothing
    s[1, :6] = float("-inf")  # a row whose first part is empty
    m, l, o = nb06.merge_reference(*nb06.state(s[:, :6], vals[:6]), *nb06.state(s[:, 6:], vals[6:]))
    for got, want in zip((m, l, o), nb06.state(s, vals)):
        torch.testing.assert_close(got, want, **FP32)


def test_naive_attention_in_fp16_survives_scores_that_only_fit_after_scaling():
    """q, k ~ 60 N(0,1), d=64, N=16: q kᵀ reaches ~9e4 (> fp16's 65504), scaled ~1.1e4 (fits)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 16, 64, generator=g) * 60 for _ in range(3))
    assert (q.double() @ k.double().mT).abs().max() > torch.finfo(torch.float16).max  # unscaled: overflows
    for is_causal in (False, True):
        want = naive_attention(q.double(), k.double(), v.double(), is_causal)
        got = naive_attention(q.half(), k.half(), v.half(), is_causal)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-3 * want.abs().max().item())
