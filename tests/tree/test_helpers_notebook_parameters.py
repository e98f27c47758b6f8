"""Every notebook's parameters, through its lab's `resolve_parameters`: the committed defaults pass in both
profiles, and each parameter is tried at and beyond its bounds (the last value that works passes, the first
that a later cell could not use raises a ValueError naming the parameter). Where a bound comes from the
code that consumes the value (a group size that must tile the layers, a budget that must hold the weights),
a test also shows that code failing just past the bound, so that the bound is the real one.

No kernel is started: the parameters cell is read from the notebook and the lab is called directly.
"""
import inspect
import math
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from helpers.attention import flash_lab
from helpers.capstone import stack_lab
from helpers.cost import hardware_lab, mfu_lab, roofline_lab
from helpers.dataload import loading, loading_lab
from helpers.decode import kv_cache, kv_cache_lab, speculative_lab
from helpers.fusion import compiler_lab
from helpers.gpt import data
from helpers.gpt.model import GPT, GPTConfig
from helpers.lowbit import fp8_lab, gptq, quant, quant_lab, quant_linear
from helpers.measure import hardware, params
from helpers.parallel import collectives, collectives_lab
from helpers.training import accumulation_lab, checkpointing_lab, precision_lab

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = {p.name[:2]: p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))}
LABS = {"00": hardware_lab, "01": roofline_lab, "02": mfu_lab, "03": precision_lab, "04": checkpointing_lab,
        "05": accumulation_lab, "06": flash_lab, "07": fp8_lab, "08": quant_lab, "09": compiler_lab, "10": kv_cache_lab,
        "11": speculative_lab, "12": loading_lab, "13": collectives_lab, "14": stack_lab}
COMMON = ("PROFILE", "SEED", "INTERACTIVE", "RESULTS_DIR")  # params.setup's, not the lab's
ABOVE, BELOW = (lambda x: math.nextafter(x, math.inf)), (lambda x: math.nextafter(x, -math.inf))
ABOVE32 = lambda x: float(np.nextafter(np.float32(x), np.float32(np.inf)))  # noqa: E731  the next fp32 value


def notebook_cells(nb: str) -> tuple[str, str]:
    """The source of notebook `nb`'s parameters cell and of the cell after it (its setup cell)."""
    cells = nbformat.read(NOTEBOOKS[nb], as_version=4).cells
    i = next(i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", []))
    return cells[i].source, cells[i + 1].source


def defaults(nb: str) -> dict:
    """The committed values of notebook `nb`'s own parameters (the common four left out)."""
    ns: dict = {}
    exec(notebook_cells(nb)[0], ns)
    return {k: v for k, v in ns.items() if k.isupper() and k not in COMMON}


def setup(tmp_path, profile: str = "smoke", device: str = "cpu", seed: int = 0) -> params.Setup:
    """A Setup as params.setup returns it, without seeding the RNGs or pointing the records anywhere."""
    return params.Setup(profile=profile, device=device, seed=seed, interactive=False, results_dir=tmp_path)


def resolve(nb: str, S: params.Setup, **overrides) -> dict:
    return LABS[nb].resolve_parameters(S, **(defaults(nb) | overrides))


def refused(nb: str, S: params.Setup, name: str, **overrides) -> str:
    """The message of the ValueError that notebook `nb`'s validation raises for `overrides`; it names `name`."""
    with pytest.raises(ValueError) as err:
        resolve(nb, S, **overrides)
    message = str(err.value)
    assert name in message, message
    assert message.count("\n") == 0 and len(message) < 400, message  # one sentence, not a traceback
    return message


# ---------------------------------------------------------------- every notebook, defaults

def test_every_notebook_has_a_lab_that_resolves_exactly_its_parameters():
    assert sorted(NOTEBOOKS) == sorted(LABS) == [f"{i:02d}" for i in range(15)]
    for nb, lab in LABS.items():
        names = [p.name for p in inspect.signature(lab.resolve_parameters).parameters.values()
                 if p.kind is inspect.Parameter.KEYWORD_ONLY]
        assert sorted(names) == sorted(defaults(nb)), nb
        setup_cell = notebook_cells(nb)[1]
        assert f"params.fill(globals(), {lab.__name__.split('.')[-1]}.resolve_parameters, S)" in setup_cell, nb
        assert "S.resolve(" not in setup_cell and "raise ValueError" not in setup_cell, nb  # nothing left inline


@pytest.mark.parametrize("profile", ["smoke", "full"])
@pytest.mark.parametrize("nb", sorted(LABS))
def test_the_committed_defaults_pass(nb, profile, tmp_path):
    got = LABS[nb].resolve_parameters(setup(tmp_path, profile), **defaults(nb))
    assert set(defaults(nb)) <= set(got)
    assert all(got[k] is not None for k in defaults(nb) if k not in ("TRAIN_STEPS", "MEMORY_BUDGET_GB"))


@pytest.mark.parametrize("nb", sorted(LABS))
def test_every_parameter_refuses_a_negative_number_and_a_stray_string_naming_itself(nb, tmp_path):
    S = setup(tmp_path)
    for name in defaults(nb):
        for bad in (-1, "?"):
            refused(nb, S, name, **{name: bad})


# ---------------------------------------------------------------- at and beyond each bound

CASES = [  # (notebook, overrides, None: passes | the parameter the ValueError must name)
    ("00", dict(DTYPES=["fp32"]), None),
    ("00", dict(DTYPES=["tf32", "fp8"]), "DTYPES"),  # nothing of it runs on a CPU: nothing would be timed
    ("00", dict(MATMUL_SIZES=[1]), None), ("00", dict(MATMUL_SIZES=[0]), "MATMUL_SIZES"),
    ("00", dict(COPY_SIZES_MB=[4 / 2**20]), None), ("00", dict(COPY_SIZES_MB=[3 / 2**20]), "COPY_SIZES_MB"),
    ("00", dict(COPY_SIZES_MB=[1, 16]), None), ("00", dict(REPS=1), None), ("00", dict(REPS=0), "REPS"),
    ("01", dict(N=1), None), ("01", dict(N=0), "N"), ("01", dict(DTYPE="fp8"), "DTYPE"),
    ("02", dict(ASSUMED_MFU=1.0), None), ("02", dict(ASSUMED_MFU=ABOVE(1.0)), "ASSUMED_MFU"),
    ("02", dict(ASSUMED_MFU=5e-324), None), ("02", dict(ASSUMED_MFU=0.0), "ASSUMED_MFU"),
    ("02", dict(ASSUMED_MFU=math.nan), "ASSUMED_MFU"), ("02", dict(N_GPUS=1), None), ("02", dict(N_GPUS=0), "N_GPUS"),
    ("02", dict(SUB_PASS="backward"), "SUB_PASS"), ("02", dict(MODELS=["tiny", "huge"]), "MODELS"),
    ("03", dict(INIT_SCALE=precision_lab.FP32_MAX), None),
    ("03", dict(INIT_SCALE=ABOVE(precision_lab.FP32_MAX)), "INIT_SCALE"),
    ("03", dict(INIT_SCALE=math.inf), "INIT_SCALE"), ("03", dict(INIT_SCALE=1), None),
    ("03", dict(LR=math.nan), "LR"), ("03", dict(LR=math.inf), "LR"), ("03", dict(LR=5e-324), None),
    ("03", dict(LOG2_SCALES=[0, 100]), None), ("03", dict(LOG2_SCALES=[101]), "LOG2_SCALES"),
    ("03", dict(STEPS=1), None), ("03", dict(STEPS=0), "STEPS"), ("03", dict(GROWTH_INTERVAL=1), None),
    ("04", dict(BUDGET_MB=5e-324), None), ("04", dict(BUDGET_MB=math.inf), "BUDGET_MB"),
    ("04", dict(BUDGET_MB=math.nan), "BUDGET_MB"), ("04", dict(K=1, N_LAYER=1), None), ("04", dict(K=0), "K"),
    ("04", dict(ATTN="flash"), "ATTN"),
    ("05", dict(SEQ_LEN=128), None), ("05", dict(SEQ_LEN=129), "SEQ_LEN"),  # tiny's seq_len
    ("05", dict(MICRO_BATCHES=[16]), None), ("05", dict(MICRO_BATCHES=[32]), "MICRO_BATCHES"),
    ("05", dict(MICRO_BATCHES=[3]), "MICRO_BATCHES"),
    ("05", dict(CHECK_ACCUM_STEPS=2), None), ("05", dict(CHECK_ACCUM_STEPS=1), "CHECK_ACCUM_STEPS"),
    ("06", dict(HEAD_DIMS=[16, 128]), None), ("06", dict(HEAD_DIMS=[15]), "HEAD_DIMS"),
    ("06", dict(HEAD_DIMS=[129]), "HEAD_DIMS"), ("06", dict(MEMORY_BUDGET_GB=math.nan), "MEMORY_BUDGET_GB"),
    ("06", dict(MEMORY_BUDGET_GB=5e-324), None), ("06", dict(BLOCK_SIZES=[1, 48]), None),  # PyTorch tiles: any size
    ("07", dict(OUTLIER=fp8_lab.MAX_OUTLIER), None), ("07", dict(OUTLIER=ABOVE(fp8_lab.MAX_OUTLIER)), "OUTLIER"),
    ("07", dict(OUTLIER=1e40), "OUTLIER"),  # reported: NaN errors, then a numpy error in the sweep's figure
    ("07", dict(OUTLIER=math.nan), "OUTLIER"), ("07", dict(OUTLIER=5e-324), None),
    ("07", dict(STEPS=2), None), ("07", dict(STEPS=1), "STEPS"), ("07", dict(LR=math.inf), "LR"),
    ("07", dict(LAYER="blocks.1.attn.out_proj"), None), ("07", dict(LAYER="lm_head"), "LAYER"),
    ("07", dict(BLOCK=1, HISTORY_LEN=1), None),
    ("08", dict(GROUPS=["tensor", "channel", 128]), None), ("08", dict(GROUPS=[256]), "GROUPS"),
    ("08", dict(GROUPS=[48]), "GROUPS"),  # reported: 48 does not tile tiny's 128-wide layers (weight errors cell)
    ("08", dict(GROUPS=[1]), None), ("08", dict(GROUPS=["channel", "tensor"]), "GROUPS"),
    ("08", dict(GROUPS=["tensor"]), "GROUPS"), ("08", dict(GROUPS=[]), "GROUPS"),
    ("08", dict(BLOCKSIZE=128), None), ("08", dict(BLOCKSIZE=32), None),
    ("08", dict(BLOCKSIZE=256), "BLOCKSIZE"),  # reported: GPTQ's groups of 256 do not tile 128 inputs
    ("08", dict(BLOCKSIZE=16), "BLOCKSIZE"), ("08", dict(BLOCKSIZE=96), "BLOCKSIZE"),
    ("08", dict(MODEL="small10m", GROUPS=["channel", 128, 16]), None),
    ("08", dict(MODEL="small10m", GROUPS=[48]), "GROUPS"),  # tiles 384, but NF4 blocks are powers of two
    ("08", dict(MODEL="small10m", BLOCKSIZE=128), None), ("08", dict(MODEL="small10m", BLOCKSIZE=256), "BLOCKSIZE"),
    ("08", dict(THRESHOLD=6), None), ("08", dict(THRESHOLD=math.inf), "THRESHOLD"),
    ("08", dict(THRESHOLD=1.0), "THRESHOLD"),  # every column an outlier: the error reduction divides by zero
    ("09", dict(MODES=[]), None), ("09", dict(MODES=["default"]), None),
    ("09", dict(MODES=["reduce-overhead"]), "MODES"), ("09", dict(DTYPE="bf16"), "DTYPE"),
    ("09", dict(N_LAYER=1, ROWS=1, COLS=1), None), ("09", dict(SOFTMAX_COLS=[]), "SOFTMAX_COLS"),
    ("10", dict(BUDGET_GB=2), "BUDGET_GB"),  # reported: a ZeroDivisionError in the budget table
    ("10", dict(BUDGET_GB=math.inf), "BUDGET_GB"), ("10", dict(BUDGET_GB=kv_cache_lab.min_budget_gb()), None),
    ("10", dict(BUDGET_GB=BELOW(kv_cache_lab.min_budget_gb())), "BUDGET_GB"),
    ("10", dict(PROMPT_LEN=2), None), ("10", dict(PROMPT_LEN=1), "PROMPT_LEN"),
    ("10", dict(PROMPT_LEN=120, NEW_TOKENS=7), None), ("10", dict(PROMPT_LEN=121, NEW_TOKENS=1), "PROMPT_LEN"),
    ("10", dict(PROMPT_LEN=2, NEW_TOKENS=107), None), ("10", dict(PROMPT_LEN=2, NEW_TOKENS=108), "NEW_TOKENS"),
    ("10", dict(PROMPT_LEN=100, NEW_TOKENS=27), None), ("10", dict(PROMPT_LEN=100, NEW_TOKENS=28), "NEW_TOKENS"),
    ("10", dict(POSITIONS=[1, 127]), None), ("10", dict(POSITIONS=[128]), "POSITIONS"),
    ("10", dict(RANKS=[1, 128]), None), ("10", dict(RANKS=[129]), "RANKS"), ("10", dict(TRAIN_STEPS=1), None),
    ("10", dict(COMPILE_LAYERS=1), None), ("10", dict(COMPILE_LAYERS=0), "COMPILE_LAYERS"),
    ("11", dict(DRAFT_WIDTH=2), None), ("11", dict(DRAFT_WIDTH=63), "DRAFT_WIDTH"),
    ("11", dict(PROMPT_LEN=32, NEW_TOKENS=91, GAMMAS=[4]), None),  # 32 + 91 + 4 + 1 = tiny's 128
    ("11", dict(PROMPT_LEN=32, NEW_TOKENS=92, GAMMAS=[4]), "NEW_TOKENS"),
    ("11", dict(THRESHOLD=1.0), "THRESHOLD"), ("11", dict(THRESHOLD=0.999), None),
    ("11", dict(TEMPERATURES=[0]), None), ("11", dict(TEMPERATURES=[math.inf]), "TEMPERATURES"),
    ("12", dict(N_DOCS=10), "N_DOCS"),  # reported: an IndexError in the packing check
    ("12", dict(N_DOCS=72), None), ("12", dict(N_DOCS=71), "N_DOCS"),  # 1 + 8 batches of BATCH=8 (smoke's BATCHES)
    ("12", dict(N_DOCS=144, BATCHES=[4, 16]), None),  # 1 + 8 batches of 16 (BATCHES' largest)
    ("12", dict(N_DOCS=143, BATCHES=[4, 16]), "N_DOCS"), ("12", dict(N_DOCS=143, BATCHES=[4, 16], WORKERS=[0]), None),
    ("12", dict(ROW_LEN=8, MEDIAN_LEN=7), None), ("12", dict(ROW_LEN=7, MEDIAN_LEN=6), "ROW_LEN"),
    ("12", dict(MEDIAN_LEN=63), None), ("12", dict(MEDIAN_LEN=64), "MEDIAN_LEN"),
    ("12", dict(LATENCY_MS=0), None), ("12", dict(LATENCY_MS=math.inf), "LATENCY_MS"),
    ("13", dict(MSG_SIZES=[1024]), "MSG_SIZES"),  # reported: the α-β fit needs two sizes
    ("13", dict(MSG_SIZES=[1024, 1024]), "MSG_SIZES"), ("13", dict(MSG_SIZES=[4, 8]), None),
    ("13", dict(MSG_SIZES=[2, 8]), "MSG_SIZES"), ("13", dict(MSG_SIZES=[1026, 2048]), "MSG_SIZES"),
    ("13", dict(WORLD_SIZE=2, MEMORY_RANKS=[2]), None), ("13", dict(WORLD_SIZE=1), "WORLD_SIZE"),
    ("13", dict(MEMORY_RANKS=[1, 2]), "MEMORY_RANKS"), ("13", dict(STAGE_MS=math.inf), "STAGE_MS"),
    ("13", dict(STAGE_MS=5e-324), None), ("13", dict(TORCHRUN="yes"), "TORCHRUN"),
    ("14", dict(STEPS=5, WARMUP=2), None), ("14", dict(STEPS=4, WARMUP=2), "STEPS"),  # 3 timed steps at least
    ("14", dict(MICRO_BATCHES=8), None), ("14", dict(MICRO_BATCHES=3), "MICRO_BATCHES"),  # BATCH=8
    ("14", dict(COMPILE=True), None), ("14", dict(COMPILE="yes"), "COMPILE"), ("14", dict(LR=math.inf), "LR"),
]


@pytest.mark.parametrize("nb, overrides, name", CASES, ids=lambda x: re.sub(r"\s+", "", repr(x))[:60])
def test_each_bound(nb, overrides, name, tmp_path):
    S = setup(tmp_path)
    if name is None:
        got = resolve(nb, S, **overrides)
        assert all(got[k] == pytest.approx(v) or got[k] == v for k, v in overrides.items()
                   if not isinstance(v, (list, str))), (got, overrides)
    else:
        refused(nb, S, name, **overrides)


def test_the_reported_cases_say_what_would_work(tmp_path):
    S = setup(tmp_path)
    assert "at most 2.0**64" in refused("07", S, "OUTLIER", OUTLIER=1e40)
    assert "divisors of 128" in refused("08", S, "GROUPS", GROUPS=[48])
    assert "32, 64, 128" in refused("08", S, "BLOCKSIZE", BLOCKSIZE=256)
    assert f"at least {kv_cache_lab.min_budget_gb():.10g} GB" in refused("10", S, "BUDGET_GB", BUDGET_GB=2)
    assert "at least 72" in refused("12", S, "N_DOCS", N_DOCS=10)
    assert "two distinct message sizes" in refused("13", S, "MSG_SIZES", MSG_SIZES=[1024])


def test_an_fp8_matmul_sweep_on_a_gpu_with_fp8_needs_multiples_of_16(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "capabilities", lambda: {"cuda": True, "tf32": True, "bf16": True, "fp8": True})
    S = setup(tmp_path, device="cuda")
    assert resolve("00", S, MATMUL_SIZES=[16, 48])["MATMUL_SIZES"] == [16, 48]
    assert "multiples of 16" in refused("00", S, "MATMUL_SIZES", MATMUL_SIZES=[16, 40])
    assert resolve("00", S, DTYPES=["bf16"], MATMUL_SIZES=[40])["MATMUL_SIZES"] == [40]  # no fp8: any size


def test_compiled_triton_tiles_are_powers_of_two_from_16(tmp_path, monkeypatch):
    assert not flash_lab.triton_compiled("cpu")  # a CPU tiles with the PyTorch version (see CASES)
    monkeypatch.setattr(flash_lab, "triton_compiled", lambda device: True)
    S = setup(tmp_path)
    assert resolve("06", S, BLOCK_SIZES=[16, 256])["BLOCK_SIZES"] == [16, 256]
    for bad in ([8], [48], [16, 96]):
        refused("06", S, "BLOCK_SIZES", BLOCK_SIZES=bad)


def test_the_int8_threshold_floor_follows_the_seed(tmp_path):
    floors = {seed: quant_lab.int8_threshold_floor(seed) for seed in (0, 3)}
    assert floors[0] != floors[3] and all(1 < f < 6 for f in floors.values())
    for seed, floor in floors.items():
        S = setup(tmp_path, seed=seed)
        assert resolve("08", S, THRESHOLD=ABOVE32(floor))["THRESHOLD"] == ABOVE32(floor)
        for bad in (floor, ABOVE(floor)):  # the input is fp32: a threshold within its rounding of the floor is the floor
            refused("08", S, "THRESHOLD", THRESHOLD=bad)


def test_the_corpus_bounds_the_documents(tmp_path):
    S = setup(tmp_path)
    kw = dict(ROW_LEN=64, MEDIAN_LEN=24)
    lengths = loading.document_lengths(10**6, median=24, sigma=1.0, min_len=8, max_len=64, seed=0)
    most = int(np.searchsorted(np.cumsum(lengths), len(data.load_corpus("train")), side="right"))
    assert resolve("12", S, N_DOCS=most, **kw)["N_DOCS"] == most
    assert "the corpus has" in refused("12", S, "N_DOCS", N_DOCS=most + 1, **kw)


# ---------------------------------------------------------------- the bounds are where the consumers fail

def test_an_outlier_past_the_bound_turns_the_errors_to_nan():
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)) * 8  # an amax near 30, as in the GPT
    for outlier, finite in ((fp8_lab.MAX_OUTLIER, True), (1e40, False)):
        planted = fp8_lab.plant_outlier(x, outlier)
        rows = fp8_lab.error_rows({"x": planted}, masks={"x": planted != x})
        assert all(math.isfinite(r["row_rel_error"]) for r in rows) is finite, (outlier, rows)


def test_groups_past_the_layer_width_do_not_tile_the_layers():
    with torch.device("meta"):
        linears = gptq.block_linears(GPT(GPTConfig.preset("tiny"))).values()
    width = quant_lab.layer_width("tiny")
    assert width == 128 and quant_lab.layer_width("small10m") == 384
    weights = [torch.randn(lin.out_features, lin.in_features) for lin in linears]
    for w in weights:
        quant.quantize(w, 4, "zeropoint", width)  # the largest group that works
    for bad in (48, 256):
        with pytest.raises(ValueError, match="does not divide"):
            for w in weights:
                quant.quantize(w, 4, "zeropoint", bad)
    with pytest.raises(ValueError, match="power of two"):
        quant.nf4_quantize(torch.randn(384, 384), 48)


def test_a_threshold_at_the_floor_leaves_no_int8_error():
    x = quant_linear.planted_outliers(**quant_lab.PLANTED, seed=0)
    w = 0.05 * torch.randn(128, 256, generator=torch.Generator().manual_seed(0))
    floor = quant_lab.int8_threshold_floor(0)
    errors = {th: quant.error(x @ w.T, quant_linear.llm_int8_matmul(x, w, th)[0])
              for th in (floor, ABOVE(floor), ABOVE32(floor))}
    assert errors[floor] == errors[ABOVE(floor)] == 0.0 < errors[ABOVE32(floor)]  # GAIN divides by the last


def test_the_smallest_budget_fits_one_token_of_every_variant():
    cfg = GPTConfig.preset(kv_cache_lab.BUDGET_PRESET)
    variants = kv_cache.variant_configs(cfg, kv_cache_lab.BUDGET_RANK)
    weights, token = kv_cache_lab.budget_need()
    assert weights > 2e9  # the 1.3b GPT's bf16 weights: the reported BUDGET_GB=2 cannot hold them
    at = kv_cache.budget_rows(cfg, variants, kv_cache_lab.min_budget_gb() * 1e9, weights, 2)
    below = kv_cache.budget_rows(cfg, variants, BELOW(kv_cache_lab.min_budget_gb()) * 1e9, weights, 2)
    assert min(r[2] for r in at) >= 1 and below[0][2] == 0  # the table divides by below[0][2]


def test_too_few_documents_run_a_loader_dry():
    assert loading_lab.documents_needed(8, 4, [4, 16], [0, 2]) == 80
    assert loading_lab.documents_needed(8, 4, [4, 16], [0]) == 40
    assert loading_lab.documents_needed(8, 1, [8], [2]) == 32  # the packing examples: 4 x BATCH
    store = loading.DocumentStore(np.arange(16 * 79, dtype=np.uint8) % 200, np.full(79, 16), "numpy")
    loader = loading.make_loader(loading.DocumentDataset(store), batch_size=16, row_len=64)
    assert len(loader) == 4  # 79 documents give 4 full batches of 16, one short of 1 + STEPS = 5


def test_one_message_size_cannot_be_fitted():
    with pytest.raises(ValueError, match="two distinct sizes"):
        collectives.alpha_beta_fit([1024], [1e-5])
    assert collectives.alpha_beta_fit([4, 8], [1e-5, 2e-5])[1] > 0


# ---------------------------------------------------------------- sizes that cannot fit, refused before any allocation

@pytest.mark.parametrize("nb, big", [("03", dict(SEQ_LEN=10**9)), ("04", dict(SEQ_LEN=10**9)),
                                     ("07", dict(SEQ_LEN=10**9)), ("09", dict(SEQ_LEN=10**9)),
                                     ("14", dict(SEQ_LEN=10**9)), ("05", dict(EFFECTIVE_BATCH=2**40, MICRO_BATCHES=[2**40]))])
def test_a_size_whose_memory_floor_does_not_fit_is_refused_naming_the_parameter(nb, big, tmp_path):
    name = next(iter(big)) if nb != "05" else "MICRO_BATCHES"
    with pytest.raises(ValueError, match=rf"{name}=.*GB is free on this cpu"):
        LABS[nb].resolve_parameters(setup(tmp_path), **{**defaults(nb), **big})


def test_the_training_floor_counts_parameters_and_kept_activations():
    from helpers.gpt import footprint

    cfg = GPTConfig.preset("tiny")
    model = GPT(cfg)
    floor = footprint.training_floor_bytes(cfg, 4)
    assert 16 * model.num_params(non_embedding=False) * 0.9 <= floor - 4 * 4 * cfg.seq_len * cfg.d_model * cfg.n_layer
    assert footprint.training_floor_bytes(GPTConfig.preset("tiny", seq_len=10**9), 1) > 10**12  # the position table
