"""Command line: ``python -m torch_vtpu <command>`` (also installed as ``vtpu``).

    info          versions, device, mode, memory and metrics
    cache stats   where the compile cache is and how big it is (local and shared tiers)
    cache clear   delete the entries of the local compile cache (never the shared tier's)
    bench         micro-benchmarks (torch_vtpu._bench)
    demo          train a small language model on the device (torch_vtpu.demo)
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import stat
import sys
from pathlib import Path
from typing import Optional, Sequence, Tuple

import torch

import torch_vtpu


def cache_dir() -> Path:
    """The local tier of the compile cache: $VTPU_CACHE_DIR, else ~/.cache/vtpu."""
    configured = os.environ.get("VTPU_CACHE_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "vtpu"


def cache_usage(path: Path) -> Tuple[int, int]:
    """(entries, bytes) under ``path``: entries are the cache's ``*.entry`` files (lock and
    temporary files are not entries), bytes count every regular file; (0, 0) when absent."""
    entries = size = 0
    for root, _, files in os.walk(path):  # a missing or unreadable directory yields nothing
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue  # removed while we walked
            if stat.S_ISREG(st.st_mode):
                entries += name.endswith(".entry")
                size += st.st_size
    return entries, size


def _format_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # unreachable; keeps type checkers content


def _redacted(url: str) -> str:
    """``url`` with a password replaced by ``***`` (redis://user:secret@host -> redis://user:***@host)."""
    return re.sub(r"^([a-z]+://[^:@/]*:)[^/]*@", r"\1***@", url)


def cmd_info(_: argparse.Namespace) -> int:
    free, total = torch.vtpu.mem_get_info()
    print(f"torch_vtpu   {torch_vtpu.__version__}")
    print(f"torch        {torch.__version__}")
    print(f"device       vtpu (target: host CPU), count {torch.vtpu.device_count()}, "
          f"available {torch.vtpu.is_available()}")
    print(f"mode         {torch_vtpu.get_mode()}")
    # The engine's hardware layer: the device runs on the host target; the
    # cuda target runs engine kernels on a GPU where one is present.
    for name, available, detail in torch_vtpu._C._engine_targets():
        print(f"target {name:<5} {'available: ' if available else 'unavailable: '}{detail}")
    print(f"memory       {_format_bytes(free)} free of {_format_bytes(total)} "
          f"(allocated {_format_bytes(torch.vtpu.memory_allocated())})")
    print(f"cache dir    {cache_dir()}")
    print(f"shared cache {_redacted(os.environ.get('VTPU_SHARED_CACHE') or 'none')}")
    print("metrics")
    for key, value in torch_vtpu.metrics().items():
        if isinstance(value, dict):
            shown = ", ".join(f"{k}={v}" for k, v in sorted(value.items())) or "-"
            print(f"  {key:<18} {shown}")
        else:
            print(f"  {key:<18} {value}")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    path = cache_dir()
    if args.action == "stats":
        entries, size = cache_usage(path)
        print(f"path         {path}{'' if path.is_dir() else ' (does not exist)'}")
        print(f"entries      {entries}")
        print(f"bytes        {size} ({_format_bytes(size)})")
        if entries == 0:
            # Generated kernels are opt-in until the ahead-of-time library lands.
            print("note         empty: kernels outside the ahead-of-time library are cached here on first use")
        return _print_shared_tier()

    # clear: delete the cache's own files, nothing else, and never the directory itself.
    # A mistyped VTPU_CACHE_DIR can name any directory: a cache is flat and holds only
    # the files the disk tier writes, so anything else there means it is not one.
    if not path.is_dir():
        print(f"nothing to clear: {path} does not exist" if not path.exists()
              else f"nothing to clear: {path} is not a directory")
        return 0
    resolved = path.resolve()
    children = sorted(resolved.iterdir())
    foreign = [child.name for child in children if not _is_cache_file(child)]
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        print(f"refusing to clear {resolved}: it holds files that are not compile-cache entries ({shown}); "
              "is VTPU_CACHE_DIR right?", file=sys.stderr)
        return 2
    entries, size = cache_usage(resolved)
    for child in children:
        try:
            child.unlink()
        except FileNotFoundError:
            pass  # another process evicted it meanwhile
    print(f"cleared {path}: removed {entries} entries, {_format_bytes(size)}")
    return 0


_CACHE_FILE = re.compile(r"^(?:[0-9a-f]{32}\.(?:entry|lock)|\.tmp\.[0-9a-f]{32}\..+|\.trim\.lock)$")


def _is_cache_file(child: Path) -> bool:
    """A file the disk tier writes (engine/include/vtpu/cache/disk_tier.h: `<key>.entry`,
    `<key>.lock`, `.tmp.<key>.*`, `.trim.lock`), as a plain file, not a link or directory."""
    return bool(_CACHE_FILE.match(child.name)) and child.is_file() and not child.is_symlink()


def _same_directory(a: Path, b: Path) -> bool:
    try:
        return a.is_dir() and b.is_dir() and os.path.samefile(a, b)
    except OSError:
        return False


def _print_shared_tier() -> int:
    """The shared tier's lines of ``cache stats``; 2 when it is misconfigured."""
    status = torch_vtpu._C._shared_cache_status()
    if status is None:
        print("shared tier  none (set VTPU_SHARED_CACHE to a shared directory, redis://host:port or rediss://host:port)")
        return 0
    if "error" in status:
        print(f"shared tier  {status['location']}: not usable: {status['error']}", file=sys.stderr)
        return 2
    shared = os.environ.get("VTPU_SHARED_CACHE", "")
    if "://" not in shared and _same_directory(Path(shared).expanduser(), cache_dir()):
        # The compile cache refuses this set-up (the tiers would delete each
        # other's temporary files) and the process runs on ATen's kernels.
        print(f"shared tier  {status['location']}: not usable: VTPU_SHARED_CACHE and VTPU_CACHE_DIR name the "
              "same directory; give the shared tier its own", file=sys.stderr)
        return 2
    print(f"shared tier  {status['location']}")
    if status["counted"]:
        print(f"  entries    {status['entries']}")
        print(f"  bytes      {status['bytes']} ({_format_bytes(status['bytes'])})")
    if status["reachable"]:
        print("  reachable  yes")
    else:
        print(f"  reachable  no: {status['last_error']}")
    return 0


def cmd_bench(argv: Sequence[str]) -> int:
    try:
        bench = importlib.import_module("torch_vtpu._bench")
    except ModuleNotFoundError as error:
        if error.name != "torch_vtpu._bench":
            raise  # _bench exists but something it imports is missing: show that
        bench = None
    if bench is None or not hasattr(bench, "main"):
        print("bench is unavailable: torch_vtpu._bench.main is not installed", file=sys.stderr)
        return 1
    result = bench.main(list(argv)) if argv else bench.main()
    return int(result or 0)


def cmd_demo(argv: Sequence[str]) -> int:
    from torch_vtpu import demo

    return int(demo.main(list(argv)) or 0)


# bench and demo parse their own options: everything after the command is theirs.
_PASS_THROUGH = {"bench": cmd_bench, "demo": cmd_demo}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m torch_vtpu", description="vTPU command line",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    sub.add_parser("info", help="versions, device, mode, memory, metrics").set_defaults(func=cmd_info)
    cache = sub.add_parser("cache", help="inspect or clear the compile cache")
    cache.add_argument("action", choices=("stats", "clear"))
    cache.set_defaults(func=cmd_cache)
    sub.add_parser("bench", help="micro-benchmarks (options: bench --help)")
    sub.add_parser("demo", help="train a small language model on vtpu (options: demo --help)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _PASS_THROUGH:
        return _PASS_THROUGH[argv[0]](argv[1:])
    args = _parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
