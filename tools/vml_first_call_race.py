"""Count fresh processes whose first CPU unary op gives other values than
the same op called again (pytorch/pytorch#188792; torch_vtpu/_mkl_vml.py).

    .venv/bin/python tools/vml_first_call_race.py [--processes N] [--parallel P] [--warm]

Each process seeds, builds a 64x33 float tensor (two OpenMP chunks of ATen's
2048-element grain), calls exp, log, sqrt, sin and tanh once each and again,
and reports the ops whose two results differ. --warm runs torch_vtpu's VML
warm-up first. The race needs the cores busy: run with P above the core count.
"""
import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys, torch
if sys.argv[1] == "warm":
    sys.path.insert(0, sys.argv[2])
    import importlib.util
    spec = importlib.util.spec_from_file_location("_mkl_vml", sys.argv[2] + "/torch_vtpu/_mkl_vml.py")
    module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); module.warm_up()
torch.manual_seed(0)
x = torch.rand(64, 33) + 0.5
bad = {}
for name in ("exp", "log", "sqrt", "sin", "tanh"):
    first = getattr(torch, name)(x); again = getattr(torch, name)(x)
    if not torch.equal(first, again):
        rel = ((first.double() - again.double()).abs() / again.double().abs()).flatten()
        off = (rel > 0).nonzero().flatten()
        bad[name] = {"elements": off.numel(), "first": int(off[0]), "max_rel": rel.max().item()}
print(json.dumps(bad))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--warm", action="store_true")
    args = parser.parse_args()
    if args.processes < 1 or args.parallel < 1:
        parser.error("--processes and --parallel must be >= 1")
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # torch would import torch_vtpu itself (its backend entry point), and with
    # it the warm-up: only --warm may run it.
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    corrupted, done = [], 0
    while done < args.processes:
        wave = [subprocess.Popen([sys.executable, "-c", CHILD, "warm" if args.warm else "cold", root],
                                 stdout=subprocess.PIPE, text=True, env=env)
                for _ in range(min(args.parallel, args.processes - done))]
        for p in wave:
            out, _ = p.communicate()
            if p.returncode != 0 or not out.strip():
                print(f"a child process failed (exit {p.returncode})", file=sys.stderr)
                return 1
            report = json.loads(out.strip().splitlines()[-1])
            if report:
                corrupted.append(report)
        done += len(wave)
    print(json.dumps({"processes": done, "warm": args.warm, "corrupted": len(corrupted), "reports": corrupted[:10]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
