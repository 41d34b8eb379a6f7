"""Options of the vtpu torch.compile backend:
``torch.compile(m, backend="vtpu", options={...})``."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Mapping, Optional


@dataclass(frozen=True)
class CompileOptions:
    # Run the graph's elementwise ops through fused eager's window (one kernel
    # per group of related ops); False runs one kernel per op, as strict mode.
    fusion: bool = True
    # Free each intermediate right after its last use (and the graph's inputs
    # once read); False keeps every value alive until the graph returns.
    memory_planning: bool = True
    # Reorder independent nodes so that elementwise work is not cut into
    # several windows by matmuls and reductions it does not depend on.
    schedule: bool = True
    # Run each graph's calls from C++ (bridge/graph_program.cpp): the same
    # calls in the same order as the generated Python program, without a
    # Python frame and argument parsing per op; symbolic sizes and their
    # arithmetic included. Graphs with other non-ATen callables or nested
    # outputs keep the Python program.
    native: bool = True
    # Partition training graphs with AOTAutograd's min-cut partitioner: the
    # backward recomputes cheap elementwise values from what the forward
    # saved instead of the forward storing them (same kernels, same bits).
    recompute: bool = True
    # Write each graph's FX code, its vtpu program and the IR and source of
    # every kernel compiled while it first runs to this directory.
    dump_dir: Optional[str] = None

    @classmethod
    def parse(cls, options: Optional[Mapping[str, Any]]) -> "CompileOptions":
        if options is None:
            return cls()
        if not isinstance(options, Mapping):
            raise TypeError(f"vtpu backend options must be a dict, got {type(options).__name__}")
        known = {f.name: f for f in fields(cls)}
        values = {}
        for name, value in options.items():
            if name not in known:
                raise ValueError(f"unknown vtpu backend option {name!r}: expected one of "
                                 f"{', '.join(sorted(known))}")
            if name == "dump_dir":
                if value is not None and not isinstance(value, (str, os.PathLike)):
                    raise TypeError(f"vtpu backend option 'dump_dir' must be a path, got "
                                    f"{type(value).__name__}")
                values[name] = None if value is None else os.fspath(value)
            else:
                if not isinstance(value, bool):
                    raise TypeError(f"vtpu backend option {name!r} must be a bool, got "
                                    f"{type(value).__name__}")
                values[name] = value
        return cls(**values)
