"""Time to the first training steps of a new server, with and without the shared tier
of the compile cache (DESIGN.md "Compile cache"; docs/architecture.md).

    .venv/bin/python benchmarks/shared_cache.py [--mode fused] [--steps 2]

Each row is a fresh process ("server") with its own empty local cache directory
(`VTPU_CACHE_DIR`), running `--steps` AdamW training steps of the Qwen3-style decoder
in `--mode`, including waiting for background fused-kernel builds:

    cold            no shared tier: every kernel outside the ahead-of-time library compiles
    shared (dir)    a second server over a shared directory the first one filled
    shared (redis)  the same through a redis-server started on a loopback port (skipped
                    when redis-server is not installed)
    warm local      the first server's directory again (what a restart of it costs)

Reported: wall seconds of the process (import included), the seconds the steps took,
engine compiles and cache hits by tier. All rows must give the same loss.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

STEP_PROGRAM = r"""
import json, sys, time, torch, torch_vtpu
from torch_vtpu.models import Qwen3Mini, Qwen3MiniConfig
mode, steps = sys.argv[1], int(sys.argv[2])
started = time.perf_counter()
torch.manual_seed(0)
torch_vtpu.set_mode(mode)
cfg = Qwen3MiniConfig()
model = Qwen3Mini(cfg).to("vtpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(0, cfg.vocab_size, (2, 64)).to("vtpu")
for _ in range(steps):
    logits = model(ids)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.vtpu.synchronize()
torch_vtpu._C._wait_for_fusion_compiles()
m = torch_vtpu.metrics()
print(json.dumps({"steps_s": time.perf_counter() - started, "compiles": m["compiles"],
                  "hits": m["cache_hits"], "refused": m["shared_cache_refused"],
                  "errors": m["shared_cache_errors"], "loss": loss.item()}))
"""

SIGNING_KEY = "benchmark-signing-key-0123456789"


def _server(local: str, shared: str | None, mode: str, steps: int) -> dict:
    env = dict(os.environ, VTPU_CACHE_DIR=local, VTPU_CACHE_KEY=SIGNING_KEY)
    env.pop("VTPU_SHARED_CACHE", None)
    if shared:
        env["VTPU_SHARED_CACHE"] = shared
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", STEP_PROGRAM, mode, str(steps)], env=env, capture_output=True,
                         text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"server failed:\n{out.stderr[-3000:]}")
    report = json.loads(out.stdout.strip().splitlines()[-1])
    report["wall_s"] = time.perf_counter() - started
    return report


def _redis(binary: str):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                               "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return server, f"redis://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline:
                server.kill()
                raise SystemExit("redis-server did not start")
            time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", default="fused", choices=("strict", "fused", "debug"))
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="vtpu-shared-bench-")
    rows = []
    try:
        shared_dir = os.path.join(root, "shared")
        os.mkdir(shared_dir)
        rows.append(("cold", _server(os.path.join(root, "a"), None, args.mode, args.steps)))
        _server(os.path.join(root, "filler"), shared_dir, args.mode, args.steps)  # fills the shared directory
        rows.append(("shared (dir)", _server(os.path.join(root, "b"), shared_dir, args.mode, args.steps)))
        binary = shutil.which("redis-server")
        if binary:
            server, url = _redis(binary)
            try:
                _server(os.path.join(root, "r1"), url, args.mode, args.steps)
                rows.append(("shared (redis)", _server(os.path.join(root, "r2"), url, args.mode, args.steps)))
            finally:
                server.kill()
                server.wait()
        else:
            print("shared (redis): skipped, redis-server is not installed")
        rows.append(("warm local", _server(os.path.join(root, "a"), None, args.mode, args.steps)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"first {args.steps} {args.mode}-mode Qwen3-style training steps of a new server")
    print(f"{'server':<16}{'wall s':>8}{'steps s':>9}{'compiles':>10}  cache hits (disk/shared)  loss")
    for name, r in rows:
        hits = r["hits"]
        print(f"{name:<16}{r['wall_s']:>8.2f}{r['steps_s']:>9.2f}{r['compiles']:>10}  "
              f"{hits['disk']:>5} / {hits['shared']:<17}{r['loss']:.6f}")
    losses = {r["loss"] for _, r in rows}
    print("same loss on every server:", "yes" if len(losses) == 1 else f"NO {sorted(losses)}")
    return 0 if len(losses) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
