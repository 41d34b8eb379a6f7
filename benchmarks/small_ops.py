"""Benchmark: per-op overhead of strict mode on a chain of 10,000 small adds,
against stock CPU eager, in one run. Usage: .venv/bin/python benchmarks/small_ops.py"""
import sys

from torch_vtpu._bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
