"""helpers.fusion.dynamo: each planted graph break found and gone after its fix, recompilations counted for a
scripted sequence of shapes, the logs TORCH_LOGS prints captured and parsed, fullgraph=True's refusal."""
import pytest
import torch

from helpers.fusion import dynamo


@pytest.mark.parametrize("which", list(dynamo.BREAKS))
def test_explain_finds_each_planted_break_and_none_after_the_fix(which):
    broken, fixed = dynamo.BREAKS[which]
    x = torch.randn(4, 6)
    before, after = dynamo.explain(broken, x), dynamo.explain(fixed, x)
    assert (before["graphs"], before["breaks"], len(before["reasons"])) == (2, 1, 1)
    assert (after["graphs"], after["breaks"], after["reasons"]) == (1, 0, [])
    word = {"print": "builtin", "item": "item()", "branch": "jump"}[which]
    assert word in before["reasons"][0]
    torch.testing.assert_close(fixed(x), broken(x))  # the fix computes the same thing


@pytest.mark.slow
def test_recompile_counts_for_a_scripted_shape_sequence():
    sizes = [8, 8, 16, 32, 5]
    auto = dynamo.count_compiles(sizes)
    assert auto["after_each"] == [1, 1, 2, 2, 2]  # static for 8, then one dynamic graph for every other size
    assert dynamo.count_compiles(sizes, dynamic=False)["after_each"] == [1, 1, 2, 3, 4]  # one per new size
    assert dynamo.count_compiles(sizes, mark_dynamic=True)["compiles"] == 1
    limited = dynamo.count_compiles([8, 16, 32, 5, 6, 7], dynamic=False, limit=2)
    assert limited["compiles"] == 2  # past the limit Dynamo stops compiling and runs the function eagerly
    with pytest.raises(ValueError, match="sizes"):
        dynamo.count_compiles([1, 8])


def test_captured_logs_hold_what_torch_logs_prints_and_are_reset_after():
    with dynamo.captured_logs(graph_breaks=True, recompiles=True) as lines:
        torch.compile(dynamo.fresh_copy(dynamo.with_branch), backend="eager")(torch.randn(8, 16))
        f = torch.compile(dynamo.fresh_copy(dynamo.fixed_print), backend="eager", dynamic=False)
        f(torch.randn(8, 16)), f(torch.randn(16, 16))
    logs = dynamo.log_entries(lines)
    assert any("Graph break" in m for m in logs["graph_breaks"])
    assert sum(m.startswith("Recompiling") for m in logs["recompiles"]) == 1  # one new size, one recompile
    with dynamo.captured_logs() as quiet:  # nothing asked: nothing logged
        torch.compile(dynamo.fresh_copy(dynamo.with_branch), backend="eager")(torch.randn(8, 16))
    assert dynamo.log_entries(quiet).get("graph_breaks", []) == []
    with pytest.raises(ValueError, match="unknown log artifact"):
        with dynamo.captured_logs(graph_brakes=True):
            pass


def test_log_entries_parse_the_prefix_and_skip_other_lines():
    lines = ["V1202 00:28:58.359000 6218 torch/_dynamo/symbolic_convert.py:5124] [0/0] [__graph_breaks] Graph break in user code",
             "V1202 00:29:00.256000 6218 torch/_dynamo/guards.py:5396] [2/1] [__recompiles] Recompiling function f",
             "some other line"]
    assert dynamo.log_entries(lines) == {"graph_breaks": ["Graph break in user code"], "recompiles": ["Recompiling function f"]}


def test_fullgraph_refuses_a_data_dependent_branch_and_passes_its_fix():
    err = dynamo.fullgraph_refusal(dynamo.with_branch, torch.randn(4, 4))
    assert err is not None and err.startswith("Unsupported") and "branch" in err.lower()
    assert dynamo.fullgraph_refusal(dynamo.fixed_branch, torch.randn(4, 4)) is None


def test_clip_cuts_at_a_word_boundary_and_marks_the_cut():
    text = "Detected data-dependent branching (e.g. if my_tensor.sum() > 0:). Dynamo does not support tracing it"
    assert dynamo.clip(text, 200) == text
    cut = dynamo.clip(text, 80)
    assert len(cut) <= 80 and cut.endswith(" […]") and text.startswith(cut[:-4])  # marked as clipped
    assert cut[:-4].split()[-1] in text.split()  # the last word kept is a whole word
    assert dynamo.clip("x" * 50, 20) == "x" * 16 + " […]"  # no space: cut at the width
    assert dynamo.clip(text, 4) == text[:4]  # no room for the mark
    with pytest.raises(ValueError, match="width"):
        dynamo.clip(text, 0)
