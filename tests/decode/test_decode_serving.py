"""The paged KV cache (helpers.decode.paged), attention through its block tables (helpers.decode.paged_attention), the
batching schedulers (helpers.decode.serving) and notebook 10's serving sections, panel and paged-waste verdict
(helpers.decode.serving_lab)."""
from __future__ import annotations

import itertools

import pytest
import torch

from helpers.decode import paged, paged_attention, serving, serving_lab
from helpers.gpt import generation
from helpers.gpt.model import GPT, GPTConfig
from kv_support import DTYPES, tolerance


def _pool_and_tables(lengths, block_size, H_kv=2, hd=16, seed=0):
    """A pool with random keys/values and block tables drawn from a random permutation (non-contiguous)."""
    g = torch.Generator().manual_seed(seed)
    need = [paged.blocks_for(L, block_size) for L in lengths]
    nb = sum(need) + 3
    kp = torch.randn(nb, block_size, H_kv, hd, generator=g)
    vp = torch.randn(nb, block_size, H_kv, hd, generator=g)
    perm = torch.randperm(nb, generator=g).tolist()
    tables = torch.zeros(len(lengths), max(need), dtype=torch.int32)
    rows, i = [], 0
    for b, n in enumerate(need):
        rows.append(perm[i:i + n])
        tables[b, :n] = torch.tensor(perm[i:i + n])
        i += n
    return kp, vp, tables, rows


def _dense(kp, vp, rows, lengths, block_size):
    """Contiguous (B, H_kv, S_max, hd) keys and values copied token by token through slot_of."""
    B, S = len(lengths), max(lengths)
    k = torch.zeros(B, kp.size(2), S, kp.size(3))
    v = torch.zeros_like(k)
    for b, L in enumerate(lengths):
        for p in range(L):
            blk, off = paged.slot_of(p, rows[b], block_size)
            k[b, :, p], v[b, :, p] = kp[blk, off], vp[blk, off]
    return k, v


# ------------------------------------------------------------------ allocator and block tables

def test_allocator_never_hands_out_a_block_twice_and_frees_everything():
    alloc = paged.BlockAllocator(10)
    got = alloc.allocate(4) + alloc.allocate(3)
    assert len(set(got)) == 7 and alloc.num_free == 3
    alloc.free(got[:2])
    again = alloc.allocate(5)
    assert not set(again) & set(got[2:]), "a block in use was handed out again"
    with pytest.raises(paged.OutOfBlocks, match="only 0 of 10 are free"):
        alloc.allocate(1)
    with pytest.raises(paged.OutOfBlocks):
        alloc.allocate(99)
    assert alloc.num_free == 0  # a refused request takes nothing
    alloc.free(got[2:] + again)
    assert alloc.num_free == 10 and alloc.num_used == 0
    with pytest.raises(ValueError, match="not allocated"):
        alloc.free([got[0]])  # freed twice
    with pytest.raises(ValueError):
        paged.BlockAllocator(0)


def test_slot_of_maps_positions_through_the_table():
    table = [7, 2, 9]
    assert [paged.slot_of(p, table, 4) for p in (0, 3, 4, 10)] == [(7, 0), (7, 3), (2, 0), (9, 2)]
    with pytest.raises(IndexError):
        paged.slot_of(12, table, 4)
    with pytest.raises(ValueError):
        paged.slot_of(-1, table, 4)


def test_waste_counts_allocated_minus_used_slots():
    paged_w = paged.waste([5, 8, 1], block_size=4)
    assert paged_w == {"allocated": 20, "used": 14, "wasted": 6, "fraction": 6 / 20}
    pre = paged.waste([5, 8, 1], reserve=16)
    assert pre["allocated"] == 48 and pre["wasted"] == 34
    with pytest.raises(ValueError):
        paged.waste([5], block_size=4, reserve=8)
    with pytest.raises(ValueError):
        paged.waste([20], reserve=16)


# ------------------------------------------------------------------ decode attention through the table

IMPLS = ["torch"] + (["triton"] if paged_attention.TRITON_MISSING is None else [])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("block_size,H,H_kv", [(3, 4, 4), (5, 4, 2), (4, 6, 1)])
def test_paged_decode_equals_contiguous(impl, block_size, H, H_kv):
    lengths = [7, 1, 13, 5]  # ragged, and no block size here divides all of them
    kp, vp, tables, rows = _pool_and_tables(lengths, block_size, H_kv=H_kv, hd=12)
    q = torch.randn(len(lengths), H, 12, generator=torch.Generator().manual_seed(1))
    lens = torch.tensor(lengths)
    if impl == "triton":  # 3 pieces of 4-token tiles: tiles across blocks, and empty pieces for the 1-token row
        got = paged_attention.paged_decode_triton(q, kp, vp, tables, lens, splits=3, tile=4)
        auto = paged_attention.paged_decode_triton(q, kp, vp, tables, lens)  # splits and tile chosen for this device
        torch.testing.assert_close(auto, got, atol=1e-5, rtol=1e-5)
    else:
        got = paged_attention.paged_decode_torch(q, kp, vp, tables, lens)
    want = paged_attention.dense_decode(q, *_dense(kp, vp, rows, lengths, block_size), lens)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # and against PyTorch's SDPA on each sequence alone (GQA by repeating kv heads)
    k, v = _dense(kp, vp, rows, lengths, block_size)
    for b, L in enumerate(lengths):
        kk = k[b, :, :L].repeat_interleave(H // H_kv, 0)
        vv = v[b, :, :L].repeat_interleave(H // H_kv, 0)
        ref = torch.nn.functional.scaled_dot_product_attention(q[b][:, None], kk, vv)[:, 0]
        torch.testing.assert_close(got[b], ref, atol=1e-5, rtol=1e-5)


def _tiny(kv_heads, dtype=torch.float32):
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=4, n_kv_head=kv_heads, d_model=32, d_ff=64, seq_len=48)
    return GPT(cfg).to(dtype).eval()


@pytest.mark.parametrize("impl,kv_heads", [("torch", 4), ("torch", 2), ("torch", 1)]
                         + [(impl, 2) for impl in IMPLS if impl != "torch"])  # the kernel's MHA/MQA: above
def test_gpt_on_the_paged_cache_matches_the_full_forward(impl, kv_heads):
    model = _tiny(kv_heads)
    cache = paged.PagedKVCache.for_model(model, num_blocks=40, block_size=3, impl=impl)
    g = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, 256, (L,), generator=g) for L in (6, 10, 4)]
    with torch.no_grad():
        for i, s in enumerate(seqs):  # ragged prefills, one sequence at a time
            cache.add(i)
            cache.set_batch([i])
            model(s[None, :-3], cache=cache)
        for step in (3, 2, 1):  # then batched decode of the last three tokens of each
            cache.set_batch([2, 0, 1])  # rows in any order
            out, _ = model(torch.stack([seqs[i][-step] for i in (2, 0, 1)])[:, None], cache=cache)
            for row, i in enumerate((2, 0, 1)):
                full, _ = model(seqs[i][None, :len(seqs[i]) - step + 1])
                torch.testing.assert_close(out[row, 0], full[0, -1], atol=1e-5, rtol=1e-5)
    allocated, used = cache.slots()
    assert used == sum(len(s) for s in seqs) and allocated == sum(paged.blocks_for(len(s), 3) for s in seqs) * 3
    for i in range(3):
        cache.free(i)
    assert cache.allocator.num_free == 40


def test_paged_cache_refuses_when_out_of_blocks_and_stays_consistent():
    model = _tiny(2)
    cache = paged.PagedKVCache.for_model(model, num_blocks=3, block_size=4)
    cache.add("a")
    cache.set_batch(["a"])
    with torch.no_grad():
        model(torch.zeros(1, 10, dtype=torch.long), cache=cache)
        with pytest.raises(paged.OutOfBlocks, match="need 1 block"):
            model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    assert cache.lengths["a"] == 10 and cache.allocator.num_used == 3
    with pytest.raises(ValueError, match="already"):
        cache.add("a")
    with pytest.raises(ValueError):
        cache.set_batch(["b"])
    with pytest.raises(ValueError, match="impl"):
        paged.PagedKVCache(1, 1, 4, num_blocks=2, block_size=2, impl="cuda-magic")


# ------------------------------------------------------------------ the request mix and the schedulers

def test_make_requests_is_seeded_and_heavy_tailed():
    a = serving.make_requests(200, seed=3, max_len=256, max_new_tokens=128, prompt_median=16, output_median=16)
    b = serving.make_requests(200, seed=3, max_len=256, max_new_tokens=128, prompt_median=16, output_median=16)
    c = serving.make_requests(200, seed=4, max_len=256, max_new_tokens=128, prompt_median=16, output_median=16)
    assert a == b and a != c
    outs = sorted(r.output_len for r in a)
    assert all(1 <= r.output_len <= 128 and 1 <= len(r.prompt) <= 128 for r in a)
    assert outs[-1] > 4 * outs[len(outs) // 2]  # a long tail: the longest is far above the median
    arrivals = [r.arrival for r in a]
    assert arrivals == sorted(arrivals) and arrivals[-1] > 0
    assert {r.arrival for r in serving.make_requests(5, arrival_rate=None)} == {0}
    with pytest.raises(ValueError):
        serving.make_requests(3, max_len=8, max_new_tokens=8)
    corpus = torch.arange(1000)
    for r in serving.make_requests(20, seed=1, corpus=corpus):  # prompts are slices of the corpus
        assert list(r.prompt) == list(range(r.prompt[0], r.prompt[0] + len(r.prompt)))


@pytest.fixture(scope="module")
def mix():
    model = _tiny(2, torch.float64)  # float64: batched and solo numerics cannot flip a greedy argmax
    reqs = serving.make_requests(10, seed=1, max_len=48, prompt_median=6, output_median=6, max_new_tokens=16,
                                 arrival_rate=0.7)
    solo = {r.rid: serving.solo_tokens(model, r, block_size=4) for r in reqs}
    return model, reqs, solo


@pytest.mark.parametrize("policy,num_blocks", [("static", 40), ("continuous", 40), ("continuous", 9)])
def test_every_request_finishes_once_with_its_solo_tokens(mix, policy, num_blocks):
    model, reqs, solo = mix
    run = serving.serve(model, reqs, policy=policy, num_blocks=num_blocks, block_size=4, max_batch=5,
                        max_new_tokens=16)
    assert sorted(run.finished_order) == sorted(solo)  # each exactly once
    assert run.tokens == solo
    assert all(len(run.tokens[r.rid]) == r.output_len for r in reqs)
    if num_blocks == 9:  # a pool this small forces preemptions, and they lose nothing
        assert run.preemptions > 0
    assert run.peak_blocks <= num_blocks
    assert set(run.ttft) == set(solo) and all(t >= 0 for t in run.ttft.values())


def test_schedules_are_deterministic_and_static_wastes_more(mix):
    model, reqs, _ = mix
    ticks = itertools.count()
    clock = lambda: float(next(ticks))  # noqa: E731  (one tick per reading: iteration times are all 1)
    runs = {}
    for policy in ("static", "continuous"):
        a = serving.serve(model, reqs, policy=policy, num_blocks=40, block_size=4, max_batch=5, max_new_tokens=16,
                          clock=clock)
        b = serving.serve(model, reqs, policy=policy, num_blocks=40, block_size=4, max_batch=5, max_new_tokens=16,
                          clock=clock)
        assert a == b
        runs[policy] = a
    assert runs["static"].waste_fraction > runs["continuous"].waste_fraction
    # with one unit of time per iteration, TTFT counts iterations: continuous admits no later than static
    assert runs["continuous"].percentile("ttft", 50) <= runs["static"].percentile("ttft", 50)
    assert runs["continuous"].iterations < runs["static"].iterations


def test_serve_validates_its_arguments(mix):
    model, reqs, _ = mix
    with pytest.raises(ValueError, match="policy"):
        serving.serve(model, reqs, policy="fifo")
    with pytest.raises(ValueError, match="blocks alone"):
        serving.serve(model, reqs, num_blocks=2, block_size=4, max_new_tokens=16)
    with pytest.raises(ValueError, match="seq_len"):
        serving.serve(model, reqs, max_new_tokens=100)
    with pytest.raises(ValueError, match="max_batch"):
        serving.serve(model, reqs, max_batch=0)


@pytest.mark.skipif(paged_attention.TRITON_MISSING is not None, reason="triton is not installed")
def test_serving_with_the_triton_decode_gives_the_same_tokens():
    model = _tiny(2)
    reqs = serving.make_requests(3, seed=5, max_len=48, prompt_median=5, output_median=4, max_new_tokens=6)
    a = serving.serve(model, reqs, num_blocks=20, block_size=4, max_batch=3, impl="torch")
    b = serving.serve(model, reqs, num_blocks=20, block_size=4, max_batch=3, impl="triton")
    assert a.tokens == b.tokens


def test_notebook_sections_print_their_tables_and_return_consistent_rows(capsys):
    model = _tiny(2)
    out = serving_lab.paged_section(model, block_sizes=[4, 7], n_requests=6, batch=2, context=20, reps=1, show=False)
    waste = {(r["scheme"], r["block size"]): r for r in out["waste"]}
    assert waste[("paged", 4)]["fraction"] < waste[("preallocate prompt + cap", None)]["fraction"] \
        < waste[("preallocate seq_len", None)]["fraction"]
    assert all(r["used"] == waste[("paged", 4)]["used"] for r in out["waste"])  # the same tokens, held differently
    assert all(r["max |err| torch"] < 1e-4 for r in out["speed"])
    text = capsys.readouterr().out
    assert "waste %" in text and out["sentence"] in text
    run = serving_lab.batching_section(model, n_requests=5, max_batch=4, block_size=4, max_new_tokens=8, repeats=2,
                                   show=False)
    assert [r["policy"] for r in run["rows"][:2]] == list(serving.POLICIES)
    tight = run["runs"]["continuous, tight"]
    assert set(run["solo_matches"]) == set(run["runs"]) and all(0 <= k <= 5 for k in run["solo_matches"].values())
    assert run["record"]["tight_preemptions"] == tight.preemptions and tight.peak_blocks <= run["record"]["tight_num_blocks"]
    assert run["speedup"] == pytest.approx(run["runs"]["continuous"].tokens_per_s / run["runs"]["static"].tokens_per_s)
    assert run["record"]["n_requests"] == 5 and 0 <= run["same_tokens"] <= 5 and "2 interleaved runs" in run["noise"]
    with pytest.raises(ValueError, match="block_sizes"):
        serving_lab.paged_section(model, block_sizes=[0])
    with pytest.raises(ValueError, match="max_batch"):
        serving_lab.batching_section(model, max_batch=0)
    with pytest.raises(ValueError, match="repeats"):
        serving_lab.batching_section(model, repeats=0)
    assert run["solo_checked"] == run["record"]["solo_checked"] == 5 and "Against each request served alone" in run["sentence"]


def test_batching_checks_one_request_in_solo_every_against_its_solo_tokens():
    model = _tiny(2, torch.float64)  # float64: batched and solo numerics cannot flip a greedy argmax
    run = serving_lab.batching_section(model, n_requests=5, max_batch=4, block_size=4, max_new_tokens=8,
                                       tight_pool=False, solo_every=2, show=False)
    assert run["solo_checked"] == run["record"]["solo_checked"] == 3  # requests 0, 2 and 4 of the mix
    assert run["solo_matches"] == {"static": 3, "continuous": 3}
    assert "3 of the 5 requests (one in 2, in the order of the mix) served alone" in run["sentence"]
    assert "3 of 3 under static batching" in run["sentence"]
    with pytest.raises(ValueError, match="solo_every"):
        serving_lab.batching_section(model, solo_every=0)


def test_flexattention_paged_helper_agrees_with_our_block_tables():
    lengths, block_size = [7, 1, 13, 5], 4
    kp, vp, tables, _ = _pool_and_tables(lengths, block_size, H_kv=2, hd=16)
    q = torch.randn(len(lengths), 4, 16, generator=torch.Generator().manual_seed(3))
    flex = paged_attention.flex_paged_decode(q, kp, vp, tables, torch.tensor(lengths))
    if flex is None:
        pytest.skip("this torch has no FlexAttention paged helper")
    torch.testing.assert_close(flex, paged_attention.paged_decode_torch(q, kp, vp, tables, torch.tensor(lengths)),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(paged_attention.TRITON_MISSING is not None, reason="triton is not installed")
def test_the_triton_decode_kernel_compiles_for_an_h100_without_a_gpu():
    """The interpreter accepts code the compiler rejects: compile for sm_90 in a process with it off."""
    pytest.importorskip("triton.backends.compiler", reason="this triton has no ahead-of-time compile API")
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("from helpers.decode import paged_attention\nfrom helpers.attention import triton_aot\n"
            "for bs, hd, group in ((12, 48, 3), (16, 128, 1)):\n"
            "    kernel = paged_attention.compile_decode_kernel('bf16', block_size=bs, head_dim=hd, group=group)\n"
            "    r = triton_aot.resources(kernel)\n"
            "    print('compiled', bs, hd, 'spills', r['spill_stores'] + r['spill_loads'])\n"
            "print('combine', paged_attention.compile_decode_kernel(head_dim=128, combine=True).metadata.shared)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"COURSE_TRITON_AOT": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.count("compiled") == 2, done.stderr[-2000:]
    assert done.stdout.count("spills 0") == 2 and "combine" in done.stdout, done.stdout  # registers suffice at head_dim 48 and 128


def test_request_mix_and_serving_estimate():
    lens = serving_lab.request_mix("heavy-tailed", 50, 2048, seed=1)
    assert len(lens) == 50 and all(1 <= n <= 2048 for n in lens)
    est = serving_lab.serving_estimate(lens, 2048, 1000.0, 16, 1e7, 0.0, 100.0)
    assert est["paged"]["reserved_tokens"] == sum(-(-n // 16) * 16 for n in lens)
    assert est["paged"]["waste"] < est["preallocated"]["waste"]
    assert est["paged"]["batch"] >= est["preallocated"]["batch"]
    one = serving_lab.serving_estimate(lens, 2048, 1000.0, 1, 1e12, 0.0, 100.0)
    assert one["paged"]["waste"] == 0.0  # blocks of one token waste nothing
    with pytest.raises(ValueError, match="mix"):
        serving_lab.request_mix("bursty", 3, 10)


def test_serving_panel_callback(capsys):
    est = serving_lab.serving_panel(2, 32, "uniform", 16, weight_bytes_=2.6e9, gbps=100.0)
    assert "paged" in capsys.readouterr().out
    assert est["paged"]["waste"] < est["preallocated"]["waste"]
    more_heads = serving_lab.serving_panel(32, 32, "uniform", 16, weight_bytes_=2.6e9, gbps=100.0, show=False)
    assert more_heads["paged"]["batch"] <= est["paged"]["batch"]  # bigger KV per token: fewer requests fit


def test_paged_waste_verdict_is_not_testable_on_short_requests():
    short = serving_lab.paged_waste_verdict(0.179, 16, 43)
    assert short["verdict"] == "not testable" and "16" in short["reason"]
    assert abs(short["expected"] - 8 / 43) < 1e-12
    assert serving_lab.paged_waste_verdict(0.02, 16, 1000)["verdict"] == "supported"
    assert serving_lab.paged_waste_verdict(0.10, 16, 1000)["verdict"] == "contradicted"
    with pytest.raises(ValueError):
        serving_lab.paged_waste_verdict(0.1, 0, 100)


@pytest.mark.parametrize("block_size", [5, 16])
def test_generation_on_the_paged_cache_equals_the_contiguous_cache(block_size):
    model = _tiny(2)
    prompt = torch.randint(0, 256, (3, 9), generator=torch.Generator().manual_seed(4))
    contiguous = generation.KVCache(model.config, 3, 20)
    pag = paged.factory(block_size)(model.config, 3, 20, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        a, b = generation.prefill(model, prompt, contiguous), generation.prefill(model, prompt, pag)
        for _ in range(4):  # batched prefill, then decode steps, logits compared at each
            torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
            token = a.argmax(-1)
            a, b = generation.decode_one(model, token, contiguous), generation.decode_one(model, token, pag)
    want = generation.generate(model, prompt, 6)
    assert torch.equal(generation.generate(model, prompt, 6, make_cache=paged.factory(block_size)), want)


# ------------------------------------------------------------------ cache dtypes

def _teacher_forced(model, seq, cache, split):
    """Logits (B, S, vocab) of seq through the cache: a prefill of `split` tokens, then one token at a time."""
    with torch.no_grad():
        first = model(seq[:, :split], cache=cache)[0]
        rest = [generation.decode_one(model, seq[:, t], cache)[:, None] for t in range(split, seq.size(1))]
    return torch.cat([first] + rest, 1)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("model_dtype", DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_cache_in_any_dtype_under_a_model_of_any_dtype(impl, model_dtype, dtype):
    model = _tiny(2)
    with torch.no_grad():  # larger weights than the init so that logits are far from ties
        for p in model.parameters():
            p.mul_(3.0)
    model = model.to(model_dtype)
    seq = torch.randint(0, 256, (2, 10), generator=torch.Generator().manual_seed(8))
    make = paged.factory(3, impl)
    cache = make(model.config, 2, 10, dtype=dtype, device="cpu")
    got = _teacher_forced(model, seq, cache, 6).float()
    ref = _teacher_forced(model, seq, make(model.config, 2, 10, dtype=torch.float32, device="cpu"), 6).float()
    assert cache.k_pool.dtype == cache.v_pool.dtype == dtype  # stores in its dtype
    err, scale = float((got - ref).abs().max()), float(ref.abs().max())
    assert err <= tolerance(model_dtype, dtype) * scale
    top2 = ref.topk(2, dim=-1).values  # greedy tokens agree wherever the error cannot swap the top two
    sure = top2[..., 0] - top2[..., 1] > 2 * err
    assert torch.equal(got.argmax(-1)[sure], ref.argmax(-1)[sure])
    tokens = generation.generate(model, seq[:, :6], 3, dtype=dtype, make_cache=make)
    assert tokens.shape == (2, 3)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("q_dtype,pool_dtype", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32),
                                                (torch.float16, torch.bfloat16), (torch.bfloat16, torch.bfloat16)])
def test_paged_decode_reads_query_and_pools_in_their_own_dtypes_and_computes_in_fp32(impl, q_dtype, pool_dtype):
    lengths = [5, 9]
    kp, vp, tables, rows = _pool_and_tables(lengths, 4, H_kv=2, hd=8)
    q = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(3))
    kp, vp, q = kp.to(pool_dtype), vp.to(pool_dtype), q.to(q_dtype)
    lens = torch.tensor(lengths)
    fn = paged_attention.paged_decode_triton if impl == "triton" else paged_attention.paged_decode_torch
    got = fn(q, kp, vp, tables, lens)
    want = paged_attention.paged_decode_torch(q.float(), kp.float(), vp.float(), tables, lens)  # same values, fp32
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_paged_cache_refuses_a_dtype_it_cannot_hold_or_compute_in():
    for bad in (torch.int8, torch.float8_e4m3fn, "bf16"):
        with pytest.raises(ValueError, match="cannot hold a KV cache; choose one of torch.float32"):
            paged.PagedKVCache(1, 1, 4, num_blocks=2, block_size=2, dtype=bad)
    paged.PagedKVCache(1, 1, 4, num_blocks=2, block_size=2, dtype=torch.float64)  # the PyTorch path: fp64
    if paged_attention.TRITON_MISSING is None:
        with pytest.raises(ValueError, match="float64 cannot run with impl='triton'"):
            paged.PagedKVCache(1, 1, 4, num_blocks=2, block_size=2, dtype=torch.float64, impl="triton")
        kp, vp, tables, _ = _pool_and_tables([3], 2, H_kv=1, hd=4)
        with pytest.raises(ValueError, match="reads float32, bfloat16 or float16 tensors, not torch.float64"):
            paged_attention.paged_decode_triton(torch.randn(1, 1, 4, dtype=torch.float64), kp, vp, tables,
                                                torch.tensor([3]))


def test_the_head_dim_64_kernel_check_agrees_with_pytorch_and_uses_eight_warps():
    if paged_attention.TRITON_MISSING:
        pytest.skip(paged_attention.TRITON_MISSING)
    assert paged_attention.decode_warps(64, 64) == 8
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter on a CPU
    assert paged_attention.check_triton_decode(64, dtype=torch.float32, device=device) < 1e-4
