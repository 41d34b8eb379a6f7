"""Node order of a compiled graph. In fused execution every matmul, reduction
and host-kernel op flushes the pending window of elementwise ops, so the order
in which AOTAutograd emits a graph (the order of the Python program it traced)
cuts related elementwise work into several windows. This pass moves ready
elementwise and free nodes ahead of the next window-breaking node, so each
window holds all the elementwise work that is ready, and flushes are fewer.

Dependencies are kept exactly; side effects are not reordered: a node that
mutates an input, draws random numbers or is not an ATen op is a fence that
every earlier node runs before and every later node after."""
from __future__ import annotations

import heapq
import operator
from typing import Dict, List

import torch
import torch.fx as fx

# Order classes: lower runs first among ready nodes.
FREE = 0  # placeholders, views, tuple indexing, size arithmetic: no kernel
WINDOW = 1  # elementwise ops: recorded into fused mode's window
BARRIER = 2  # everything else that launches work: flushes the window

_FREE_FUNCTIONS = {operator.getitem}


def _is_aten(target) -> bool:
    return isinstance(target, torch._ops.OpOverload)


def _is_fence(node: fx.Node) -> bool:
    if node.op != "call_function":
        return node.op in ("call_module", "call_method")
    target = node.target
    if target in _FREE_FUNCTIONS or _is_symbolic(node):
        return False
    if not _is_aten(target):
        return True  # an arbitrary Python callable or higher-order op: order kept
    if target._schema.is_mutable:
        return True
    return torch.Tag.nondeterministic_seeded in target.tags


def _is_symbolic(node: fx.Node) -> bool:
    """Size arithmetic (sym_size, operator.mul on SymInts, ...): values that are
    Python numbers at run time."""
    value = node.meta.get("val")
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))


def order_class(node: fx.Node) -> int:
    if node.op in ("placeholder", "get_attr"):
        return FREE
    if node.op != "call_function":
        return BARRIER
    target = node.target
    if target in _FREE_FUNCTIONS or _is_symbolic(node):
        return FREE
    if _is_aten(target):
        if target.is_view:
            return FREE
        if torch.Tag.pointwise in target.tags:
            return WINDOW
    return BARRIER


def schedule(graph: fx.Graph) -> List[fx.Node]:
    """All nodes of `graph` in a valid execution order; the output node last."""
    nodes = [n for n in graph.nodes if n.op != "output"]
    output = [n for n in graph.nodes if n.op == "output"]
    index: Dict[fx.Node, int] = {n: i for i, n in enumerate(nodes)}
    # Dependency counts, with fences as extra edges: a fence waits for every
    # earlier node, and every later node waits for the fence.
    waiting: Dict[fx.Node, int] = {}
    users: Dict[fx.Node, List[fx.Node]] = {n: [] for n in nodes}
    last_fence = None
    since_fence: List[fx.Node] = []
    for n in nodes:
        deps = {d for d in n.all_input_nodes if d in index}
        if _is_fence(n):
            deps.update(since_fence)
            since_fence = []
        if last_fence is not None:
            deps.add(last_fence)
        if _is_fence(n):
            last_fence = n
        else:
            since_fence.append(n)
        waiting[n] = len(deps)
        for d in deps:
            users[d].append(n)
    # Two ready queues, each in original order: window work (free and elementwise
    # nodes) and barriers. Phases alternate: all ready window work (which joins
    # one window), then all ready barriers (each flushes only if the window is
    # not empty, so a run of barriers costs one flush), then window work again.
    ready_window: List[tuple] = []
    ready_barrier: List[tuple] = []

    def make_ready(n: fx.Node) -> None:
        queue = ready_barrier if order_class(n) == BARRIER else ready_window
        heapq.heappush(queue, (order_class(n), index[n], n.name))

    for n in nodes:
        if waiting[n] == 0:
            make_ready(n)
    by_name = {n.name: n for n in nodes}
    order: List[fx.Node] = []

    def issue(name: str) -> None:
        n = by_name[name]
        order.append(n)
        for u in users[n]:
            waiting[u] -= 1
            if waiting[u] == 0:
                make_ready(u)

    while ready_window or ready_barrier:
        while ready_window:
            issue(heapq.heappop(ready_window)[2])
        while ready_barrier:
            issue(heapq.heappop(ready_barrier)[2])
            # Free nodes a barrier enables (the getitems of its tuple result, views
            # of it) cost nothing and may enable further barriers at once.
            while ready_window and ready_window[0][0] == FREE:
                issue(heapq.heappop(ready_window)[2])
    if len(order) != len(nodes):  # only a cyclic graph gets here; FX graphs are not
        raise RuntimeError("vtpu compiler: the graph's dependencies form a cycle")
    return order + output
