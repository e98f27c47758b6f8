"""One home per quantity: each function that defines a course-wide quantity (the bytes a decode step reads, the
copy ceiling, a range's verdict, the held-out loss noise, a GPU sync, list parameters, number formats) is
defined in exactly one module of helpers/, and no notebook's lab imports another part of the course's lab."""
import ast
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
HELPERS = ROOT / "helpers"

# a definition (regular expression over a module's source) -> the one module allowed to hold it (None: none may)
HOMES = {
    r"^def weight_bytes\(model": None,
    r"^def model_bytes\(": None,
    r"^def copy_ceiling\(": None,
    r"^def copy_gbps_on\(": None,
    r"^def copy_bandwidth\(": None,
    r"^def _sync\(": None,
    r"^def positive_ints\(": None,
    r"^def _not_a_string\(": None,
    r"^def decode_step_bytes\(": "gpt/footprint.py",
    r"^def storage_bytes\(": "gpt/footprint.py",
    r"^def tensor_bytes\(": "gpt/footprint.py",
    r"^def bandwidth_ceiling\(": "measure/ceilings.py",
    r"^def copy_size\(": "measure/ceilings.py",
    r"^def paired_ratio\(": "measure/protocol.py",
    r"^def judge_interval\(": "measure/claims.py",
    r"^def sync\(": "measure/bench.py",
    r"^def window_losses\(": "gpt/heldout.py",
    r"^def loss_gap\(": "gpt/heldout.py",
    r"^def gap_separated\(": "gpt/heldout.py",
    r"^def yardstick\(": "gpt/heldout.py",
    r"^def compare_losses\(": "gpt/heldout.py",
    r"^NOISE_K\b": "gpt/heldout.py",
    r"^def percent\(": "show/units.py",
    r"^def fmt_bytes\(": "show/units.py",
    r"^def fmt_seconds\(": "show/units.py",
}


def _modules() -> dict[str, str]:
    return {p.relative_to(HELPERS).as_posix(): p.read_text() for p in sorted(HELPERS.rglob("*.py"))}


@pytest.mark.parametrize("pattern", sorted(HOMES))
def test_each_quantity_is_defined_in_its_home_only(pattern):
    where = sorted(name for name, text in _modules().items() if re.search(pattern, text, re.MULTILINE))
    home = HOMES[pattern]
    assert where == ([home] if home else []), (
        f"{pattern!r} is defined in {where}; its one home is {home or 'nowhere (a home elsewhere replaced it)'}")


def test_the_homes_exist_and_hold_their_definitions():
    modules = _modules()
    for pattern, home in HOMES.items():
        if home:
            assert re.search(pattern, modules[home], re.MULTILINE), (pattern, home)


def _lab_imports(name: str, text: str) -> set[str]:
    """The `*_lab` modules of helpers/ that module `name` (a path under helpers/) imports."""
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("helpers."):
            mods = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            mods = [a.name for a in node.names if a.name.startswith("helpers.")]
        else:
            continue
        found |= {m for m in mods if m.rsplit(".", 1)[-1].endswith("_lab")}
    return found


def test_no_lab_imports_the_lab_of_another_part_of_the_course():
    crossing = []
    for name, text in _modules().items():
        package = name.split("/")[0]
        if not Path(name).stem.endswith("_lab"):
            continue
        crossing += [f"{name} imports {m}" for m in sorted(_lab_imports(name, text)) if m.split(".")[1] != package]
    assert not crossing, "what two notebooks share belongs in a technique module or helpers.measure: " + "; ".join(crossing)


def _tiny(**over):
    from helpers.gpt.model import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig.preset("tiny", **over)).eval()


def _kv(model, tokens: int) -> int:
    cfg, p = model.config, next(model.parameters())
    return 2 * cfg.n_layer * tokens * cfg.n_kv_head * cfg.head_dim * p.element_size()


def test_notebooks_08_10_11_and_14_count_the_same_bytes_for_the_same_model():
    """The bytes a decode step reads, as each notebook's code reports them, all come from
    `footprint.decode_step_bytes`: notebook 10's decode rows, 14's ladder rungs, 08's CPU decode rows (fp32 and
    int8 weight-only), and 11's cell (it calls the footprint itself)."""
    from helpers.capstone import serve_stack_lab, serve_stack
    from helpers.decode import kv_decode_lab
    from helpers.gpt.footprint import decode_step_bytes
    from helpers.lowbit import quant_decode_lab

    model = _tiny()
    fp32, int8 = decode_step_bytes(model), decode_step_bytes(serve_stack.weight_only(model, 8))
    assert int8 < fp32 / 2
    # notebook 10: one decode step's row, less the K/V it reads
    row = kv_decode_lab.decode_case(model, 8, 2, "tiny")[1]
    assert row["bytes"] - 2 * _kv(model, 9) == fp32
    # notebook 14: the serving ladder's weight bytes per rung
    rungs, _ = serve_stack_lab.rungs_for("cpu", compile=False)
    built = serve_stack.build([r for r in rungs if r.name in ("kv_cache", "bf16")] + [serve_stack.alone("int8")],
                              model, None, max_len=40)
    assert built["kv_cache"].weight_bytes == fp32 and built["int8 alone"].weight_bytes == int8
    assert built["bf16"].weight_bytes == fp32 // 2
    # notebook 08: the CPU decode rows (the same seeded tiny GPT), less the K/V of prompt + 1 tokens
    fused = quant_decode_lab.CPU_DECODE_VARIANTS[1]
    res = quant_decode_lab.cpu_decode("tiny", prompt=4, variants=("fp32", fused), timer=lambda fn: (fn(), 0.01)[1],
                                      budget_s=0.5, max_reps=5, max_warmup=3)
    rows = {r["variant"]: r["bytes"] - _kv(model, 5) for r in res["rows"]}
    assert rows == {"fp32": fp32, fused: int8}
    # notebook 11: its cell counts the target's bytes with the footprint itself
    nb11 = (ROOT / "notebooks" / "11_speculative_decoding.ipynb").read_text()
    assert "footprint.decode_step_bytes(" in nb11


def test_the_goals_take_the_copy_ceiling_by_the_one_rule():
    """The maintainers' goals quote GB/s against the same ceiling as the notebooks: no copy of their own."""
    tools = sorted((ROOT / "tools").rglob("*.py"))
    assert tools, "tools/ is missing"
    own = [p.name for p in tools if "measure_copy_bandwidth(" in p.read_text()]
    assert own == []
    assert "ceilings.bandwidth_ceiling(" in (ROOT / "tools" / "capture" / "goal_base.py").read_text()
