"""Fused eager mode: elementwise ops recorded into a window become few kernels,
with results bitwise equal to strict mode.

A pattern seen for the first time runs on strict's single-op kernels while its
fused kernel compiles in the background, so exact kernel counts are asserted on
a second run, after `_wait_for_fusion_compiles()`.
"""
import copy
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import torch_vtpu
from torch_vtpu import _C

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_training_parity as parity  # noqa: E402


@pytest.fixture(autouse=True)
def _fused_then_strict():
    torch_vtpu.set_mode("fused")
    yield
    torch_vtpu.set_mode("strict")


def _steady_metrics(program, *args):
    """Runs `program` to see its patterns, waits for their kernels, then
    returns (result, metrics) of a further run. Two warm-up runs: which
    intermediates share a memory block (part of a pattern) settles once the
    allocator's cache holds the program's blocks."""
    for _ in range(2):
        first = program(*args)  # kept alive: its results are stored, as in the measured run
        torch.vtpu.synchronize()
        _C._wait_for_fusion_compiles()
        del first
    torch_vtpu.reset_metrics()
    result = program(*args)
    torch.vtpu.synchronize()
    return result, torch_vtpu.metrics()


def _in_strict(program, *args):
    with torch_vtpu.mode("strict"):
        out = program(*args)
        torch.vtpu.synchronize()
    return out


def _chain6(x, y):
    return (((x * 2.0 + y).tanh() - 1.0).sigmoid() * y).exp()


def test_chain_of_six_elementwise_ops_is_one_kernel():
    x = torch.randn(300, 70, device="vtpu")
    y = torch.randn(300, 70, device="vtpu")
    out, m = _steady_metrics(_chain6, x, y)
    assert m["kernels_launched"] == 1
    assert m["fused_kernels"] == 1
    assert m["ops_per_fused_kernel"] == {7: 1}  # 6 ops + the scalar add
    # Only the final result is stored: the intermediates died with Python's
    # references (and, dropped one by one, shared memory blocks).
    assert m["dead_stores_skipped"] >= 1
    assert torch.equal(out.cpu(), _in_strict(_chain6, x, y).cpu())


def _scaled_by_own_sum(x):
    s = (x * 2.0).sum(-1, keepdim=True)  # the product dies here; its block is free
    return x * s  # allocated in that block, written in a later kernel (it reads s)


def test_a_dropped_temporary_whose_block_a_later_result_overwrites_is_not_stored():
    """The allocator hands a dropped temporary's block to the next result of
    its size; when that result's kernel writes the block before anything
    reads it, the temporary's value can never be read, so it is not stored."""
    x = torch.randn(64, 512, device="vtpu")
    out, m = _steady_metrics(_scaled_by_own_sum, x)
    assert m["kernels_launched"] == 2, m
    assert m["dead_stores_skipped"] == 1, m
    assert torch.equal(out.cpu(), _in_strict(_scaled_by_own_sum, x).cpu())


def _updated_in_place_after_drop(x):
    t = x * 2.0
    s = t.sum(-1, keepdim=True)
    t.add_(s)  # a later kernel reads the product, then overwrites it in place
    return t.sum(-1)


def test_a_temporary_a_later_kernel_reads_before_overwriting_is_stored():
    """The in-place add reads the product before writing the same memory: the
    product's kernel must store it (strict's bits below need it). The
    in-place result is dropped and no later kernel touches its memory: that
    one store is skipped (an earlier kernel touching the memory, which runs
    before, is no reader of it)."""
    x = torch.randn(64, 512, device="vtpu")
    out, m = _steady_metrics(_updated_in_place_after_drop, x)
    assert m["kernels_launched"] == 2 and m["dead_stores_skipped"] == 1, m
    assert torch.equal(out.cpu(), _in_strict(_updated_in_place_after_drop, x).cpu())


def test_channels_last_chain_runs_the_flat_kernel_of_the_contiguous_one():
    """Tensors all dense in the same order of dims (channels-last) are one
    flat block to the fused kernel, as contiguous ones are: the pattern is the
    same, so the contiguous chain's kernel serves it with nothing compiled."""
    x = torch.randn(4, 8, 6, 5, device="vtpu")
    y = torch.randn(4, 8, 6, 5, device="vtpu")
    _steady_metrics(_chain6, x, y)
    xl, yl = (t.contiguous(memory_format=torch.channels_last) for t in (x, y))
    torch.vtpu.synchronize()
    torch_vtpu.reset_metrics()
    out = _chain6(xl, yl)  # the first sighting of the channels-last chain
    torch.vtpu.synchronize()
    _C._wait_for_fusion_compiles()
    m = torch_vtpu.metrics()
    assert m["fusion_compiles"] == 0 and m["pattern_cache_hits"] == 1, m
    assert m["fused_kernels"] == 1 and m["kernels_launched"] == 1, m
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out.cpu(), _in_strict(_chain6, xl, yl).cpu())
    assert torch.equal(out.cpu(), _chain6(x, y).cpu())


def test_small_ops_start_no_window_by_default():
    """By default (fused_min_elements 4096) an op over fewer elements that would start a
    window launches as in strict mode; one over more starts a window, and a small op
    joins a window that already holds work. Same bits either way."""
    torch_vtpu.set_fused_min_elements(4096)
    small = [torch.randn(16, 64, device="vtpu") for _ in range(2)]  # 1024 elements
    big = [torch.randn(64, 64, device="vtpu") for _ in range(2)]  # 4096 elements
    out, m = _steady_metrics(_chain6, *small)
    assert m["fused_kernels"] == 0 and m["kernels_launched"] == 7, m  # strict's launches
    assert "unfused_op" not in m["syncs"]  # no window was started, none flushed
    assert torch.equal(out.cpu(), _in_strict(_chain6, *small).cpu())
    out, m = _steady_metrics(_chain6, *big)
    assert m["fused_kernels"] == 1 and m["kernels_launched"] == 1, m

    def big_then_small(a, b, c, d):
        return (a * 2.0).exp() + b, (c * 3.0).sigmoid() * d  # the small chain joins the pending window

    (p, q), m = _steady_metrics(big_then_small, big[0], big[1], small[0], small[1])
    assert m["fused_kernels"] == 2 and m["kernels_launched"] == 2, m
    p_strict, q_strict = _in_strict(big_then_small, big[0], big[1], small[0], small[1])
    assert torch.equal(p.cpu(), p_strict.cpu()) and torch.equal(q.cpu(), q_strict.cpu())
    torch_vtpu.set_fused_min_elements(0)  # every op recorded: the small chain fuses
    out, m = _steady_metrics(_chain6, *small)
    assert m["fused_kernels"] == 1, m
    with pytest.raises(ValueError):
        torch_vtpu.set_fused_min_elements(-1)
    with pytest.raises(TypeError):
        torch_vtpu.set_fused_min_elements(2.5)
    assert torch_vtpu.fused_min_elements() == 0


def test_first_sighting_runs_unfused_then_the_fused_kernel_takes_over():
    x = torch.randn(64, device="vtpu")

    def program(t):
        return (t * 3.0 - 0.5).abs().sqrt() + t

    torch_vtpu.reset_metrics()
    first = program(x).cpu()
    m = torch_vtpu.metrics()
    assert m["pattern_cache_misses"] + m["pattern_cache_hits"] == 1
    _C._wait_for_fusion_compiles()
    torch_vtpu.reset_metrics()
    second = program(x).cpu()
    m = torch_vtpu.metrics()
    assert m["pattern_cache_hits"] == 1 and m["fused_kernels"] == 1
    assert torch.equal(first, second)


def test_broadcasting_chain_fuses_and_matches_strict():
    x = torch.randn(32, 48, device="vtpu")
    bias = torch.randn(48, device="vtpu")
    scale = torch.randn(32, 1, device="vtpu")

    def program(a, b, s):
        return F.gelu((a + b) * s) - a

    out, m = _steady_metrics(program, x, bias, scale)
    assert m["fused_kernels"] == 1 and m["kernels_launched"] == 1
    assert torch.equal(out.cpu(), _in_strict(program, x, bias, scale).cpu())


def test_softmax_is_one_kernel():
    x = torch.randn(16, 100, device="vtpu")
    out, m = _steady_metrics(lambda t: torch.softmax(t, dim=-1), x)
    assert m["kernels_launched"] == 1
    assert torch.equal(out.cpu(), _in_strict(lambda t: torch.softmax(t, dim=-1), x).cpu())


def _normalised(x, w, b):
    mean = x.sum(-1, keepdim=True) / x.shape[-1]
    centred = x - mean
    rstd = torch.rsqrt((centred * centred).sum(-1, keepdim=True) / x.shape[-1] + 1e-5)
    return (x * rstd - rstd * mean) * w + b


def test_an_input_read_by_every_cluster_of_a_full_window_fuses_each_use_alike():
    """One input normalised 60 times before a flush: each op of the window
    relates to every earlier cluster through that input (the window only
    examines the latest few clusters for merging, so recording stays cheap:
    benchmarks/window_bookkeeping.py). Every repetition still becomes the
    kernels a single one does, with strict's bits."""
    x = torch.randn(64, 256, device="vtpu")
    w = torch.randn(256, device="vtpu")
    b = torch.randn(256, device="vtpu")
    _, one = _steady_metrics(_normalised, x, w, b)
    repeats = 60
    outs, many = _steady_metrics(lambda *a: [_normalised(*a) for _ in range(repeats)], x, w, b)
    assert many["syncs"] == {"synchronize": 1}, many["syncs"]  # one window: no size-limit flush
    assert many["kernels_launched"] == repeats * one["kernels_launched"], (one, many)
    assert many["fused_kernels"] == repeats * one["fused_kernels"], (one, many)
    # Each repetition's temporaries reuse the blocks the previous one dropped;
    # their stores are skipped all the same.
    assert many["dead_stores_skipped"] == repeats * one["dead_stores_skipped"] > 0, (one, many)
    expected = _in_strict(_normalised, x, w, b).cpu()
    for out in outs:
        assert torch.equal(out.cpu(), expected)


def _adamw_setup(n, device="vtpu"):
    torch.manual_seed(0)
    params = [torch.randn(16, 8 if i % 2 else 24, device=device, requires_grad=True) for i in range(n)]
    for p in params:
        p.grad = torch.randn_like(p)
    return params, torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)


def test_adamw_step_over_50_parameters_is_one_kernel_per_parameter():
    params, opt = _adamw_setup(50)
    _, m = _steady_metrics(opt.step)
    # foreach AdamW issues 8 elementwise ops per parameter (weight decay, two
    # moment updates, sqrt, bias correction, eps, the update): each parameter's
    # ops become one kernel whose temporaries are never stored.
    assert m["kernels_launched"] == 50
    assert m["fused_kernels"] == 50
    assert m["ops_per_fused_kernel"] == {8: 50}
    assert m["dead_stores_skipped"] == 50


def test_adamw_fused_matches_strict_bitwise():
    fused_params, fused_opt = _adamw_setup(10)
    with torch_vtpu.mode("strict"):
        strict_params, strict_opt = _adamw_setup(10)
        for _ in range(5):
            strict_opt.step()
    for _ in range(5):
        fused_opt.step()
    for a, b in zip(fused_params, strict_params):
        assert torch.equal(a.detach().cpu(), b.detach().cpu())


@pytest.mark.parametrize("name", list(parity.CASES))
def test_training_parity_models_fused_equal_strict_bitwise(name):
    fused_losses, fused_model = parity._train(name, "vtpu")
    with torch_vtpu.mode("strict"):
        strict_losses, strict_model = parity._train(name, "vtpu")
    assert torch.equal(fused_losses, strict_losses)
    for a, b in zip(fused_model.parameters(), strict_model.parameters()):
        assert torch.equal(a.detach().cpu(), b.detach().cpu())


def test_bfloat16_chain_rounds_like_strict():
    x = torch.randn(1000, device="vtpu").to(torch.bfloat16)
    y = torch.randn(1000, device="vtpu").to(torch.bfloat16)

    def program(a, b):
        return ((a * b + 1.0).exp() / (b - 3.0)).tanh()

    out, m = _steady_metrics(program, x, y)
    assert m["fused_kernels"] == 1
    assert torch.equal(out.cpu(), _in_strict(program, x, y).cpu())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float64])
def test_16_bit_tensor_times_a_0_dim_device_tensor_fuses(dtype, scale_dtype):
    # A 0-dim tensor does not promote a dimensioned one: the chain stays in
    # the 16-bit dtype and is one kernel (it ran unfused: the window declared
    # the 0-dim operand at the chain's rank, which promotes to its dtype).
    x = torch.randn(64, 48, device="vtpu").to(dtype)
    s = torch.tensor(0.37, device="vtpu", dtype=scale_dtype)

    def program(a, b):
        return ((a * b + 1.0).relu() * 2.0 - b) / b

    out, m = _steady_metrics(program, x, s)
    assert out.dtype == dtype
    assert m["fused_kernels"] == 1 and m["ops_per_fused_kernel"] == {6: 1}
    assert torch.equal(out.cpu(), _in_strict(program, x, s).cpu())
    assert torch.equal(out.cpu(), program(x.cpu(), s.cpu()))


def test_0_dim_tensor_and_its_1x1_view_promote_apart_in_one_window():
    # The same element read as a 0-dim tensor (no promotion) and as a 1x1
    # tensor (promotes the bfloat16 operand to float32) in one kernel.
    x = torch.randn(32, 16, device="vtpu").to(torch.bfloat16)
    s = torch.tensor(1.5, device="vtpu")

    def program(a, b):
        kept = (a * b + 1.0).sigmoid()  # bfloat16
        return kept, (kept + b.view(1, 1)) * 3.0  # float32

    (kept, promoted), m = _steady_metrics(program, x, s)
    assert kept.dtype == torch.bfloat16 and promoted.dtype == torch.float32
    assert m["fused_kernels"] == 1 and m["ops_per_fused_kernel"] == {5: 1}
    strict_kept, strict_promoted = _in_strict(program, x, s)
    assert torch.equal(kept.cpu(), strict_kept.cpu())
    assert torch.equal(promoted.cpu(), strict_promoted.cpu())
    cpu_kept, cpu_promoted = program(x.cpu(), s.cpu())
    assert torch.equal(kept.cpu(), cpu_kept) and torch.equal(promoted.cpu(), cpu_promoted)


def test_in_place_ops_and_aliases():
    def program(a, b):
        a = a.clone()
        a.mul_(2.0)
        a.add_(b)
        view = a.view(-1)  # a view of a pending result
        view.sub_(1.0)
        c = a * a
        a.div_(3.0)  # written after c read it
        return a, c

    x = torch.randn(40, 30, device="vtpu")
    y = torch.randn(40, 30, device="vtpu")
    (a, c), _ = _steady_metrics(program, x, y)
    sa, sc = _in_strict(program, x, y)
    assert torch.equal(a.cpu(), sa.cpu()) and torch.equal(c.cpu(), sc.cpu())


def test_transposed_read_of_a_pending_result_is_not_forwarded():
    def program(a):
        b = a * 2.0
        return b.t() + b  # b read in another geometry: the window must cut

    x = torch.randn(33, 33, device="vtpu")
    out, _ = _steady_metrics(program, x)
    assert torch.equal(out.cpu(), _in_strict(program, x).cpu())
    assert torch.equal(out.cpu(), (x.cpu() * 2.0).t() + x.cpu() * 2.0)


def test_overlapping_slices_written_in_one_window():
    def program(a):
        a = a.clone()
        b = a[:-1] * 2.0  # reads a shifted by one element against the write below
        a[1:].mul_(3.0)
        c = a[:-1] + b  # must see the write
        return a, c

    x = torch.randn(50, device="vtpu")
    (a, c), _ = _steady_metrics(program, x)
    sa, sc = _in_strict(program, x)
    assert torch.equal(a.cpu(), sa.cpu()) and torch.equal(c.cpu(), sc.cpu())


def test_memory_dropped_mid_window_is_reused_safely():
    def program(a):
        outs = []
        for i in range(20):
            t = a * float(i)  # dropped at once: its block is reused by the next t
            u = t.t() + 1.0  # another geometry: t must really be stored before reuse
            outs.append(u)
        return outs

    x = torch.randn(64, 64, device="vtpu")
    got, _ = _steady_metrics(program, x)
    want = _in_strict(program, x)
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w.cpu())


def test_host_read_mid_window_flushes_and_sees_the_values():
    x = torch.randn(100, device="vtpu")
    torch_vtpu.reset_metrics()
    y = x * 2.0 + 1.0
    value = y[3].item()
    assert value == (x.cpu()[3] * 2.0 + 1.0).item()
    assert torch_vtpu.metrics()["syncs"].get("item", 0) == 1
    z = y - 1.0
    assert torch.equal(z.cpu(), x.cpu() * 2.0 + 1.0 - 1.0)


def test_random_op_inside_a_window_gives_strict_values():
    def program(a):
        torch.vtpu.manual_seed(7)
        b = a * 2.0
        noise = torch.rand_like(a)  # not fusible: flushes the window, same stream order
        return (b + noise).relu()

    x = torch.randn(500, device="vtpu")
    out = program(x).cpu()
    assert torch.equal(out, _in_strict(program, x).cpu())


def test_flush_reasons_are_counted():
    x = torch.randn(64, 64, device="vtpu")
    torch_vtpu.reset_metrics()
    y = x + 1.0
    z = y @ y  # matrix work is outside the window: it flushes it first
    torch.vtpu.synchronize()
    syncs = torch_vtpu.metrics()["syncs"]
    assert syncs.get("unfused_op", 0) >= 1
    assert syncs.get("synchronize", 0) == 1
    assert torch.allclose(z.cpu(), (x.cpu() + 1.0) @ (x.cpu() + 1.0), rtol=1e-4, atol=1e-4)


def test_window_limit_is_a_deterministic_flush_point():
    x = torch.randn(8, device="vtpu")
    torch_vtpu.reset_metrics()
    for _ in range(2100):
        x = x * 1.0001
    out = x.cpu()
    assert torch_vtpu.metrics()["syncs"].get("window_limit", 0) == 2
    with torch_vtpu.mode("strict"):
        y = torch.randn(8, device="vtpu")
    del y


def test_error_inside_a_window_is_raised_at_the_flush_and_the_process_stays_usable():
    x = torch.randn(10, device="vtpu")
    y = x * 2.0
    bad = torch.tensor([0, 99], device="vtpu")
    with pytest.raises(IndexError, match="index out of range"):
        torch.index_select(y, 0, bad).cpu()
    z = (x + 1.0).cpu()
    assert torch.equal(z, x.cpu() + 1.0)


def test_backward_on_autograd_thread_matches_strict():
    torch.manual_seed(0)
    w = torch.randn(20, 20)
    x = torch.randn(8, 20)

    def run():
        wd = w.to("vtpu").requires_grad_()
        out = torch.tanh(x.to("vtpu") @ wd).sigmoid() * 3.0 - 1.0
        out.pow(2).mean().backward()
        return wd.grad.cpu()

    fused = run()
    with torch_vtpu.mode("strict"):
        strict = run()
    assert torch.equal(fused, strict)


def _device_seconds():
    return sum(torch_vtpu.metrics()["device_time_s"].values())


def test_an_event_marks_the_pending_window_work():
    """start/end events around fused work time that work: recording an event
    flushes the window first (the marker went in ahead of unflushed work, so
    the end event completed before the work had run)."""
    torch_vtpu.set_mode("fused")
    x = torch.randn(256, 256).to("vtpu")
    torch.vtpu.synchronize()
    before = _device_seconds()
    start, end = torch.Event(device="vtpu", enable_timing=True), torch.Event(device="vtpu", enable_timing=True)
    start.record()
    y = (x * 2 + 1).sin()  # pending in the window
    end.record()
    end.synchronize()
    assert _device_seconds() > before  # the work ran before the end marker completed
    assert start.elapsed_time(end) > 0
    torch.testing.assert_close(y.cpu(), (x.cpu() * 2 + 1).sin())


def test_polling_the_stream_finishes_pending_window_work():
    torch_vtpu.set_mode("fused")
    x = torch.randn(256, 256).to("vtpu")
    torch.vtpu.synchronize()
    before = _device_seconds()
    y = x * 3 - 1  # pending in the window
    stream = torch.vtpu.current_stream()
    deadline = time.monotonic() + 30
    while not stream.query():
        assert time.monotonic() < deadline, "stream.query() never became True"
        time.sleep(0.001)
    # query() was True only once the pending work had run.
    assert _device_seconds() > before
    assert torch.equal(y.cpu(), x.cpu() * 3 - 1)


def test_mode_change_flushes_the_window():
    x = torch.randn(16, device="vtpu")
    y = x * 5.0
    torch_vtpu.set_mode("strict")
    assert torch.equal(y.cpu(), x.cpu() * 5.0)


def test_fused_peak_memory_not_above_strict():
    def program(a):
        for _ in range(10):
            a = (a * 1.5 + 0.5).tanh()
        return a

    x = torch.randn(1 << 16, device="vtpu")
    peaks = {}
    for mode in ("strict", "fused"):
        with torch_vtpu.mode(mode):
            program(x)
            torch.vtpu.synchronize()
            _C._wait_for_fusion_compiles()
            torch.vtpu.reset_peak_memory_stats()
            base = torch.vtpu.memory_allocated()
            program(x)
            torch.vtpu.synchronize()
            peaks[mode] = torch.vtpu.max_memory_allocated() - base
    assert peaks["fused"] <= peaks["strict"]


def test_decoding_compiles_nothing_after_the_fourth_token():
    from torch_vtpu.models import Qwen3Mini, Qwen3MiniConfig

    config = Qwen3MiniConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                             max_position_embeddings=128, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen3Mini(config).to("vtpu").eval()
    ids = torch.randint(0, 96, (1, 5)).to("vtpu")
    tokens = []
    with torch.no_grad():
        logits, cache = model(ids, use_cache=True)
        for step in range(24):
            next_id = logits[:, -1, :].argmax(dim=-1, keepdim=True)
            tokens.append(next_id.item())
            if step == 3:
                _C._wait_for_fusion_compiles()
                torch_vtpu.reset_metrics()
            logits, cache = model(next_id, past_key_values=cache, use_cache=True)
    _C._wait_for_fusion_compiles()
    m = torch_vtpu.metrics()
    assert m["compiles"] == 0
    assert m["fusion_compiles"] == 0
    assert m["pattern_cache_misses"] == 0
    # Same tokens as strict mode.
    with torch_vtpu.mode("strict"), torch.no_grad():
        logits, cache = model(ids, use_cache=True)
        strict_tokens = []
        for _ in range(24):
            next_id = logits[:, -1, :].argmax(dim=-1, keepdim=True)
            strict_tokens.append(next_id.item())
            logits, cache = model(next_id, past_key_values=cache, use_cache=True)
    assert tokens == strict_tokens


# OpInfo samples of elementwise ops in the compiled set, each chained with
# two more elementwise ops so that fusion happens: fused (after the pattern's
# kernel is built) must give strict's bits.
_FUSED_OPINFO_NAMES = {
    "exp", "log", "neg", "abs", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "sigmoid", "erf",
    "floor", "ceil", "trunc", "exp2", "log2", "log1p", "expm1", "sign", "nn.functional.relu",
    "nn.functional.gelu", "nn.functional.silu", "add", "sub", "mul", "div", "true_divide", "maximum",
    "minimum", "pow", "atan2", "eq", "ne", "lt", "le", "gt", "ge", "where", "clamp", "lerp", "addcmul",
    "addcdiv", "masked_fill", "square", "logical_not", "logical_and", "logical_or",
}


def _fused_opinfo_cases():
    from torch.testing._internal.common_methods_invocations import op_db

    return [op for op in op_db if op.name in _FUSED_OPINFO_NAMES and op.variant_test_name == ""
            and torch.float32 in op.supported_dtypes("cpu")]


def _to_vtpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().to("vtpu")
    if isinstance(value, (list, tuple)):
        return type(value)(_to_vtpu(v) for v in value)
    return value


@pytest.mark.parametrize("op", _fused_opinfo_cases(), ids=lambda op: op.name)
def test_opinfo_samples_fused_equal_strict_bitwise(op):
    samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))[:4]
    checked = 0
    for sample in samples:
        args = _to_vtpu([sample.input, *sample.args])
        kwargs = {k: _to_vtpu(v) for k, v in sample.kwargs.items()}

        def program():
            out = op(*args, **kwargs)
            if not isinstance(out, torch.Tensor):
                return out
            return out * 1.5 + 0.25 if out.is_floating_point() else out.logical_not()

        try:
            strict = _in_strict(program)
        except Exception:
            continue  # a sample ATen refuses (same in both modes): nothing to compare
        if not isinstance(strict, torch.Tensor):
            continue
        fused, _ = _steady_metrics(program)
        torch.testing.assert_close(fused.cpu(), strict.cpu(), rtol=0, atol=0, equal_nan=True)
        checked += 1
    assert checked > 0, f"{op.name}: no sample could be compared"


def _two_chains(x, w):
    t = (x * 2).exp()
    a = t + 1
    del t
    _C._end_fused_chain()  # a compiled program's chain boundary
    u = (a * 3).sin()  # its temporaries may reuse t's block
    b = u - 1
    del u
    _C._end_fused_chain()
    return a, b, b @ w  # the matmul flushes: the held kernels run first


def test_chain_ends_keep_kernels_until_the_next_flush_and_drop_dead_temporaries():
    x = torch.randn(32, 32).to("vtpu")
    w = torch.randn(32, 8).to("vtpu")
    (a, b, c), m = _steady_metrics(_two_chains, x, w)
    expected = _in_strict(_two_chains, x, w)
    for got, want in zip((a, b, c), expected):
        assert torch.equal(got.cpu(), want.cpu())
    # Two closed chains, one kernel each, and neither temporary stored: the
    # second chain's reuse of t's block does not make t's store live.
    assert m["syncs"].get("graph_chain") == 2, m
    assert m["fused_kernels"] == 2 and m["ops_per_fused_kernel"] == {3: 2}, m
    assert m["dead_stores_skipped"] == 2, m


def test_chain_end_outside_fused_mode_does_nothing():
    x = torch.randn(16).to("vtpu")
    with torch_vtpu.mode("strict"):
        torch_vtpu.reset_metrics()
        y = x + 1
        _C._end_fused_chain()
        torch.vtpu.synchronize()
    assert torch.equal(y.cpu(), x.cpu() + 1)
    assert "graph_chain" not in torch_vtpu.metrics()["syncs"]


@pytest.mark.parametrize("flush_by", ["host_read", "mode_change", "empty_cache"])
def test_held_chain_kernels_run_before_any_flush_point(flush_by):
    x = torch.randn(64, 64)
    d = x.to("vtpu")
    torch.vtpu.synchronize()
    y = (d * 2).exp() + 1
    _C._end_fused_chain()  # y's kernel is built and held, not queued
    if flush_by == "host_read":
        got = y.cpu()
    elif flush_by == "mode_change":
        torch_vtpu.set_mode("strict")
        got = (y * 1).cpu()
    else:
        torch.vtpu.empty_cache()
        got = y.cpu()
    assert torch.equal(got, _in_strict(lambda t: ((t * 2).exp() + 1).cpu(), d))


def _library_call_chain(x, y):
    # Two or more C-library calls per element (every float64 transcendental),
    # or float sin/cos (vectorised in lane groups, with the library for
    # arguments beyond 2^24): the kernel computes 16 neighbouring elements
    # side by side (`element_lanes`), so one element's chain of calls
    # overlaps the next element's.
    a = torch.sin(x * 1.0001 + 0.5)
    b = torch.cos(a - y)
    return torch.atan2(b, a + 1.5).sin() * y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_chain_of_library_calls_fuses_with_stricts_bits(dtype):
    # 4099 elements: whole groups of 16 lanes and a remainder in each chunk.
    x = torch.randn(4099, dtype=dtype, device="vtpu")
    y = torch.randn(4099, dtype=dtype, device="vtpu")
    program = _library_call_chain if dtype == torch.float32 else (
        lambda a, b: torch.tanh(torch.exp(a * 0.5) - b).sigmoid() * torch.log1p(b.abs()))
    result, metrics = _steady_metrics(program, x, y)
    assert metrics["fused_kernels"] == 1 and metrics["kernels_launched"] == 1, metrics
    expected = _in_strict(program, x, y)
    assert torch.equal(result.cpu(), expected.cpu())


def test_the_lane_kernel_is_generated_only_for_two_library_calls(tmp_path):
    # The dumped source of a fresh compile shows which loop a kernel runs.
    code = (
        "import torch, torch_vtpu\n"
        "torch_vtpu.set_mode('fused')\n"
        "x, y = (torch.randn(5000, device='vtpu', dtype=torch.float64) for _ in range(2))\n"
        "z = torch.randn(5000, device='vtpu')\n"
        "for _ in range(2):\n"
        "    one = torch.exp(x * 2.0 + 1.0)\n"
        "    one.cpu()\n"
        "    two = torch.tanh(torch.exp(y * 3.0) * 0.25)\n"
        "    two.cpu()\n"
        "    three = torch.sin(z * 2.0 + 1.0)\n"
        "    torch.vtpu.synchronize()\n"
        "    torch_vtpu._C._wait_for_fusion_compiles()\n")
    env = {**__import__("os").environ, "VTPU_CACHE_DIR": str(tmp_path / "cache"),
           "VTPU_DUMP_KERNELS": str(tmp_path / "dump"), "VTPU_AOT_KERNELS": "0"}
    import subprocess
    (tmp_path / "dump").mkdir()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=600)
    # Each kernel's own code follows the pasted math helpers.
    sources = [p.read_text().split("namespace ns_", 1)[-1] for p in (tmp_path / "dump").glob("*.cpp")]
    with_lanes = [s for s in sources if "element_lanes(c, begin)" in s]
    calls = [s for s in with_lanes if "vtpu_tanh(" in s]
    assert len(calls) == 1 and "vtpu_exp(" in calls[0]
    single_call = [s for s in sources if "vtpu_exp(" in s and "vtpu_tanh(" not in s]
    assert single_call and all("element_lanes" not in s for s in single_call), \
        "a kernel with one library call keeps the element loop"
    # Float sin's vectorised path needs lanes (a group beyond 2^24 takes the
    # library): the single-op sin and the fused mul, add, sin both have them.
    trig = [s for s in sources if "vtpu_sin" in s]
    assert len(trig) == 2 and all(s in with_lanes and "vtpu_trig_needs_library(" in s and "vtpu_sin_reduced(" in s
                                  for s in trig)


@pytest.mark.parametrize("dead_first", [False, True], ids=["live_first", "dead_first"])
def test_windows_differing_in_a_dead_op_get_their_own_kernels(dead_first, tmp_path, monkeypatch):
    # A dropped temporary leaves a dead op in the window's graph; the kernel
    # numbers its launch scalars over every op. Keyed without dead code, the
    # kernel of `x + 3.0` alone served `x * 2.0 (dropped); x + 3.0` (it read
    # 2.0 as its constant: x + 6.0), or the other way round (past the end of
    # the scalars: inf). Found by a review of cache keys. A fresh cache and a
    # fresh process: the kernels' order of first compile is the point.
    script = tmp_path / "dead.py"
    script.write_text(
        "import torch, torch_vtpu\n"
        "torch_vtpu.set_mode('fused')\n"
        "x = torch.linspace(-2, 2, 4096).to('vtpu')\n"
        f"order = {[True, False] if dead_first else [False, True]}\n"
        "for dead in order * 2:\n"
        "    if dead:\n"
        "        x * 2.0\n"
        "    y = x + 3.0\n"
        "    z = y * 4.0\n"
        "    torch_vtpu.flush(); torch_vtpu._C._wait_for_fusion_compiles()\n"
        "    assert torch.equal(z.cpu(), (x.cpu() + 3.0) * 4.0), (dead, z.cpu()[:3])\n"
        "print('ok')\n")
    import subprocess
    env = dict(__import__("os").environ, VTPU_CACHE_DIR=str(tmp_path / "cache"), VTPU_AOT_KERNELS="0")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


NEGATED_FMA_PROGRAMS = {
    "add": lambda a, b: -(a + b),
    "add_alpha": lambda a, b: -torch.add(a, b, alpha=3.0),
    "sub": lambda a, b: -(a - b),
    "addcmul": lambda a, b: -torch.addcmul(a, b, b, value=2.0),
    "lerp": lambda a, b: -torch.lerp(a, b, 0.25),
    "neg_then_mul": lambda a, b: -(a + b) * 2.0,
}


@pytest.mark.parametrize("program", sorted(NEGATED_FMA_PROGRAMS))
def test_a_negated_fused_multiply_add_keeps_the_sign_of_zero(program):
    # Found by a fused-mode fuzzer: add is an fma, and GCC folded -(fma(a, b, c))
    # into -(a*b) - c, +0 where strict mode's neg of (-0 + +0) gives -0.
    fn = NEGATED_FMA_PROGRAMS[program]
    zeros = torch.tensor([-0.0, 0.0, -0.0, 0.0, 1.5, -2.0, float("nan"), -float("inf")])
    a = zeros.repeat(1024)
    b = zeros.roll(1).repeat(1024) * (0.0 if program in ("addcmul",) else 1.0)
    if program == "lerp":
        b = -a  # lerp(a, -a, w) = a + w * (-a - a): a zero for a zero a
    expected = fn(a, b)
    with torch_vtpu.mode("strict"):
        strict = fn(a.to("vtpu"), b.to("vtpu")).cpu()
    with torch_vtpu.mode("fused"):
        for _ in range(2):  # the first windows run unfused while their kernel compiles
            fused = fn(a.to("vtpu"), b.to("vtpu")).cpu()
            _C._wait_for_fusion_compiles()
    for actual in (strict, fused):
        assert torch.equal(actual.isnan(), expected.isnan())
        assert torch.equal(torch.signbit(actual), torch.signbit(expected)), program
        assert torch.equal(actual.nan_to_num(), expected.nan_to_num())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_reduction_reading_across_rows_stays_out_of_fused_kernels(dtype):
    # A reduction whose cluster would read a tensor across rows (unit stride
    # along a kept dim, not along the reduced one: x.t()) stays a kernel of
    # its own, as in strict mode, whose reduction kernel blocks such reads;
    # fused, (x.t() * 2).sum(-1) of 2048x2048 floats took 8x strict's time.
    # Reductions over rows in memory order still fuse.
    x = torch.randn(300, 257, dtype=dtype, device="vtpu")
    y = torch.randn(300, dtype=dtype, device="vtpu")
    across = {
        "prologue": lambda x, y: (x.t() * 2.0).sum(-1),
        "operand_of_the_prologue": lambda x, y: (y + x.t()).mean(-1),
        "joining_later": lambda x, y: ((x.t() - 1.0).amax(-1), x.t() * 3.0),
    }
    for name, program in across.items():
        result, metrics = _steady_metrics(program, x, y)
        assert metrics["fused_kernels"] == 0, (name, metrics)
        expected = _in_strict(program, x, y)
        for got, want in zip(result if isinstance(result, tuple) else (result,),
                             expected if isinstance(expected, tuple) else (expected,)):
            assert torch.equal(got.cpu(), want.cpu()), name
    result, metrics = _steady_metrics(lambda x, y: (x * 2.0).sum(-1), x, y)
    assert metrics["fused_kernels"] == 1, metrics
    # Column reductions read the same memory the same way, and the fused
    # kernels walk them in column blocks: they still fuse.
    result, metrics = _steady_metrics(lambda x, y: (x * 2.0).sum(0), x, y)
    assert metrics["fused_kernels"] == 1, metrics
    assert torch.equal(result.cpu(), _in_strict(lambda x, y: (x * 2.0).sum(0), x, y).cpu())
