"""Node order of a compiled graph. In fused execution every matmul, reduction
and host-kernel op flushes the pending window of elementwise ops, so the order
in which AOTAutograd emits a graph (the order of the Python program it traced)
cuts related elementwise work into several windows. This pass moves ready
elementwise and free nodes ahead of the next window-breaking node, so each
window holds all the elementwise work that is ready, and flushes are fewer.

Within a phase, window work runs in demand order (a post-order walk from the
graph's results): each result's chain of elementwise ops is issued as one
run, so an unrolled optimizer step (passes.py) records parameter after
parameter, each parameter's chain fuses into one kernel and its temporaries
die at once, instead of every op running over all parameters in turn.

A ready elementwise node whose every use lies beyond the next barrier phase
(RMSNorm-backward's pow of a saved statistic, whose users wait for a
reduction) is deferred to the window of its users: issued at once it would be
a kernel of its own and store a value only those users read.

Dependencies are kept exactly; side effects are not reordered: a node that
mutates an input, draws random numbers or is not an ATen op is a fence that
every earlier node runs before and every later node after. The exception is
AOTAutograd's epilogue of input mutations, ``copy_(input, new_value)`` with
no later reader of the input: it waits only for the new value and for every
reader of the input, so it joins the window of the chain that computed the
value (and the value is then never stored on its own)."""
from __future__ import annotations

import heapq
import operator
from typing import Dict, List

import torch
import torch.fx as fx

from .passes import on_host_only

# Order classes: lower runs first among ready nodes.
FREE = 0  # placeholders, views, tuple indexing, size arithmetic: no kernel
WINDOW = 1  # elementwise ops and plain reductions: recorded into fused mode's window
BARRIER = 2  # everything else that launches work: flushes the window

_FREE_FUNCTIONS = {operator.getitem}

# Reductions the window records (fused_window.h), so that one fuses with the
# elementwise work computing its input; a reduction the bridge does not
# record (0-dim, empty, a dtype conversion) flushes instead, which costs a
# launch but never changes a result.
_WINDOW_REDUCTIONS = {
    torch.ops.aten.sum.default,
    torch.ops.aten.sum.dim_IntList,
    torch.ops.aten.mean.default,
    torch.ops.aten.mean.dim,
    torch.ops.aten.amax.default,
    torch.ops.aten.amin.default,
    torch.ops.aten.prod.default,
    torch.ops.aten.prod.dim_int,
}


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


def _aliases(node: fx.Node) -> List[fx.Node]:
    """`node` and every view derived from it."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(u for u in n.users if u.op == "call_function" and _is_aten(u.target) and u.target.is_view)
    return out


def epilogue_copies(nodes: List[fx.Node]) -> Dict[fx.Node, List[fx.Node]]:
    """The copy_ nodes that write a graph input after its last reader, each
    with the readers it must wait for. A copy_ qualifies when it is the only
    write of a placeholder, of the same shape and dtype as its source, and no
    node after it reads the placeholder or a view of it."""
    index = {n: i for i, n in enumerate(nodes)}
    copies: Dict[fx.Node, List[fx.Node]] = {}
    for n in nodes:
        if n.op != "call_function" or n.target is not torch.ops.aten.copy_.default or len(n.args) != 2:
            continue
        dst, src = n.args
        if not isinstance(dst, fx.Node) or dst.op != "placeholder" or not isinstance(src, fx.Node):
            continue
        dv, sv = dst.meta.get("val"), src.meta.get("val")
        if not isinstance(dv, torch.Tensor) or not isinstance(sv, torch.Tensor):
            continue
        if dv.shape != sv.shape or dv.dtype != sv.dtype or dv.device != sv.device:
            continue
        readers = [u for a in _aliases(dst) for u in a.users
                   if u is not n and not (u.op == "call_function" and _is_aten(u.target) and u.target.is_view)]
        writes = [u for u in readers if u.op == "call_function" and _is_aten(u.target) and u.target._schema.is_mutable]
        if writes or any(index.get(u, len(nodes)) > index[n] for u in readers):
            continue
        copies[n] = readers
    return copies


def demand_order(nodes: List[fx.Node], deps: Dict[fx.Node, List[fx.Node]]) -> Dict[fx.Node, int]:
    """A rank for every node: its position in a post-order walk of the data
    dependencies from the graph's results (nodes nobody uses, in program
    order). A sink whose inputs are all ranked is ranked right after the last
    of them, so an input's epilogue copy_ follows the chain it stores."""
    users: Dict[fx.Node, List[fx.Node]] = {n: [] for n in nodes}
    for n in nodes:
        for d in deps[n]:
            users[d].append(n)
    rank: Dict[fx.Node, int] = {}
    sinks = [n for n in nodes if not users[n]]

    def walk(root: fx.Node) -> None:
        stack = [(root, iter(deps[root]))]
        while stack:
            node, pending = stack[-1]
            child = next((d for d in pending if d not in rank), None)
            if child is not None:
                stack.append((child, iter(deps[child])))
                continue
            stack.pop()
            if node in rank:
                continue
            rank[node] = len(rank)
            for u in users[node]:
                if not users[u] and u not in rank and all(d in rank for d in deps[u]):
                    rank[u] = len(rank)

    for sink in sinks:
        if sink not in rank:
            walk(sink)
    return rank


def order_class(node: fx.Node) -> int:
    if node.op in ("placeholder", "get_attr"):
        return FREE
    if node.op != "call_function":
        return BARRIER
    target = node.target
    if target in _FREE_FUNCTIONS or _is_symbolic(node):
        return FREE
    if _is_aten(target) and not _is_fence(node) and on_host_only(node):
        return FREE  # CPU scalars (an optimizer's step counters): no device work, no flush
    if _is_aten(target):
        if target.is_view:
            return FREE
        if torch.Tag.pointwise in target.tags or target in _WINDOW_REDUCTIONS:
            return WINDOW
    return BARRIER


def schedule(graph: fx.Graph) -> List[fx.Node]:
    """All nodes of `graph` in a valid execution order; the output node last."""
    nodes = [n for n in graph.nodes if n.op != "output"]
    output = [n for n in graph.nodes if n.op == "output"]
    index: Dict[fx.Node, int] = {n: i for i, n in enumerate(nodes)}
    copies = epilogue_copies(nodes)
    data_deps: Dict[fx.Node, List[fx.Node]] = {}
    for n in nodes:
        inputs = [d for d in n.all_input_nodes if d in index]
        data_deps[n] = inputs + [r for r in copies.get(n, ()) if r not in inputs]
    rank = demand_order(nodes, data_deps)

    def fence(n: fx.Node) -> bool:
        return n not in copies and _is_fence(n)

    # Computed once per node: order_class looks at every argument's fake
    # tensor, and the deferral analysis asks again and again.
    classes: Dict[fx.Node, int] = {n: WINDOW if n in copies else order_class(n) for n in nodes}

    def klass(n: fx.Node) -> int:
        return classes[n]

    # Dependency counts, with fences as extra edges: a fence waits for every
    # earlier node, and every later node waits for the fence.
    waiting: Dict[fx.Node, int] = {}
    users: Dict[fx.Node, List[fx.Node]] = {n: [] for n in nodes}
    preds: Dict[fx.Node, List[fx.Node]] = {}
    last_fence = None
    since_fence: List[fx.Node] = []
    for n in nodes:
        deps = set(data_deps[n])
        if fence(n):
            deps.update(since_fence)
            since_fence = []
        if last_fence is not None:
            deps.add(last_fence)
        if fence(n):
            last_fence = n
        else:
            since_fence.append(n)
        waiting[n] = len(deps)
        preds[n] = list(deps)
        for d in deps:
            users[d].append(n)
    # Two ready queues: window work (free and elementwise nodes, in demand
    # order) and barriers (in program order). Phases alternate: all ready window work (which joins
    # one window), then all ready barriers (each flushes only if the window is
    # not empty, so a run of barriers costs one flush), then window work again.
    ready_window: List[tuple] = []
    ready_barrier: List[tuple] = []

    def make_ready(n: fx.Node) -> None:
        # Barriers keep program order; window work goes in demand order.
        if klass(n) == BARRIER:
            heapq.heappush(ready_barrier, (BARRIER, index[n], n.name))
        else:
            heapq.heappush(ready_window, (klass(n), rank[n], n.name))

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

    def deferrable() -> set:
        """Ready elementwise nodes whose every use lies beyond the next barrier
        phase: issued now they would be a kernel of their own (their users
        record into a later window) and store a value only those users read;
        deferred, they join their users' window and fuse with them."""
        reach: set = set()  # what this window phase can issue
        pending = dict()
        stack = [by_name[item[2]] for item in ready_window]
        while stack:
            n = stack.pop()
            reach.add(n)
            for u in users[n]:
                if klass(u) == BARRIER:
                    continue
                pending[u] = pending.get(u, waiting[u]) - 1
                if pending[u] == 0:
                    stack.append(u)
        deferred: set = set()

        def needed_now(n: fx.Node) -> bool:
            # A sink (a graph result), a barrier's input or an input of
            # work issued in this phase; free users (views) are looked through.
            if not users[n]:
                return True
            for u in users[n]:
                if klass(u) == BARRIER:
                    return True
                if u in reach and (klass(u) == WINDOW or needed_now(u)):
                    return True
            return False

        # Each node is queued at most once at a time: a node still queued is
        # examined later in the then current state anyway. Free nodes are
        # queued only when work above them left the phase (then their inputs
        # may no longer be needed now); examined in the first pass, each one
        # re-queued all its inputs, which over an optimizer's chains of CPU
        # step counters made the analysis quadratic or worse (a 1,500-node
        # AdamW graph took hours).
        work = [n for n in reach if klass(n) == WINDOW]
        queued = set(work)

        def requeue(nodes_):
            for d in nodes_:
                if d in reach and d not in queued:
                    queued.add(d)
                    work.append(d)

        while work:
            n = work.pop()
            queued.discard(n)
            if n not in reach:
                continue
            if klass(n) != WINDOW:
                requeue(preds[n])  # free: its inputs decide
                continue
            if needed_now(n):
                continue
            # n and everything issued after it wait for the next phase; the
            # inputs of what left may no longer be needed now either.
            deferred.add(n)
            stack = [n]
            while stack:
                m = stack.pop()
                if m in reach:
                    reach.discard(m)
                    stack.extend(users[m])
                    requeue(preds[m])
        return deferred

    while ready_window or ready_barrier:
        later = deferrable()
        held: List[tuple] = []
        while ready_window:
            item = heapq.heappop(ready_window)
            if by_name[item[2]] in later:
                held.append(item)
            else:
                issue(item[2])
        if held and not ready_barrier:
            for item in held:  # nothing else can run: issue them after all
                issue(item[2])
            held = []
        for item in held:
            heapq.heappush(ready_window, item)
        while ready_barrier:
            issue(heapq.heappop(ready_barrier)[2])
            # Free nodes a barrier enables (the getitems of its tuple result, views
            # of it) cost nothing and may enable further barriers at once.
            while ready_window and ready_window[0][0] == FREE:
                issue(heapq.heappop(ready_window)[2])
    if len(order) != len(nodes):  # only a cyclic graph gets here; FX graphs are not
        raise RuntimeError("vtpu compiler: the graph's dependencies form a cycle")
    return order + output


# A chain end pays off in memory traffic (its temporaries are not stored);
# for tiny write-backs (a BatchNorm's num_batches_tracked) that is nothing,
# and the extra kernel launch is what remains.
_CHAIN_END_MIN_ELEMENTS = 4096


def _numel(node: fx.Node) -> int:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return 0
    numel = value.numel()
    if isinstance(numel, int):
        return numel
    # A symbolic size: comparing it would add a guard, one Dynamo cannot even build for a
    # symbol without a source (the synthetic base of aliased inputs: compilation failed).
    # Its example value guides the choice instead; chain ends never change results.
    hint = getattr(getattr(numel, "node", None), "hint", None)
    return hint if isinstance(hint, int) else 0


def chain_ends(order: List[fx.Node]) -> List[int]:
    """Positions in `order` after which fused mode's window should close its
    clusters (an ``end_chain`` of the program): where, within one run of
    window work, a chain that writes a graph input back (an optimizer
    step's parameter or state, a running statistic) is complete and the next
    window node is unrelated to it. Without the boundary the next chain's
    temporaries, on the blocks this chain just freed, relate the two chains'
    clusters in the window: they merge, and neither chain's dropped
    temporaries are dead stores any more. The closed kernels still share one
    stream task with the chains after them. Write-backs under
    _CHAIN_END_MIN_ELEMENTS elements do not end a chain.

    Chains are the connected components of the data edges between device
    nodes; CPU scalars (bias corrections shared by every parameter) and
    graph inputs do not connect them."""
    parent: Dict[fx.Node, fx.Node] = {}

    def find(n: fx.Node) -> fx.Node:
        root = n
        while parent.get(root, root) is not root:
            root = parent[root]
        while parent.get(n, n) is not root:
            parent[n], n = root, parent[n]
        return root

    def on_device(n: fx.Node) -> bool:
        value = n.meta.get("val")
        values = value if isinstance(value, (list, tuple)) else [value]
        return any(isinstance(v, torch.Tensor) and v.device.type != "cpu" for v in values)

    copies = epilogue_copies(order[:-1])
    connecting = [n for n in order if n.op == "call_function" and on_device(n)]
    members = set(connecting)
    for n in connecting:
        for d in n.all_input_nodes:
            if d in members:
                a, b = find(n), find(d)
                if a is not b:
                    parent[a] = b

    ends: List[int] = []
    run: List[int] = []  # positions of window nodes in the current run

    def close_run() -> None:
        last: Dict[fx.Node, int] = {}
        writes_back = set()
        for i in run:
            root = find(order[i])
            last[root] = i
            if order[i] in copies and on_device(order[i]) and _numel(order[i]) >= _CHAIN_END_MIN_ELEMENTS:
                writes_back.add(root)
        open_roots: set = set()
        for i in run[:-1]:
            open_roots.add(find(order[i]))
            if all(last[r] <= i for r in open_roots) and open_roots & writes_back:
                ends.append(i)
                open_roots = set()
        run.clear()

    for i, n in enumerate(order[:-1]):
        klass = WINDOW if n in copies else order_class(n)
        if klass == BARRIER:
            close_run()
        elif klass == WINDOW:
            run.append(i)
    close_run()
    return ends
