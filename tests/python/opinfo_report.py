"""Runs the full OpInfo sweep (every entry of op_db, five variants) and writes
docs/opinfo_failures.md: pass rates per variant and every failing entry.

    .venv/bin/python tests/python/opinfo_report.py               # run what is missing, write the doc
    .venv/bin/python tests/python/opinfo_report.py --rerun-failures
    .venv/bin/python tests/python/opinfo_report.py --fresh       # ignore earlier results
    .venv/bin/python tests/python/opinfo_report.py --doc-only    # rewrite the doc from the results

Results are JSON lines in docs/_generated_tmp/opinfo_results.jsonl, the file
`VTPU_OPINFO_FULL=1 pytest tests/python/test_opinfo.py` writes as well. Results
of the installed bridge build are reused: only (entry, variant) pairs without
one are run, so a sweep that was interrupted resumes where it stopped, and the
Makefile's `opinfo-full` (pytest first, then this script) runs each pair once.
Entries run in worker processes (test_opinfo.Worker): a segfault or a hang
fails that entry and the sweep goes on.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_opinfo as sweep  # noqa: E402

DOC = sweep.REPO_ROOT / "docs" / "opinfo_failures.md"
BARS = {"f32": 97.0, "f32_grad": 95.0}
Key = Tuple[str, str]


def load_results(path: Path, build: str, max_samples: int) -> Dict[Key, Dict[str, Any]]:
    """The latest result per (entry, variant) recorded for bridge build
    `build` with `max_samples` samples."""
    results: Dict[Key, Dict[str, Any]] = {}
    if not path.exists():
        return results
    samples = None
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a killed run
        if record.get("kind") == "header":
            samples = record.get("max_samples")
        if record.get("kind") != "result" or record.get("bridge_build") != build \
                or samples != max_samples:
            continue
        results[(record["entry"], record["variant"])] = record
    return results


def run_sweep(tasks: List[Key], writer: sweep.ResultWriter, jobs: int, timeout_s: int,
              max_samples: int, results: Dict[Key, Dict[str, Any]]) -> List[str]:
    """Runs `tasks` on `jobs` workers; returns the errors that stopped it
    (a worker that cannot start: the package does not import)."""
    build = sweep.bridge_build_id()
    queue = list(tasks)
    lock = threading.Lock()
    done = [0]
    errors: List[str] = []
    start = time.monotonic()
    env = {"VTPU_OPINFO_THREADS": "1"} if jobs > 1 else {}

    def drive() -> None:
        worker = sweep.Worker(env=env)
        try:
            while True:
                with lock:
                    if not queue or errors:
                        return
                    entry, variant = queue.pop(0)
                try:
                    result = worker.run(entry, variant, timeout_s=timeout_s, max_samples=max_samples)
                except sweep.WorkerStartError as error:
                    with lock:
                        errors.append(str(error))
                    return
                except Exception as error:  # a garbled answer: fail the pair, restart the worker
                    worker.close()
                    result = {"entry": entry, "variant": variant, "status": "fail",
                              "reason": f"HarnessError: {type(error).__name__}: {error}",
                              "detail": "", "compared": 1, "skipped_samples": 0, "seconds": 0.0,
                              "leaked_bytes": 0}
                record = {"kind": "result", "bridge_build": build, **result}
                writer.write(record)
                with lock:
                    results[(entry, variant)] = record
                    done[0] += 1
                    if done[0] % 100 == 0 or done[0] == len(tasks):
                        rate = done[0] / max(time.monotonic() - start, 1e-9)
                        print(f"  {done[0]}/{len(tasks)} ({rate:.1f}/s, "
                              f"{(len(tasks) - done[0]) / max(rate, 1e-9):.0f} s left)", flush=True)
        finally:
            worker.close()

    threads = [threading.Thread(target=drive, daemon=True) for _ in range(max(1, jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


# ---- the document -------------------------------------------------------------

def _cell(text: str, limit: int = 180) -> str:
    text = " ".join(str(text).split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("|", "\\|")


def _category(reason: str) -> str:
    """A failure's reason with the instance-specific parts (numbers, shapes,
    the vtpu stream-context suffix) removed, to group failures by cause."""
    reason = re.sub(r"\s*\(?\[vtpu\] raised by .*", "", reason)
    reason = re.sub(r"^Mismatch: (output|grad|input after the op)(\[\d+\])?:", r"Mismatch: \1:", reason)
    reason = re.sub(r"0x[0-9a-f]+", "#", reason)
    reason = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", reason)
    return reason[:140]


def render(results: Dict[Key, Dict[str, Any]], header: Dict[str, Any]) -> str:
    entries = [sweep.entry_name(op) for op in sweep.op_db]
    lines: List[str] = []
    add = lines.append
    add("# OpInfo sweep: vtpu against the CPU")
    add("")
    add("Generated by `tests/python/opinfo_report.py` (the full sweep of "
        "`tests/python/test_opinfo.py`); do not edit by hand.")
    add("")
    add(f"- Run: {header['time']}; torch {header['torch']}, torch_vtpu {header['vtpu']}, "
        f"bridge build `{header['bridge_build']}`, mode `{header['mode']}`")
    add(f"- {len(entries)} OpInfo entries × {len(sweep.VARIANTS)} variants; at most {header['max_samples']} sample "
        "inputs per entry and variant; an entry passes when every compared sample matches the "
        "CPU (`torch.testing.assert_close`: exact dtype and shape, the OpInfo's tolerance or "
        "assert_close's default), outputs and inputs after the op (in-place writes) alike.")
    add("- Gradients: backward through the op's outputs with a fixed random cotangent; input "
        "gradients compared.")
    add("- Pass rate = passed / (entries not skipped). Skips are by design (random or "
        "uninitialised output, dtype not supported by the op on the CPU, sparse, CUDA-only) "
        "and are listed below with their reasons.")
    add("")
    add("## Pass rates")
    add("")
    add("| variant | passed/total (pct) | failed | skipped | bar |")
    add("|---|---|---|---|---|")
    for variant in sweep.VARIANTS:
        statuses = Counter(results[(e, variant)]["status"] for e in entries if (e, variant) in results)
        total = statuses["pass"] + statuses["fail"]
        pct = 100.0 * statuses["pass"] / total if total else 0.0
        bar = ""
        if variant in BARS:
            bar = f"≥ {BARS[variant]:g}%: " + ("met" if pct >= BARS[variant] else "**not met**")
        missing = sum(1 for e in entries if (e, variant) not in results)
        skipped = f"{statuses['skip']}" + (f" (+{missing} not run)" if missing else "")
        add(f"| {sweep.VARIANT_LABEL[variant]} | {statuses['pass']}/{total} ({pct:.1f}%) | "
            f"{statuses['fail']} | {skipped} | {bar} |")
    add("")

    failures = [(e, v, results[(e, v)]) for e in entries for v in sweep.VARIANTS
                if (e, v) in results and results[(e, v)]["status"] == "fail"]
    add("## Failures by cause")
    add("")
    if failures:
        by_cause: Dict[str, List[str]] = defaultdict(list)
        for entry, variant, record in failures:
            by_cause[_category(record["reason"])].append(f"{entry} ({variant})")
        add("| failing entries | cause (normalised first line) | examples |")
        add("|---|---|---|")
        for cause, items in sorted(by_cause.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            add(f"| {len(items)} | {_cell(cause, 140)} | {_cell(', '.join(items[:4]), 160)} |")
    else:
        add("None.")
    add("")
    add("## Failing entries")
    add("")
    if failures:
        add("| entry | variant | reason (first line of the error) |")
        add("|---|---|---|")
        for entry, variant, record in failures:
            add(f"| `{entry}` | {sweep.VARIANT_LABEL[variant]} | {_cell(record['reason'])} |")
    else:
        add("None.")
    add("")

    leaks = [(e, v, results[(e, v)]["leaked_bytes"]) for e in entries for v in sweep.VARIANTS
             if (e, v) in results and results[(e, v)].get("leaked_bytes", 0) > 0]
    add("## Device memory still allocated after an entry")
    add("")
    add("Measured after the entry dropped its tensors (garbage collected, stream drained, cache "
        "emptied); listed only when three runs of the entry in a row each leave memory behind "
        "(the least is shown), so that a cache filled once does not count.")
    add("")
    if leaks:
        add("| entry | variant | bytes |")
        add("|---|---|---|")
        for entry, variant, nbytes in leaks:
            add(f"| `{entry}` | {sweep.VARIANT_LABEL[variant]} | {nbytes} |")
    else:
        add("None.")
    add("")

    add("## Skipped")
    add("")
    skip_reasons: Dict[str, List[str]] = defaultdict(list)
    for e in entries:
        for v in sweep.VARIANTS:
            record = results.get((e, v))
            if record is not None and record["status"] == "skip":
                skip_reasons[_category(record["reason"])].append(f"{e} ({v})")
    add("| count | reason | entries |")
    add("|---|---|---|")
    for reason, items in sorted(skip_reasons.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        add(f"| {len(items)} | {_cell(reason, 120)} | {_cell(', '.join(items), 400)} |")
    add("")
    add("## Reproducing")
    add("")
    add("```")
    add("VTPU_OPINFO_ONLY=<entry> .venv/bin/python -m pytest -q tests/python/test_opinfo.py  "
        "# one entry, all variants")
    add(".venv/bin/python tests/python/opinfo_report.py --rerun-failures                  "
        "# refresh this file")
    add("```")
    add("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=sweep.DEFAULT_RESULTS)
    parser.add_argument("--doc", type=Path, default=DOC)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--timeout", type=int, default=sweep.ENTRY_TIMEOUT_S,
                        help="seconds per entry and variant")
    parser.add_argument("--max-samples", type=int, default=int(os.environ.get(
        "VTPU_OPINFO_MAX_SAMPLES", sweep.FULL_SAMPLES)), help="sample inputs per entry and variant")
    parser.add_argument("--fresh", action="store_true", help="ignore earlier results")
    parser.add_argument("--rerun-failures", action="store_true", help="run failed pairs again")
    parser.add_argument("--only", default="", help="comma-separated entry names to (re)run")
    parser.add_argument("--doc-only", action="store_true", help="write the doc, run nothing")
    args = parser.parse_args()

    build = sweep.bridge_build_id()
    header = sweep.run_header(full=True, max_samples=args.max_samples)
    results = {} if args.fresh else load_results(args.results, build, args.max_samples)
    ops = {sweep.entry_name(op): op for op in sweep.op_db}
    all_pairs = [(entry, v) for entry in ops for v in sweep.VARIANTS]
    if args.only:
        wanted = {name.strip() for name in args.only.split(",") if name.strip()}
        rerun = {(e, v) for e, v in all_pairs if e in wanted or ops[e].name in wanted}
    elif args.rerun_failures:
        rerun = {k for k, r in results.items() if r["status"] == "fail"}
    else:
        rerun = set()
    todo = [k for k in all_pairs if k not in results or k in rerun]

    if not args.doc_only and todo:
        writer = sweep.ResultWriter(args.results, header, truncate=args.fresh)
        # Statically skipped pairs need no worker.
        to_run = []
        for entry, variant in todo:
            reason = sweep.static_skip_reason(ops[entry], variant)
            if reason is None:
                to_run.append((entry, variant))
                continue
            record = {"kind": "result", "bridge_build": build, "entry": entry, "op": ops[entry].name,
                      "variant": variant, "status": "skip", "reason": reason, "detail": "",
                      "compared": 0, "skipped_samples": 0, "seconds": 0.0, "leaked_bytes": 0}
            writer.write(record)
            results[(entry, variant)] = record
        print(f"running {len(to_run)} (entry, variant) pairs on {args.jobs} worker(s); "
              f"{len(all_pairs) - len(todo)} reused from {args.results}", flush=True)
        errors = run_sweep(to_run, writer, args.jobs, args.timeout, args.max_samples, results)
        writer.close()
        if errors:
            print(f"sweep stopped, {args.doc} left as it was:\n{errors[0]}", file=sys.stderr)
            return 2

    args.doc.parent.mkdir(parents=True, exist_ok=True)
    args.doc.write_text(render(results, header), encoding="utf-8")
    print(f"wrote {args.doc}")
    for variant in sweep.VARIANTS:
        statuses = Counter(r["status"] for (e, v), r in results.items() if v == variant)
        total = statuses["pass"] + statuses["fail"]
        pct = 100.0 * statuses["pass"] / total if total else 0.0
        print(f"  {sweep.VARIANT_LABEL[variant]:13s} {statuses['pass']}/{total} ({pct:.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
