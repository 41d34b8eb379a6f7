"""vtpu across processes (found by a review of process-level robustness, 2026-12-05):
fork, DataLoader workers, torch.multiprocessing, and what exit reports. Each program
runs in a subprocess with a timeout: the bugs were hangs."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_vtpu

MODES = ["strict", "fused", "debug"]


def _run(program: str, timeout: float = 120, directory=None) -> subprocess.CompletedProcess:
    """`program` in a fresh interpreter; from a file in `directory` when given
    (spawned processes import the main module's classes from it)."""
    program = textwrap.dedent(program)
    command = [sys.executable, "-c", program]
    if directory is not None:
        path = directory / "program.py"
        path.write_text(program)
        command = [sys.executable, str(path)]
    try:
        return subprocess.run(command, env=dict(os.environ), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"the program hung: {hung}")


@pytest.mark.parametrize("mode", MODES)
def test_a_forked_child_that_uses_the_device_raises_cudas_error(mode):
    # It hung at its first read (the stream's worker thread does not survive fork).
    out = _run(f"""
        import os, sys, torch, torch_vtpu
        torch_vtpu.set_mode("{mode}")
        x = torch.ones(3, device="vtpu")
        pid = os.fork()
        if pid == 0:
            assert torch.vtpu._is_in_bad_fork()
            try:
                torch.ones(3, device="vtpu").sum().item()
                os._exit(3)
            except RuntimeError as e:
                assert "Cannot re-initialize vtpu in forked subprocess" in str(e), e
            assert (torch.ones(2) * 3).tolist() == [3.0, 3.0]  # the CPU works
            sys.exit(0)  # a normal exit, with torch_vtpu's exit handler
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        assert not torch.vtpu._is_in_bad_fork()
        print("parent", (x * 2).sum().item())
    """, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "parent 6.0" in out.stdout


def test_a_forked_child_that_never_uses_the_device_exits():
    # The child hung in torch_vtpu's exit handler, waiting for a worker thread
    # it does not have (plain `import torch` autoloads torch_vtpu).
    out = _run("""
        import os, sys, torch
        pid = os.fork()
        if pid == 0:
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
    """, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "child 0" in out.stdout


def test_dataloader_workers_and_device_tensors(tmp_path):
    # Forked workers indexing a vtpu dataset hung the main process (the error
    # was raised in multiprocessing's feeder thread); now they raise CUDA's
    # error, which the DataLoader re-raises. Spawned workers may make vtpu
    # tensors: they travel as CPU copies and arrive on vtpu.
    out = _run("""
        import torch, torch_vtpu
        from torch.utils.data import DataLoader, Dataset, TensorDataset

        class MakesVtpu(Dataset):
            def __len__(self): return 8
            def __getitem__(self, i): return torch.full((2,), float(i), device="vtpu")

        if __name__ == "__main__":
            try:
                for _ in DataLoader(TensorDataset(torch.randn(16, 2, device="vtpu")), batch_size=4, num_workers=2):
                    pass
                print("no error")
            except RuntimeError as e:
                print("fork raised:", "Cannot re-initialize vtpu in forked subprocess" in str(e))
            batches = list(DataLoader(MakesVtpu(), batch_size=4, num_workers=2, multiprocessing_context="spawn"))
            print("spawn:", [(b.device.type, b[:, 0].tolist()) for b in batches])
    """, timeout=240, directory=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "fork raised: True" in out.stdout, out.stdout + out.stderr
    assert "spawn: [('vtpu', [0.0, 1.0, 2.0, 3.0]), ('vtpu', [4.0, 5.0, 6.0, 7.0])]" in out.stdout


def test_device_tensors_as_a_spawned_processs_arguments(tmp_path):
    # Spawn passes the shared copy's file descriptor itself to the child when the
    # process starts; the copy was dropped after pickling, closing it, and the child
    # died unpickling ("unable to resize file"), a queue read from it hung (found by
    # review). A DataLoader whose spawned workers get a vtpu dataset, and mp.spawn,
    # take the same path.
    out = _run("""
        import torch, torch_vtpu
        import torch.multiprocessing as mp
        from torch.utils.data import DataLoader, TensorDataset

        def child(t, weight, q):
            q.put((str(t.device), t.sum().item(), type(weight).__name__, weight.requires_grad))

        def spawned(rank, t, q):
            q.put(t.sum().item() + rank)

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            x = torch.ones(1000, device="vtpu") * 2
            w = torch.nn.Parameter(torch.ones(3, device="vtpu"))
            p = ctx.Process(target=child, args=(x, w, q))
            p.start()
            print("process:", q.get(timeout=120))
            p.join(60)
            print("exit code:", p.exitcode)
            mp.spawn(spawned, args=(x, q), nprocs=1)
            print("mp.spawn:", q.get(timeout=60))
            data = TensorDataset(torch.arange(8.0, device="vtpu"))
            batches = list(DataLoader(data, batch_size=4, num_workers=1, multiprocessing_context="spawn"))
            print("loader:", [b[0].tolist() for b in batches])
            # the copy a queue's feeder thread makes is vtpu's own read, not the user's
            torch.vtpu.set_sync_debug_mode("error")
            q.put(x)
            back = q.get(timeout=60)
            torch.vtpu.set_sync_debug_mode("default")
            print("queue in error mode:", back.sum().item())
    """, timeout=300, directory=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "process: ('vtpu:0', 2000.0, 'Parameter', True)" in out.stdout, out.stdout + out.stderr
    assert "exit code: 0" in out.stdout
    assert "mp.spawn: 2000.0" in out.stdout
    assert "loader: [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]" in out.stdout
    assert "queue in error mode: 2000.0" in out.stdout


def test_device_tensors_pickle_for_other_processes_as_copies():
    from multiprocessing.reduction import ForkingPickler
    import io
    import pickle

    weight = torch.nn.Parameter(torch.arange(4.0, device="vtpu").reshape(2, 2).t())
    for value in (weight, torch.arange(3, device="vtpu"), torch.ones(2)):
        buffer = io.BytesIO()
        ForkingPickler(buffer).dump(value)
        back = pickle.loads(buffer.getvalue())
        assert type(back) is type(value) and back.device == value.device
        assert back.requires_grad == value.requires_grad
        assert torch.equal(back.detach().cpu(), value.detach().cpu())
    with pytest.raises(RuntimeError, match="Cowardly refusing to serialize non-leaf tensor"):
        ForkingPickler(io.BytesIO()).dump(weight * 2)


def test_an_error_no_synchronisation_raised_is_reported_at_exit():
    out = _run("""
        import torch, torch_vtpu
        x = torch.randn(4, device="vtpu")
        y = x.index_select(0, torch.tensor([100], device="vtpu"))
    """, timeout=60)
    assert "an error of a queued kernel was never raised" in out.stderr
    assert "IndexError: [index_select] index out of range" in out.stderr


def test_memory_stats_have_cudas_names_and_the_oom_message_says_where_the_capacity_comes_from():
    x = torch.ones(1000, device="vtpu")
    stats = torch.vtpu.memory_stats()
    assert stats["allocated_bytes.all.current"] == stats["allocated_bytes"] >= x.nbytes
    assert stats["allocated_bytes.all.peak"] == stats["peak_allocated_bytes"]
    assert "num_ooms" in stats and "reserved_bytes.all.current" in stats
    torch.vtpu.reset_max_memory_allocated()
    assert torch.vtpu.max_memory_allocated() == torch.vtpu.memory_allocated()
    with pytest.raises(torch.OutOfMemoryError, match="VTPU_MEMORY_LIMIT or torch.vtpu.set_memory_limit"):
        torch.empty(10**13, device="vtpu")
    # Past the capacity check, the second message (capacity reached by
    # allocations) names the setting too; it used to name only the variable.
    limit = torch.vtpu.mem_get_info()[1]
    try:
        torch.vtpu.set_memory_limit("1MiB")
        with pytest.raises(torch.vtpu.OutOfMemoryError, match="capacity .*set_memory_limit"):
            [torch.empty(100_000, device="vtpu") for _ in range(8)]
    finally:
        torch.vtpu.set_memory_limit(limit)


def test_a_program_that_never_uses_the_device_leaves_the_cache_alone(tmp_path):
    # Every `import torch` autoloads torch_vtpu; its exit handler ran a tiny vtpu
    # backward in every process, compiling a kernel into VTPU_CACHE_DIR (and warning
    # about an unusable cache in programs that never touched vtpu). Found by a review.
    cache = tmp_path / "cache"
    # As users have it: `import torch` alone loads the backend (the Makefile turns the
    # autoload off for its own processes).
    env = dict(os.environ, VTPU_CACHE_DIR=str(cache), VTPU_AOT_KERNELS="0", VTPU_CACHE_ONLY="1",
               TORCH_DEVICE_BACKEND_AUTOLOAD="1")
    out = subprocess.run([sys.executable, "-c", "import sys, torch\n"
                          "print(torch.ones(2).sum().item(), 'torch_vtpu' in sys.modules)"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "2.0 True" in out.stdout, (out.stdout, out.stderr[-2000:])
    assert not cache.exists(), sorted(p.name for p in cache.iterdir())
    assert "cache-only" not in out.stderr and "Warning" not in out.stderr, out.stderr[-2000:]
    # A program that does use it still exits cleanly after a backward on the device.
    used = subprocess.run([sys.executable, "-c", "import torch, torch_vtpu\n"
                           "x = torch.ones(3, device='vtpu', requires_grad=True)\n"
                           "(x * 2).sum().backward()\n"
                           "print(torch_vtpu._C._device_was_used(), x.grad.sum().item())"],
                          env=dict(os.environ, VTPU_CACHE_DIR=str(tmp_path / "used")), capture_output=True,
                          text=True, timeout=120)
    assert used.returncode == 0 and "True 6.0" in used.stdout, used.stderr[-2000:]


def test_exit_after_autograd_grad_compiles_nothing_and_does_not_abort(tmp_path):
    # The exit handler's drain of autograd's device thread ran `zeros * 1.0` and its
    # backward: two kernels compiled at the exit of every process without the
    # ahead-of-time library (they reached the shared cache after the program's last
    # metrics, which made test_shared_cache flaky in CI). A drain that captures its
    # gradient instead of accumulating it aborted ("terminate called") 2 exits of 5.
    program = ("import sys, torch, torch_vtpu\n"
               "x = torch.randn(64, 33, device='vtpu', requires_grad=True)\n"
               "g, = torch.autograd.grad((x.view(-1) * 2).sum(), x)\n"
               "print(g.sum().item(), file=sys.stderr)\n"
               "print('PROGRAM-DONE', file=sys.stderr, flush=True)\n")
    for run in range(3):
        env = dict(os.environ, VTPU_CACHE_DIR=str(tmp_path / f"cache{run}"), VTPU_AOT_KERNELS="0",
                   VTPU_GENERATED_KERNELS="1", VTPU_LOG_COMPILES="1", VTPU_MODE="strict")
        out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        before, marker, after = out.stderr.partition("PROGRAM-DONE")
        assert marker and "vtpu: compiling" in before, out.stderr[-2000:]
        assert "vtpu: compiling" not in after, after[-2000:]

@pytest.mark.parametrize("limit", ["1e3", "-1", "abc", "1GiBB"])
def test_a_malformed_memory_limit_is_said_and_the_default_used(limit):
    # `import torch` itself failed ("Failed to load the backend extension"), in every
    # PyTorch program on the machine, without naming the variable.
    env = dict(os.environ, VTPU_MEMORY_LIMIT=limit, TORCH_DEVICE_BACKEND_AUTOLOAD="1")  # as users have it
    program = ("import torch\n"
               "print((torch.ones(3, device='vtpu') * 2).sum().item(), torch.vtpu.mem_get_info()[1] > 2**30)")
    out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "6.0 True" in out.stdout
    assert "VTPU_MEMORY_LIMIT" in out.stderr and "default capacity" in out.stderr, out.stderr[-2000:]
    assert "never raised" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr[-2000:]


def test_a_cache_directory_starting_with_a_tilde_is_under_home(tmp_path):
    # Passed unexpanded (a service file, an .env file): the engine made "./~/x".
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, HOME=str(tmp_path), VTPU_CACHE_DIR="~/vtpu-cache", VTPU_AOT_KERNELS="0")
    program = "import torch, torch_vtpu\nprint((torch.ones(5, device='vtpu').exp() * 3).sum().item())"
    out = subprocess.run([sys.executable, "-c", program], env=env, cwd=work, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not (work / "~").exists()
    assert any(p.name.endswith(".entry") for p in (tmp_path / "vtpu-cache").iterdir())


def test_a_bad_advise_target_or_check_flag_is_said_and_debug_mode_still_computes():
    # A bad VTPU_ADVISE_TARGET made every debug-mode op raise "unknown target" from
    # inside the checker; VTPU_DEBUG_NANS=fusd was silently off (found by a review).
    env = dict(os.environ, VTPU_MODE="debug", VTPU_ADVISE_TARGET="bogus", VTPU_DEBUG_NANS="fusd")
    out = subprocess.run([sys.executable, "-c",
                          "import torch, torch_vtpu\nprint((torch.ones(3, device='vtpu') * 2).sum().item())"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "6.0" in out.stdout, out.stderr[-2000:]
    assert "VTPU_ADVISE_TARGET" in out.stderr and "VTPU_DEBUG_NANS" in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("value, generated", [("false", False), ("off", False), ("No", False), ("0", False),
                                              ("true", True), ("1", True), ("bogus", True)])
def test_switches_read_every_spelling_of_on_and_off(value, generated):
    # VTPU_GENERATED_KERNELS=false left generated kernels on (only "0" turned them
    # off) and a typo was silently ignored (found by a review of the environment).
    env = dict(os.environ, VTPU_GENERATED_KERNELS=value)
    program = ("import torch, torch_vtpu\n"
               "torch.ones(3, device='vtpu').exp().cpu()\n"
               "print('generated', torch_vtpu.metrics()['generated_kernels'] > 0)")
    out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"generated {generated}" in out.stdout, (out.stdout, out.stderr[-2000:])
    assert ("is not one of" in out.stderr) == (value == "bogus"), out.stderr[-2000:]


@pytest.mark.parametrize("value, logged", [("1", True), ("true", True), ("ON", True), ("0", False),
                                           ("off", False), ("ture", False)])
def test_compile_logging_reads_every_spelling_of_on_and_off(tmp_path, value, logged):
    # VTPU_LOG_COMPILES (read by the engine, not the bridge) took only "1": `true`
    # was silently off, and a typo said nothing.
    env = dict(os.environ, VTPU_LOG_COMPILES=value, VTPU_AOT_KERNELS="0", VTPU_CACHE_DIR=str(tmp_path / "cache"))
    program = "import torch, torch_vtpu\nx = torch.ones(7, device='vtpu')\nprint(((x.exp() + 1) * x.sin()).sum().item() > 0)"
    out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "True" in out.stdout, out.stderr[-2000:]
    assert ("vtpu: compiling" in out.stderr) == logged, out.stderr[-2000:]
    assert (out.stderr.count("is not one of") == 1) == (value == "ture"), out.stderr[-2000:]


def test_kernel_dumps_into_a_missing_directory_are_said_once(tmp_path):
    env = dict(os.environ, VTPU_DUMP_KERNELS=str(tmp_path / "missing"), VTPU_AOT_KERNELS="0",
               VTPU_CACHE_DIR=str(tmp_path / "cache"))
    program = "import torch, torch_vtpu\nx = torch.ones(7, device='vtpu')\nprint(((x.exp() + 1) * x.sin()).sum().item() > 0)"
    out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "True" in out.stdout, out.stderr[-2000:]
    assert out.stderr.count("VTPU_DUMP_KERNELS") == 1, out.stderr[-2000:]
