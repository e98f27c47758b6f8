"""helpers/fusion/graph_passes.py: dead-code elimination and constant folding over a torch.fx graph, each against
torch's own pass, and side effects kept."""
import copy

import torch
import torch.fx as fx

from helpers.fusion import graph_passes


def _traced(seed=0):
    return fx.symbolic_trace(graph_passes.WeightNormLinear(d=8, seed=seed))


def test_dead_code_elimination_leaves_what_torchs_pass_leaves():
    mine, theirs = _traced(), _traced()
    erased = graph_passes.eliminate_dead_code(mine.graph)
    theirs.graph.eliminate_dead_code()
    assert sorted(erased) == ["mul", "relu"]  # the debug line, and only it
    assert graph_passes.graph_lines(mine.graph) == graph_passes.graph_lines(theirs.graph)
    assert graph_passes.eliminate_dead_code(mine.graph) == []  # a second pass finds nothing


def test_constant_folding_folds_what_torch_folds_and_keeps_the_output_bitwise():
    module = graph_passes.WeightNormLinear(d=8, seed=1)
    gm = fx.symbolic_trace(module)
    graph_passes.eliminate_dead_code(gm.graph)
    before = copy.deepcopy(gm.graph)
    folded = graph_passes.fold_constants(gm)
    theirs, torch_ops = graph_passes.torch_const_fold(copy.deepcopy(module))
    assert folded == ["mul_1", "norm", "truediv", "t"]
    assert graph_passes.computing_ops(before, only=folded) == torch_ops
    assert graph_passes.computing_ops(gm.graph) == [("call_function", "matmul")]
    assert len(gm.graph.nodes) == 4  # x, the folded weight, matmul, output
    with torch.no_grad():
        for seed in range(4):
            x = torch.randn(3, 8, generator=torch.Generator().manual_seed(seed))
            assert torch.equal(gm(x), module(x)) and torch.equal(theirs(x), module(x))


def test_nothing_constant_means_nothing_folded():
    gm = fx.symbolic_trace(lambda x: torch.tanh(x) * 3)
    lines = graph_passes.graph_lines(gm.graph)
    assert graph_passes.fold_constants(gm) == []
    assert graph_passes.graph_lines(gm.graph) == lines


class _SideEffects(torch.nn.Module):
    """Three unused results: an assert and an in-place add (side effects, kept) and a product (erased)."""

    def __init__(self):
        super().__init__()
        self.count = torch.nn.Parameter(torch.zeros(()), requires_grad=False)  # a parameter: traced as get_attr

    def forward(self, x):
        torch._assert(x.numel() > 0, "empty input")  # impure: torch's list of side-effecting functions
        torch.ops.aten.add_.Tensor(self.count, 1)  # impure: a mutable schema; reads only constants, yet never folded
        x * 2  # pure and unused: dead
        return x + 1


def test_side_effects_survive_both_passes():
    mine, theirs = fx.symbolic_trace(_SideEffects()), fx.symbolic_trace(_SideEffects())
    erased = graph_passes.eliminate_dead_code(mine.graph)
    theirs.graph.eliminate_dead_code()
    assert graph_passes.graph_lines(mine.graph) == graph_passes.graph_lines(theirs.graph)
    targets = [getattr(n.target, "__name__", str(n.target)) for n in mine.graph.nodes]
    assert "_assert" in targets and any("add_" in t for t in targets)
    assert "mul" in erased and not any("add_" in name or "assert" in name for name in erased)
    assert graph_passes.fold_constants(mine) == []  # add_ reads only a constant, but must run on every call
    mine(torch.ones(2))
    mine(torch.ones(2))
    assert float(mine.count) == 2.0  # the in-place add ran on each call


def test_graph_lines_is_one_line_per_node():
    gm = _traced()
    lines = graph_passes.graph_lines(gm.graph)
    assert len(lines) == len(gm.graph.nodes) == 11
    assert lines[0].split()[:2] == ["x", "placeholder"] and "matmul(x, t)" in lines[-2]
