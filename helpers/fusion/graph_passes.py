"""What a compiler removes before it fuses anything: dead-code elimination and constant folding, written as two
passes over a torch.fx Graph: notebook 09.

A graph captured from Python holds every operation the code wrote, including work whose result nothing reads
(dead code: a leftover debug line, a branch's unused half) and work whose inputs never change between calls
(constants: anything computed from the weights alone, such as a weight normalization, at inference).
`eliminate_dead_code` erases a node that nothing uses and that has no side effect, walking the graph backwards so
that a whole dead chain falls in one pass; `fold_constants` computes, once, every node that reads only constants
(parameters, buffers, literals) and puts the result in the graph as a constant of its own. What counts as a side
effect is torch's own rule, `Node.is_impure`: a call that mutates an input (an OpOverload with a mutable schema),
draws random numbers, is an assert (`torch._assert`) or sets an item (`operator.setitem`), and a module marked
`_is_impure`. Torch's passes are the references: `torch.fx.Graph.eliminate_dead_code` and
`torch.fx.experimental.const_fold.split_const_subgraphs`. `WeightNormLinear` is the small module they are shown on.
"""
from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.const_fold import split_const_subgraphs


class WeightNormLinear(torch.nn.Module):
    """y = x (g ⊙ V / ‖V‖)ᵀ, a weight-normalized linear (Salimans and Kingma, 2016) with the debug line someone
    left in: at inference its weight depends on the parameters alone (a constant), and the debug line is dead code.
    x (..., d) -> (..., d)."""

    def __init__(self, d: int = 8, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.v = torch.nn.Parameter(torch.randn(d, d, generator=gen))  # direction
        self.g = torch.nn.Parameter(torch.rand(d, 1, generator=gen) + 0.5)  # length of each output row

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.relu(x) * 2  # a debug line left in: computed, never read (dead code)
        w = self.g * self.v / self.v.norm(dim=1, keepdim=True)  # reads only parameters: the same on every call
        return x @ w.t()


def graph_lines(graph: fx.Graph) -> list[str]:
    """One line per node of `graph`: its name, its kind (placeholder, get_attr, call_function, call_method,
    call_module, output) and what it calls on which nodes."""
    def short(a: Any) -> str:
        return a.name if isinstance(a, fx.Node) else repr(a) if not isinstance(a, (tuple, list)) else \
            "(" + ", ".join(short(x) for x in a) + ")"

    lines = []
    for n in graph.nodes:
        target = getattr(n.target, "__name__", str(n.target))
        args = ", ".join([short(a) for a in n.args] + [f"{k}={short(v)}" for k, v in n.kwargs.items()])
        lines.append(f"{n.name:<14} {n.op:<14} {target}({args})" if n.op not in ("placeholder", "get_attr")
                     else f"{n.name:<14} {n.op:<14} {target}")
    return lines


def eliminate_dead_code(graph: fx.Graph) -> list[str]:
    """Dead-code elimination: erase every node whose result no node uses and whose call has no side effect
    (`Node.is_impure`: placeholders and the output count as impure, so they stay). Returns the erased names."""
    erased = []
    for node in reversed(graph.nodes):  # users come after what they read: walking backwards, erasing a node
        if not node.users and not node.is_impure():  # leaves its inputs with one user fewer, so a dead chain
            erased.append(node.name)  # falls in this one pass
            graph.erase_node(node)
    return erased


def fold_constants(gm: fx.GraphModule) -> list[str]:
    """Constant folding: compute once every node whose inputs are all constant (a get_attr, or a node computed
    here) and that has no side effect; each constant node a varying node reads is replaced by a get_attr of its
    value (a buffer named _folded_<node>), and the nodes only the folded ones read are then dead and erased.
    Returns the names of the nodes computed ahead. gm is changed in place and recompiled."""
    value: dict[fx.Node, Any] = {}  # node -> its value, for every constant node
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output") or node.is_impure():
            continue  # a graph input varies per call; a side effect must happen on every call
        if node.op != "get_attr" and not all(n in value for n in node.all_input_nodes):
            continue  # reads something that varies (an input, or a node computed from one)
        args, kwargs = fx.map_arg((node.args, node.kwargs), lambda n: value[n])
        with torch.no_grad():  # the result is a constant: no autograd history
            if node.op == "get_attr":
                out = functools.reduce(getattr, node.target.split("."), gm)  # a parameter or a buffer
            elif node.op == "call_function":
                out = node.target(*args, **kwargs)
            elif node.op == "call_method":
                out = getattr(args[0], node.target)(*args[1:], **kwargs)
            else:  # call_module
                out = gm.get_submodule(node.target)(*args, **kwargs)
        value[node] = out
    ahead = [n for n in value if n.op != "get_attr"]
    for node in ahead:
        if all(u in value for u in node.users):
            continue  # only constants read it: it is folded into theirs
        gm.register_buffer(f"_folded_{node.name}", value[node].detach())
        with gm.graph.inserting_before(node):
            node.replace_all_uses_with(gm.graph.get_attr(f"_folded_{node.name}"))
    eliminate_dead_code(gm.graph)  # the folded nodes, and the parameters only they read, have no users now
    gm.recompile()
    return [n.name for n in ahead]


def computing_ops(graph: fx.Graph, only: list[str] | None = None) -> list[tuple[str, str]]:
    """(kind, target name) of every node of `graph` that computes (call_function, call_method, call_module), in
    order; `only`: just the nodes of those names (the ones `fold_constants` computed ahead)."""
    return [(n.op, getattr(n.target, "__name__", str(n.target))) for n in graph.nodes
            if n.op.startswith("call_") and (only is None or n.name in only)]


def torch_const_fold(module: torch.nn.Module) -> tuple[fx.GraphModule, list[tuple[str, str]]]:
    """Torch's constant folding of `module` (`split_const_subgraphs`, run once so its constants exist): the folded
    module and `computing_ops` of the constant subgraph it split off ([] when it found nothing to fold)."""
    with warnings.catch_warnings():  # the splitter warns about a get_attr it adds before the attribute exists
        warnings.simplefilter("ignore", UserWarning)
        folded = split_const_subgraphs(module)
        folded.run_folding()
    const = folded.const_subgraph_module
    return folded, computing_ops(const.graph) if const is not None else []
