"""Several Python threads using the device at once (found by a review probing
threads, 2026-12-05): each test failed without its fix in every run tried."""
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import torch_vtpu


def test_switching_to_debug_mode_does_not_overtake_other_threads_work():
    """Debug mode runs kernels at once on the calling thread. Work other threads
    queued before the switch (or while it happened) still runs on the stream,
    so a debug kernel must wait for it: it may reuse a block that work still
    reads (freed blocks are reused in stream order). Without the wait 46-87 of
    400 results here were wrong, some equal to the other thread's answer."""
    stop = threading.Event()
    bad = []

    def toggle():
        while not stop.is_set():
            torch_vtpu.set_mode("debug")
            stop.wait(0.0005)
            torch_vtpu.set_mode("strict")
            stop.wait(0.0005)

    def work(seed):
        x = torch.randn(1 << 18, generator=torch.Generator().manual_seed(seed))
        expected = ((x + 0.5).sin() * 2).sum()
        device = x.to("vtpu")
        for i in range(150):
            got = ((device + 0.5).sin() * 2).sum().cpu()
            if not torch.allclose(got, expected, rtol=1e-4):
                bad.append((seed, i, got.item(), expected.item()))

    before = torch_vtpu.get_mode()
    toggler = threading.Thread(target=toggle)
    workers = [threading.Thread(target=work, args=(seed,)) for seed in range(2)]
    try:
        toggler.start()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        stop.set()
        toggler.join()
        torch_vtpu.set_mode(before)
    assert not bad, f"{len(bad)} of 300 results wrong: {bad[:3]}"


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_empty_cache_while_other_threads_compute(mode):
    """torch.vtpu.empty_cache() synchronises, then returns cached blocks to the
    host; a block another thread freed in between, whose queued kernel had not
    run, went back too and the kernel wrote into freed heap memory (glibc
    aborts, segfaults: 6 of 6 runs in strict mode). Freed blocks now carry the
    stream's position (or the fused window's) and stay cached until their
    queued users ran. In a subprocess: the failure is a crash."""
    script = textwrap.dedent(f"""
        import threading, torch, torch_vtpu
        torch_vtpu.set_mode("{mode}")
        stop = threading.Event()
        def churn():
            while not stop.is_set():
                torch.vtpu.empty_cache()
        results = []
        def work():
            x = torch.randn(3000, device="vtpu")
            for _ in range(300):
                t = (x * 1.5).sin(); del t
                x = (x + 0.25).tanh() * 2 - x * 0.1
            results.append(x.sum().item())
        c = threading.Thread(target=churn); c.start()
        ws = [threading.Thread(target=work) for _ in range(2)]
        [w.start() for w in ws]; [w.join() for w in ws]
        stop.set(); c.join()
        assert len(results) == 2
        print("reserved after", torch.vtpu.memory_reserved())
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "reserved after" in proc.stdout


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_an_asynchronous_error_also_reaches_the_thread_that_issued_the_op(mode):
    """A queued kernel's error is raised by the first synchronisation, in
    whichever thread makes it. The thread that issued the failing op then read
    its result with no error at all (values the kernel never wrote); on CUDA
    every thread of the context sees the error. Now that thread's next
    synchronisation raises it too."""
    weight = torch.randn(10, 4).to("vtpu")
    index = torch.tensor([1, 2, 50]).to("vtpu")  # 50 is out of range
    issued, raised_elsewhere = threading.Event(), threading.Event()
    seen = {}

    def issuer():
        result = torch.nn.functional.embedding(index, weight)
        issued.set()
        raised_elsewhere.wait(60)
        try:
            seen["issuer"] = result.sum().item()
        except IndexError as error:
            seen["issuer"] = error

    def other():
        issued.wait(60)
        try:
            torch.ones(3, device="vtpu").sum().item()  # synchronises first
            seen["other"] = None
        except IndexError as error:
            seen["other"] = error
        raised_elsewhere.set()

    with torch_vtpu.mode(mode):
        threads = [threading.Thread(target=issuer), threading.Thread(target=other)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert isinstance(seen["other"], IndexError), seen
        assert isinstance(seen["issuer"], IndexError), seen
        assert "index out of range" in str(seen["issuer"])
        # Raised once in each: the device is usable afterwards.
        assert torch.ones(2, device="vtpu").sum().item() == 2.0


def _run_script(script: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=timeout)


def test_host_kernel_path_ops_from_several_threads_do_not_corrupt_the_heap():
    """Asking the dispatcher for an op's CPU kernel handle on every host-path call
    (is it a Python kernel?) registered the handle with the kernel unguarded: four
    threads of cumsum aborted with "double free or corruption" 10 runs of 10 (review).
    In a subprocess: the failure is a crash."""
    proc = _run_script("""
        import threading, torch, torch_vtpu
        x = torch.randn(64, device="vtpu")
        def work():
            for _ in range(3000):
                torch.cumsum(x, 0)
                torch.randn(100, device="vtpu")
            torch.vtpu.synchronize()
        threads = [threading.Thread(target=work) for _ in range(4)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


@pytest.mark.parametrize("other", ["event_record", "stream_query", "scalar_fill", "batch_norm_strict"])
def test_a_window_flush_does_not_deadlock_with_a_thread_holding_the_gil(other):
    """A flush captured each queued kernel's Python call site under the window's lock,
    which may take the GIL; torch's Event.record / Stream.query bindings and a scalar
    fill hold the GIL while they take that lock (flush or record): the two threads
    waited for each other (review: hung every run). Each flush in thread A runs in a
    function not seen before, so capture has to take the GIL."""
    mode = "strict" if other == "batch_norm_strict" else "fused"
    proc = _run_script(f"""
        import threading, types, torch, torch_vtpu
        torch_vtpu.set_mode("{mode}")
        x = torch.randn(64, 64, device="vtpu")
        w = torch.randn(64, 64, device="vtpu")
        bn = torch.nn.BatchNorm1d(64).to("vtpu")
        def body(x, w):
            y = torch.tanh(x * 2 + 1) * x
            if "{other}" == "batch_norm_strict":
                y = bn(y)
            return y @ w
        stop = False
        def issue():
            for k in range(1500):
                f = types.FunctionType(body.__code__.replace(co_name=f"body{{k}}"), globals())
                f(x, w)
            torch.vtpu.synchronize()
        def interfere():
            z = torch.zeros(64, 64, device="vtpu")
            stream = torch.vtpu.current_stream()
            while not stop:
                if "{other}" in ("event_record", "batch_norm_strict"):
                    torch.vtpu.Event().record()
                elif "{other}" == "stream_query":
                    stream.query()
                else:
                    z[:] = 1.5
        a, b = threading.Thread(target=issue), threading.Thread(target=interfere)
        a.start(); b.start(); a.join(); stop = True; b.join()
        print("ok")
    """, timeout=240)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
