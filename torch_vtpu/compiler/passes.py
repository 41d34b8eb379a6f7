"""Graph rewrites applied to every compiled graph before it is scheduled. Each
keeps the results bit for bit: it only replaces a node by the ops eager mode
runs for it, or by an equal computation in the same rounding.

unroll_foreach: a ``_foreach_*`` node becomes one ATen op per list element,
    the ops ATen's reference (CompositeExplicitAutograd) kernel runs for a vtpu
    tensor list. As list nodes, a compiled optimizer step is breadth-first
    (each op over every parameter before the next op): all intermediates of
    all parameters are alive at once, and fused execution's window fills up
    before any parameter's chain is complete. Unrolled, the scheduler can run
    each parameter's chain as one group (schedule.py), which fuses into one
    kernel whose temporaries are never stored.

fill_operands_to_scalars: Dynamo's polyfill of ``_foreach_lerp_`` multiplies
    by a tensor filled with the weight (``addcmul(start, full_like(d, w), d)``);
    materialising that fill costs a kernel and a buffer pass per parameter.
    ``addcmul(a, full(w), b)`` with value 1 is one fused multiply-add,
    fma(w, b, a), as ``add(a, b, alpha=w)`` is, so it becomes that.

scattered_halves_to_cat: AOTAutograd writes the gradient of ``cat((a, b), d)``
    taken apart again (RoPE's rotate_half) as two zero-filled tensors, each
    with one half scattered in, added: ``add(slice_scatter(full(0), ga, d, 0,
    h), slice_scatter(full(0), gb, d, h, n))``, four kernels and three
    full-size buffers. It becomes ``cat((ga, gb), d)``, the values eager
    mode's cat backward gives (adding the zeros also turned a -0.0 into
    +0.0; the cat keeps it, as eager does).

prim_casts_to_aten: ``prims.convert_element_type(x, dtype)`` (the core
    decomposition of a dtype conversion; with ``dynamic=True`` every float
    attribute such as a norm's eps becomes a 0-dim float64 graph input cast
    twice) becomes ``aten._to_copy(x, dtype=dtype)``, the same cast into a
    fresh tensor. The prim runs through torch's Python implementation of
    custom ops, ~50 us a call: a compiled decoding step of the Qwen3-style
    model made 51 of them, more time than its kernels."""
from __future__ import annotations

import operator
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.fx as fx

aten = torch.ops.aten

# (per-element op, how the foreach node's args become its args for element i)
_Builder = Callable[[int, tuple, dict], Tuple[tuple, dict]]


def _element(value: Any, i: int) -> Any:
    return value[i] if isinstance(value, (list, tuple)) else value


def _indexed(i: int, args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
    return tuple(_element(a, i) for a in args), {k: _element(v, i) for k, v in kwargs.items()}


def _value_keyword(i: int, args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
    # _foreach_addcmul.Scalar(self, t1, t2, value) -> addcmul(s, a, b, *, value)
    args, kwargs = _indexed(i, args, kwargs)
    if len(args) > 3:
        args, kwargs = args[:3], dict(kwargs, value=args[3])
    return args, kwargs


def _scalars_as_value(i: int, args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
    # _foreach_addcmul.ScalarList(self, t1, t2, scalars) -> addcmul(s, a, b, value=scalars[i])
    self, t1, t2, scalars = args
    return (self[i], t1[i], t2[i]), {"value": scalars[i]}


def _per_element_table() -> Dict[torch._ops.OpOverload, Tuple[torch._ops.OpOverload, _Builder]]:
    table: Dict[torch._ops.OpOverload, Tuple[torch._ops.OpOverload, _Builder]] = {}

    def add(foreach: str, overload: str, target: torch._ops.OpOverload, build: _Builder = _indexed) -> None:
        packet = getattr(aten, foreach, None)
        if packet is not None and overload in packet.overloads():
            table[getattr(packet, overload)] = (target, build)

    for name in ("add", "sub", "mul", "div"):
        op = getattr(aten, name)
        add(f"_foreach_{name}", "Scalar", op.Scalar)
        add(f"_foreach_{name}", "ScalarList", op.Scalar)
        add(f"_foreach_{name}", "List", op.Tensor)
        add(f"_foreach_{name}", "Tensor", op.Tensor)
    for name in ("maximum", "minimum"):
        add(f"_foreach_{name}", "List", getattr(aten, name).default)
    for name in ("clamp_min", "clamp_max"):
        add(f"_foreach_{name}", "Scalar", getattr(aten, name).default)
        add(f"_foreach_{name}", "ScalarList", getattr(aten, name).default)
        add(f"_foreach_{name}", "List", getattr(aten, name).Tensor)
    add("_foreach_pow", "Scalar", aten.pow.Tensor_Scalar)
    add("_foreach_pow", "ScalarList", aten.pow.Tensor_Scalar)
    add("_foreach_pow", "List", aten.pow.Tensor_Tensor)
    add("_foreach_pow", "ScalarAndTensor", aten.pow.Scalar)
    for name in ("addcmul", "addcdiv"):
        add(f"_foreach_{name}", "Scalar", getattr(aten, name).default, _value_keyword)
        add(f"_foreach_{name}", "ScalarList", getattr(aten, name).default, _scalars_as_value)
    add("_foreach_lerp", "Scalar", aten.lerp.Scalar)
    add("_foreach_lerp", "ScalarList", aten.lerp.Scalar)
    add("_foreach_lerp", "List", aten.lerp.Tensor)
    for name in ("sqrt", "neg", "reciprocal", "exp", "log", "abs", "sign", "sigmoid", "tanh", "rsqrt", "sin",
                 "cos", "expm1", "log1p", "floor", "ceil", "round", "trunc", "frac"):
        if hasattr(aten, name):
            add(f"_foreach_{name}", "default", getattr(aten, name).default)
    return table


_PER_ELEMENT = _per_element_table()


def _list_length(node: fx.Node) -> Optional[int]:
    for a in node.args:
        if isinstance(a, (list, tuple)) and a and all(isinstance(x, fx.Node) for x in a):
            return len(a)
    return None


def on_host_only(node: fx.Node) -> bool:
    """Every tensor the node reads and returns is a CPU tensor (an optimizer's
    `step` counters and the bias corrections computed from them): the node
    launches nothing on the device."""
    tensors = [v for v in (x.meta.get("val") for x in node.all_input_nodes) if isinstance(v, torch.Tensor)]
    out = node.meta.get("val")
    out = list(out) if isinstance(out, (list, tuple)) else [out]
    tensors += [v for v in out if isinstance(v, torch.Tensor)]
    if len(tensors) < len(node.all_input_nodes):
        return False  # an input without a known tensor value
    return bool(tensors) and all(t.device.type == "cpu" for t in tensors)


def unroll_foreach(gm: fx.GraphModule) -> int:
    """Returns the number of foreach nodes replaced. Foreach nodes over CPU
    tensors stay whole: they launch nothing on the device, and one call runs
    the whole list in C++ where unrolled they would cost a Python call each."""
    graph = gm.graph
    replaced = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _PER_ELEMENT or on_host_only(node):
            continue
        n = _list_length(node)
        users = list(node.users)
        # Only list results that are indexed with constants (AOTAutograd's form).
        if n is None or not all(u.op == "call_function" and u.target is operator.getitem and
                                isinstance(u.args[1], int) for u in users):
            continue
        target, build = _PER_ELEMENT[node.target]
        by_index: Dict[int, List[fx.Node]] = {}
        for u in users:
            by_index.setdefault(u.args[1], []).append(u)
        with graph.inserting_before(node):
            for i in range(n):
                getters = by_index.get(i, [])
                if not getters:  # an element nobody reads: every op here is pure
                    continue
                args, kwargs = build(i, node.args, dict(node.kwargs))
                element = graph.call_function(target, args, kwargs)
                element.meta = dict(getters[0].meta)
                for g in getters:
                    g.replace_all_uses_with(element)
                    graph.erase_node(g)
        graph.erase_node(node)
        replaced += 1
    return replaced


def _fill_value(node: Any) -> Optional[float]:
    """The value of a ``full_like(x, number)`` node with no other dtype or
    layout argument than x's own."""
    if not isinstance(node, fx.Node) or node.op != "call_function" or node.target is not aten.full_like.default:
        return None
    if len(node.args) != 2 or not isinstance(node.args[1], (int, float)) or isinstance(node.args[1], bool):
        return None
    if any(k not in ("pin_memory", "dtype", "layout", "device") for k in node.kwargs):
        return None
    return float(node.args[1])


def _val(node: Any) -> Optional[torch.Tensor]:
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def fill_operands_to_scalars(gm: fx.GraphModule) -> int:
    graph = gm.graph
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.addcmul.default:
            continue
        if len(node.args) != 3 or node.kwargs.get("value", 1) != 1:
            continue
        self, t1, t2 = node.args
        for fill, other in ((t1, t2), (t2, t1)):
            weight = _fill_value(fill)
            vals = [_val(x) for x in (node, self, fill, other)]
            if weight is None or any(v is None for v in vals):
                continue
            out, a, f, b = vals
            # Same dtype everywhere and no broadcasting by the fill: then
            # addcmul(a, f, b) == add(a, b, alpha=w) bit for bit: both are one
            # fused multiply-add, fma(w, b, a), with w rounded to the dtype as
            # the fill was (ATen's CPU kernels and the generated ones alike; a
            # mul and an add would round twice). float32/float64 only: a
            # 16-bit addcmul computes in float with the fill's 16-bit value,
            # while add reads its alpha unrounded (a compiled bf16 foreach
            # Adam step drifted from eager mode).
            if (len({out.dtype, a.dtype, f.dtype, b.dtype}) != 1
                    or out.dtype not in (torch.float32, torch.float64)):
                continue
            if tuple(f.shape) != tuple(out.shape) or tuple(b.shape) != tuple(out.shape):
                continue
            with graph.inserting_before(node):
                total = graph.call_function(aten.add.Tensor, (self, other), {"alpha": weight})
                total.meta = dict(node.meta)
            node.replace_all_uses_with(total)
            graph.erase_node(node)
            if not fill.users:
                graph.erase_node(fill)
            rewritten += 1
            break
    return rewritten


def _zero_fill(node: Any) -> bool:
    """A ``full(size, 0)`` node (any dtype, strided layout)."""
    if not isinstance(node, fx.Node) or node.op != "call_function" or node.target is not aten.full.default:
        return False
    value = node.args[1] if len(node.args) > 1 else None
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0
            and node.kwargs.get("layout", torch.strided) == torch.strided)


def _scattered_range(node: Any, out: torch.Tensor) -> Optional[Tuple[int, int, int, fx.Node]]:
    """(dim, start, end, source) of ``slice_scatter(full(0), source, dim,
    start, end)`` with step 1 over a tensor shaped like `out`, bounds clamped."""
    if not isinstance(node, fx.Node) or node.op != "call_function" or node.target is not aten.slice_scatter.default:
        return None
    names = ("input", "src", "dim", "start", "end", "step")
    args = dict(zip(names, node.args), **node.kwargs)
    base, source = args.get("input"), args.get("src")
    if not _zero_fill(base) or not isinstance(source, fx.Node) or args.get("step", 1) != 1:
        return None
    base_val, source_val = _val(base), _val(source)
    if base_val is None or source_val is None or base_val.dtype != out.dtype or source_val.dtype != out.dtype:
        return None
    # Static sizes only: comparing symbolic ones here would add guards after
    # tracing (dynamic graphs keep the scatters).
    if not all(isinstance(n, int) for n in (*out.shape, *base_val.shape, *source_val.shape)):
        return None
    if tuple(base_val.shape) != tuple(out.shape) or out.dim() == 0:
        return None
    dim = args.get("dim", 0)
    if not isinstance(dim, int):
        return None
    dim = dim + out.dim() if dim < 0 else dim
    size = out.shape[dim]
    start = args.get("start") or 0
    end = args.get("end")
    if not isinstance(start, int) or not isinstance(end, (int, type(None))):
        return None  # symbolic bounds (an fx node)
    end = size if end is None or end > size else end
    if start < 0 or end < start:
        return None
    if source_val.shape[dim] != end - start:
        return None
    return dim, start, end, source


def scattered_halves_to_cat(gm: fx.GraphModule) -> int:
    graph = gm.graph
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.add.Tensor or len(node.args) != 2:
            continue
        if node.kwargs.get("alpha", 1) != 1:
            continue
        out = _val(node)
        if out is None or not out.dtype.is_floating_point:
            continue
        ranges = [_scattered_range(a, out) for a in node.args]
        if any(r is None for r in ranges):
            continue
        first, second = sorted(ranges, key=lambda r: r[1])
        # Same dim, the two halves tile it: [0, h) then [h, n).
        if first[0] != second[0] or first[1] != 0 or first[2] != second[1] or second[2] != out.shape[first[0]]:
            continue
        with graph.inserting_before(node):
            joined = graph.call_function(aten.cat.default, ([first[3], second[3]], first[0]))
            joined.meta = dict(node.meta)
        node.replace_all_uses_with(joined)
        scatters = list(node.args)
        graph.erase_node(node)
        for scatter in scatters:
            if not scatter.users:
                fill = scatter.args[0] if scatter.args else scatter.kwargs["input"]
                graph.erase_node(scatter)
                if not fill.users:
                    graph.erase_node(fill)
        rewritten += 1
    return rewritten


def prim_casts_to_aten(gm: fx.GraphModule) -> int:
    graph = gm.graph
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.prims.convert_element_type.default:
            continue
        if len(node.args) != 2 or node.kwargs:
            continue
        source, dtype = node.args
        with graph.inserting_before(node):
            cast = graph.call_function(aten._to_copy.default, (source,), {"dtype": dtype})
            cast.meta = dict(node.meta)
        node.replace_all_uses_with(cast)
        graph.erase_node(node)
        rewritten += 1
    return rewritten


def rewrite(gm: fx.GraphModule) -> Dict[str, int]:
    """Applies every pass; returns how many nodes each one replaced."""
    counts = {"unroll_foreach": unroll_foreach(gm), "fill_operands_to_scalars": fill_operands_to_scalars(gm),
              "scattered_halves_to_cat": scattered_halves_to_cat(gm), "prim_casts_to_aten": prim_casts_to_aten(gm)}
    if any(counts.values()):
        gm.graph.lint()
        gm.recompile()
    return counts
