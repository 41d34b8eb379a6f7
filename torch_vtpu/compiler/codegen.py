"""Python code of a compiled graph: one straight-line function over the
scheduled nodes, with each ATen op bound to its dispatcher entry (no FX
interpreter, no OpOverload wrapper frame per op) and, under memory planning,
every value released right after its last use so its device block is reused
by the next allocation (and, in a fused window, not stored at all when nothing
reads it after the flush)."""
from __future__ import annotations

import math
from dataclasses import dataclass
import operator
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.fx as fx


@dataclass
class Program:
    source: str
    fn: Callable[[List[Any]], Any]


class _Emitter:
    def __init__(self) -> None:
        self.globals: Dict[str, Any] = {"__builtins__": __builtins__}
        self._by_id: Dict[int, str] = {}

    def bind(self, value: Any, hint: str) -> str:
        key = id(value)
        if key in self._by_id:
            return self._by_id[key]
        name = f"_{hint}_{len(self._by_id)}"
        self._by_id[key] = name
        self.globals[name] = value
        return name

    def callee(self, target: Any) -> str:
        if isinstance(target, torch._ops.OpOverload):
            # The C++ entry of the overload: OpOverload.__call__ only forwards to it.
            return self.bind(target._op, _identifier(str(target.name()).split("::")[-1]))
        return self.bind(target, _identifier(getattr(target, "__name__", "fn")))

    def expr(self, arg: Any, names: Dict[fx.Node, str]) -> str:
        if isinstance(arg, fx.Node):
            return names[arg]
        if isinstance(arg, (list, tuple)):
            items = ", ".join(self.expr(a, names) for a in arg)
            return f"[{items}]" if isinstance(arg, list) else f"({items}{',' if len(arg) == 1 else ''})"
        if isinstance(arg, dict):
            return "{" + ", ".join(f"{k!r}: {self.expr(v, names)}" for k, v in arg.items()) + "}"
        if arg is None or isinstance(arg, (bool, str)):
            return repr(arg)
        if isinstance(arg, int):
            return repr(arg)
        if isinstance(arg, float):
            return repr(arg) if math.isfinite(arg) else self.bind(arg, "float")
        return self.bind(arg, type(arg).__name__.lower())


def _identifier(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)


def _liveness(order: Sequence[fx.Node], memory_planning: bool):
    """Position of each node in `order`, the returned values, each value's
    last use, and which values die after each position (memory planning:
    released right after their last use; none when planning is off)."""
    position = {n: i for i, n in enumerate(order)}
    returned = set(order[-1].all_input_nodes)
    last_use: Dict[fx.Node, int] = {}
    for n in order:
        for d in n.all_input_nodes:
            last_use[d] = max(last_use.get(d, -1), position[n])
    release_after: Dict[int, List[fx.Node]] = {}
    if memory_planning:
        for value, at in last_use.items():
            if value not in returned:
                release_after.setdefault(at, []).append(value)
    return position, returned, last_use, release_after


def generate(gm: fx.GraphModule, order: Sequence[fx.Node], memory_planning: bool,
             chain_ends: Sequence[int] = ()) -> Program:
    """`chain_ends`: positions in `order` after which (and after the values
    that die there) fused mode's window closes its clusters (schedule.chain_ends)."""
    emit = _Emitter()
    ends = set(chain_ends)
    names: Dict[fx.Node, str] = {}
    output = order[-1]
    assert output.op == "output"
    position, returned, last_use, release_after = _liveness(order, memory_planning)

    # The arguments arrive in the graph's placeholder order, whatever the schedule.
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    lines = ["def program(args):"]
    for i, n in enumerate(placeholders):
        names[n] = f"v{i}_{_identifier(n.name)}"
    if placeholders:
        lines.append("    " + ", ".join(names[n] for n in placeholders) + (", = args" if len(placeholders) == 1 else " = args"))
    # The caller's list held the inputs; the graph owns them now (boxed convention).
    lines.append("    args.clear()")
    for n in placeholders:
        if n not in last_use and n not in returned and memory_planning:
            lines.append(f"    del {names[n]}")
    for n in order:
        if n.op in ("placeholder", "output"):
            continue
        name = f"v{position[n]}_{_identifier(n.name)}"
        names[n] = name
        if n.op == "get_attr":
            value = gm
            for part in n.target.split("."):
                value = getattr(value, part)
            lines.append(f"    {name} = {emit.bind(value, 'const')}")
        elif n.op == "call_function":
            call_args = ", ".join([emit.expr(a, names) for a in n.args] +
                                  [f"{k}={emit.expr(v, names)}" for k, v in n.kwargs.items()])
            lines.append(f"    {name} = {emit.callee(n.target)}({call_args})")
        else:
            raise NotImplementedError(f"vtpu compiler: FX node kind {n.op!r} ({n.format_node()})")
        if n not in last_use and n not in returned and memory_planning:
            lines.append(f"    del {name}")
        for dead in release_after.get(position[n], ()):
            lines.append(f"    del {names[dead]}")
        if position[n] in ends:
            lines.append(f"    {emit.bind(_end_fused_chain, 'end_fused_chain')}()")
    lines.append(f"    return {emit.expr(output.args[0], names)}")
    source = "\n".join(lines) + "\n"
    scope = dict(emit.globals)
    exec(compile(source, f"<vtpu graph {id(gm):x}>", "exec"), scope)
    return Program(source=source, fn=scope["program"])


def has_only_functions(gm: fx.GraphModule) -> bool:
    return all(n.op in ("placeholder", "get_attr", "call_function", "output") for n in gm.graph.nodes)


class _Unsupported(Exception):
    """The graph holds something the native program does not express."""


def _end_fused_chain() -> None:
    from .. import _C

    _C._end_fused_chain()


def build_native(gm: fx.GraphModule, order: Sequence[fx.Node], memory_planning: bool,
                 chain_ends: Sequence[int] = ()) -> Optional[Callable]:
    """The scheduled graph as a native program (bridge/graph_program.cpp): the
    same calls, in the same order, with the same releases as generate()'s
    Python function, but no Python frame or argument parsing per op. Graphs
    with symbolic sizes are expressed too: `sym_size` calls, the size
    arithmetic of `_SIZE_ARITHMETIC` and int lists mixing sizes and constants.
    None when the graph needs Python: other callables, nested outputs."""
    from .. import _C

    program_type = getattr(_C, "_GraphProgram", None)
    if program_type is None:
        return None
    try:
        return _native(gm, order, memory_planning, program_type, set(chain_ends))
    except (_Unsupported, ValueError, TypeError, RuntimeError):
        return None


# Number functions Dynamo leaves in graphs with symbolic sizes (`past_len +
# seq`, `n // heads`): these run on bridge/size_arithmetic.h's fast path where
# int64/double arithmetic gives exactly Python's result; the name is the C++
# operation's. Any other function of numbers (`abs`, `**`, `torch.sym_ite`),
# and these where the fast path cannot promise Python's result (ints past
# int64, division by zero, ...), is called as the Python function it is.
_SIZE_ARITHMETIC: Dict[Any, str] = {
    operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "truediv",
    operator.floordiv: "floordiv", operator.mod: "mod", operator.neg: "neg",
    operator.eq: "eq", operator.ne: "ne", operator.lt: "lt", operator.le: "le", operator.gt: "gt",
    operator.ge: "ge", operator.and_: "and", operator.or_: "or",
    torch.sym_max: "max", torch.sym_min: "min", torch.sym_not: "not",
    torch.sym_float: "float", torch.sym_int: "int", math.trunc: "int", math.floor: "floor",
    math.ceil: "ceil", torch.sym_sum: "sum",
}
_NUMBER_TYPES = (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)


def _is_number(n: fx.Node) -> bool:
    """Whether a graph value is a number at run time (a symbolic size, an int
    or float input), by its traced value."""
    return isinstance(n.meta.get("val"), _NUMBER_TYPES)


def _is_int(n: Any) -> bool:
    if isinstance(n, fx.Node):
        return isinstance(n.meta.get("val"), (int, torch.SymInt)) and not isinstance(n.meta.get("val"), bool)
    return isinstance(n, int) and not isinstance(n, bool)


def _schema_pairs(n: fx.Node) -> List[tuple]:
    """(schema argument, value) for each argument the node passes."""
    arguments = n.target._schema.arguments
    by_name = {a.name: a for a in arguments}
    return list(zip(arguments, n.args)) + [(by_name[k], v) for k, v in n.kwargs.items()]


def _native(gm, order, memory_planning, program_type, ends) -> Callable:
    slots: Dict[fx.Node, int] = {}
    constants: Dict[fx.Node, Any] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n in placeholders:
        val = n.meta.get("val")
        if isinstance(val, torch.SymInt) and val.node.is_nested_int():
            # A jagged tensor's ragged size: at run time a nested int, not a
            # number a slot can hold; the Python program passes it through.
            raise _Unsupported(f"a nested int input: {n.format_node()}")
        slots[n] = len(slots)
    output = order[-1]
    position, returned, last_use, release_after = _liveness(order, memory_planning)

    def spec(arg: Any, wants_tensor: bool = False) -> tuple:
        if isinstance(arg, fx.Node):
            if arg in constants:
                return ("const", constants[arg])
            if wants_tensor and _is_number(arg):
                # `x * x.shape[0]` once the size is dynamic: the Python program
                # passes a number the op's binding wraps; so does the native one.
                return ("number_tensor", slots[arg])
            return ("slot", slots[arg])
        if isinstance(arg, (list, tuple)) and any(isinstance(a, fx.Node) for a in arg):
            if all(_is_int(a) and a not in constants for a in arg):
                # A size list with symbolic entries: `view(x, [1, 4, s0 + 1, 64])`.
                return ("ilist", [("slot", slots[a]) if isinstance(a, fx.Node) else ("const", a) for a in arg])
            if not all(a is None or (isinstance(a, fx.Node) and a not in constants) for a in arg):
                raise _Unsupported("a list mixing values and constants")
            return ("list", [None if a is None else slots[a] for a in arg])
        return ("const", arg)

    def operand(arg: Any) -> tuple:
        if isinstance(arg, fx.Node):
            if arg in constants or not _is_number(arg):
                raise _Unsupported(f"a number function of a non-number: {arg.format_node()}")
            return ("slot", slots[arg])
        if arg is not None and not isinstance(arg, (int, float, bool)):
            raise _Unsupported(f"a number function of {type(arg).__name__}")
        return ("const", arg)

    instructions: List[tuple] = []

    def release(n: fx.Node) -> None:
        if n in slots:
            instructions.append(("release", slots[n]))

    if memory_planning:
        for n in placeholders:
            if n not in last_use and n not in returned:
                release(n)
    for n in order:
        if n.op in ("placeholder", "output"):
            continue
        if n.op == "get_attr":
            value = gm
            for part in n.target.split("."):
                value = getattr(value, part)
            constants[n] = value
        elif n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            leaves = _leaves(n.meta.get("val"))
            if (any(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) for v in leaves)
                    and not all(isinstance(v, _NUMBER_TYPES) for v in leaves)):
                raise _Unsupported("symbolic numbers beside tensors in a result")
            # Ops implemented in Python (prims such as the fma Dynamo makes of
            # addcmul_(..., value=v)) would get the program's wrapped-number
            # tensors back as Python floats and reject them.
            if n.target.namespace != "aten":
                raise _Unsupported(f"not an ATen op: {n.format_node()}")
            known = {a.name for a in n.target._schema.arguments}
            if any(k not in known for k in n.kwargs):
                raise _Unsupported(f"keyword not in the schema: {n.format_node()}")
            wants_tensor = {a.name for a, v in _schema_pairs(n) if isinstance(a.type, torch._C.TensorType)}
            arguments = n.target._schema.arguments
            slots[n] = len(slots)
            name, overload = str(n.target._schema.name), n.target._overloadname
            instructions.append(("call", name, "" if overload == "default" else overload,
                                 [spec(a, arguments[i].name in wants_tensor) for i, a in enumerate(n.args)],
                                 {k: spec(v, k in wants_tensor) for k, v in n.kwargs.items()}, slots[n]))
        elif n.op == "call_function" and n.target is operator.getitem and isinstance(n.args[1], int):
            slots[n] = len(slots)
            instructions.append(("getitem", slots[n.args[0]], n.args[1], slots[n]))
        elif (n.op == "call_function" and _is_number(n) and not n.kwargs and callable(n.target)
              and not isinstance(n.target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket,
                                            torch._ops.HigherOrderOperator))):
            # A function of numbers: size arithmetic, or any other pure number
            # function Dynamo leaves (called from C++ as the Python function).
            pack = n.target is torch.sym_sum
            if pack and (len(n.args) != 1 or not isinstance(n.args[0], (list, tuple))):
                raise _Unsupported(n.format_node())
            arguments = n.args[0] if pack else n.args
            if any(isinstance(a, (list, tuple, dict)) for a in arguments):
                raise _Unsupported(f"a number function of a container: {n.format_node()}")
            slots[n] = len(slots)
            instructions.append(("number", _SIZE_ARITHMETIC.get(n.target, ""), [operand(a) for a in arguments],
                                 slots[n], n.target, pack))
        else:
            raise _Unsupported(n.format_node())
        if memory_planning and n not in last_use and n not in returned:
            release(n)
        for dead in release_after.get(position[n], ()):
            release(dead)
        if position[n] in ends:
            instructions.append(("end_chain",))
    result = output.args[0]
    items = result if isinstance(result, (list, tuple)) else [result]
    outputs: List[Any] = []
    for r in items:
        if isinstance(r, fx.Node) and r in slots:
            outputs.append(slots[r])
        elif isinstance(r, fx.Node) and r in constants:
            outputs.append(("const", constants[r]))
        elif r is None or isinstance(r, (int, float, bool)):
            outputs.append(("const", r))
        else:
            raise _Unsupported("output structure")
    native = program_type(len(slots), len(placeholders), instructions, outputs)
    if isinstance(result, tuple):
        return lambda args: tuple(native(args))
    if isinstance(result, list):
        return native
    return lambda args: native(args)[0]


def _leaves(value: Any) -> List[Any]:
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _leaves(v)]
    return [value]
