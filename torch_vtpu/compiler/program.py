"""A compiled graph at run time: its generated program, run in the execution
mode the options ask for, and the counters of compiled execution."""
from __future__ import annotations

import itertools
import os
import threading
from typing import Any, Dict, List

import torch.fx as fx

from .. import _C
from . import passes
from .codegen import Program, build_native, generate, has_only_functions
from .options import CompileOptions
from .schedule import chain_ends, schedule

_lock = threading.Lock()
_counters: Dict[str, Any] = {}
_graph_ids = itertools.count()


def _reset() -> None:
    with _lock:
        _counters.clear()
        _counters.update({"graphs": {"forward": 0, "backward": 0, "inference": 0}, "graph_runs": 0})


_reset()


def counters() -> Dict[str, Any]:
    with _lock:
        return {"graphs": dict(_counters["graphs"]), "graph_runs": _counters["graph_runs"]}


class CompiledGraph:
    """Called by AOTAutograd's runtime with the graph's inputs in a list that
    it may consume (boxed calling convention), so inputs die inside the graph."""

    def __init__(self, gm: fx.GraphModule, kind: str, options: CompileOptions):
        # An instance attribute: Dynamo wraps the backward in a function that
        # copies the instance __dict__ (functools.wraps), not class attributes.
        self._boxed_call = True
        self.kind = kind
        self.options = options
        self.graph_id = next(_graph_ids)
        # fusion=False is strict mode's one kernel per op; debug mode (set by the
        # user) is kept as it is: its checks and exact error locations win.
        self._mode = "fused" if options.fusion else "strict"
        if has_only_functions(gm):
            self.rewrites = passes.rewrite(gm)
            order = schedule(gm.graph) if options.schedule else list(gm.graph.nodes)
            # Chain boundaries matter only when temporaries die early (their
            # blocks are then reused by the next chain).
            ends = chain_ends(order) if options.schedule and options.memory_planning else []
            self.program = generate(gm, order, options.memory_planning, ends)
            native = build_native(gm, order, options.memory_planning, ends) if options.native else None
            self.native = native is not None
            self._run = native if native is not None else self.program.fn
        else:  # modules or methods left in the graph: FX's own code runs it
            self.rewrites = {}
            self.native = False
            self.program = Program(source=gm.code, fn=None)
            forward = gm.forward

            def run_fx(args: List[Any]) -> Any:
                values = list(args)
                args.clear()
                return forward(*values)

            self._run = run_fx
        self._dump_kernels_on_first_run = options.dump_dir is not None
        if options.dump_dir is not None:
            self._dump(gm)
        with _lock:
            _counters["graphs"][kind] += 1

    def _dump(self, gm: fx.GraphModule) -> None:
        os.makedirs(self.options.dump_dir, exist_ok=True)
        stem = os.path.join(self.options.dump_dir, f"graph_{self.graph_id:03d}_{self.kind}")
        with open(stem + ".fx.py", "w") as f:
            f.write(gm.print_readable(print_output=False))
        with open(stem + ".program.py", "w") as f:
            f.write(f"# vtpu program of graph {self.graph_id} ({self.kind}), options {self.options}\n")
            f.write("# runs as a native program: these calls, from C++\n" if self.native else
                    "# runs as this Python function\n")
            f.write(self.program.source)

    def __call__(self, args: List[Any]) -> Any:
        with _lock:
            _counters["graph_runs"] += 1
        if self._dump_kernels_on_first_run:
            self._dump_kernels_on_first_run = False
            return self._run_dumping_kernels(args)
        return self._run_in_mode(args)

    def _run_in_mode(self, args: List[Any]) -> Any:
        previous = _C._get_mode()
        if previous == "debug" or previous == self._mode:
            return self._run(args)
        _C._set_mode(self._mode)  # a mode change flushes the caller's window first
        try:
            return self._run(args)
        finally:
            _C._set_mode(previous)

    def _run_dumping_kernels(self, args: List[Any]) -> Any:
        """The engine writes the IR and source of each kernel it compiles to
        VTPU_DUMP_KERNELS. Background fusion compiles are drained before the
        variable changes, so no compile thread reads the environment while it
        is written."""
        directory = os.path.join(self.options.dump_dir, f"graph_{self.graph_id:03d}_{self.kind}_kernels")
        os.makedirs(directory, exist_ok=True)
        _C._wait_for_fusion_compiles()
        previous = os.environ.get("VTPU_DUMP_KERNELS")
        os.environ["VTPU_DUMP_KERNELS"] = directory
        try:
            result = self._run_in_mode(args)
            _C._synchronize()
            _C._wait_for_fusion_compiles()
            return result
        finally:
            if previous is None:
                del os.environ["VTPU_DUMP_KERNELS"]
            else:
                os.environ["VTPU_DUMP_KERNELS"] = previous
