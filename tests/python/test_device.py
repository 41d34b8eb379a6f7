"""The device itself: names, the torch.vtpu module, tensor/module/storage methods."""
import copy
import io
import warnings

import pytest
import torch

import torch_vtpu


def test_device_names():
    assert torch.device("vtpu").type == "vtpu"
    assert torch.device("vtpu:0").index == 0
    x = torch.ones(2, device="vtpu:0")
    assert x.is_vtpu and x.device == torch.device("vtpu:0")
    assert not torch.ones(2).is_vtpu


def test_device_module_contract():
    v = torch.vtpu
    assert v.is_available() and v.device_count() == 1 and v.current_device() == 0
    v.set_device(0)
    v.set_device("vtpu:0")
    with pytest.raises(RuntimeError, match="invalid device index 3"):
        v.set_device(3)
    assert v.is_bf16_supported()
    assert torch.bfloat16 in v.get_amp_supported_dtype()
    assert v._is_in_bad_fork() is False
    free, total = v.mem_get_info()
    assert 0 <= free <= total and total > 0


def test_stream_and_event_classes_check_their_device_as_cuda():
    # torch.vtpu.Stream was torch.Stream, which gave a CPU stream for
    # device="cpu", and torch.vtpu.Event accepted vtpu:1 (found by review).
    with pytest.raises(ValueError, match="expected a vtpu device, got cpu"):
        torch.vtpu.Stream(device="cpu")
    with pytest.raises(ValueError, match="vtpu stream"):
        torch.vtpu.Stream(stream_id=0, device_index=0, device_type=0)  # a CPU stream's triple
    with pytest.raises(ValueError, match="expected a vtpu device, got cpu"):
        torch.vtpu.Event("cpu")
    with pytest.raises(RuntimeError, match="invalid device index 1"):
        torch.vtpu.Event("vtpu:1")
    s = torch.vtpu.Stream(priority=-1)
    assert isinstance(s, torch.Stream) and s.device == torch.device("vtpu:0")
    assert s == torch.vtpu.current_stream() == torch.accelerator.current_stream()
    rebuilt = torch.vtpu.Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)
    assert rebuilt == s and isinstance(rebuilt, torch.vtpu.Stream)
    start, end = torch.vtpu.Event(enable_timing=True), torch.vtpu.Event("vtpu:0", enable_timing=True)
    assert isinstance(start, torch.vtpu.Event) and not isinstance(torch.Event("cpu"), torch.vtpu.Event)
    start.record(s)
    y = torch.ones(256, 256, device="vtpu") @ torch.ones(256, 256, device="vtpu")
    end.record(s)
    end.synchronize()
    assert start.elapsed_time(end) >= 0 and y[0, 0].item() == 256


def test_device_module_is_named_as_torch_knows_it():
    # transformers reads the device type from the device module's name
    # (continuous batching's accelerator checks); it was torch_vtpu._device.
    import sys
    assert torch.get_device_module("vtpu").__name__ == "torch.vtpu"
    assert sys.modules["torch.vtpu"] is torch.vtpu
    from transformers.generation.continuous_batching.utils import create_device_stream, get_available_accelerator_module
    assert get_available_accelerator_module() is torch.vtpu
    assert create_device_stream(torch.device("vtpu")) == torch.vtpu.current_stream()


def test_invalid_device_index_raises():
    with pytest.raises(RuntimeError, match="vtpu:1"):
        torch.ones(2, device="vtpu:1")
    # Every way of naming a missing device raises RuntimeError, as CUDA's
    # "invalid device ordinal" does (some raised ValueError; found by review).
    for name_it in (lambda: torch.vtpu.set_device(1), lambda: torch.accelerator.set_device_index(1),
                    lambda: torch.vtpu.device(1).__enter__(), lambda: torch.ones(1).to("vtpu:1"),
                    lambda: torch.accelerator.memory_allocated(1), lambda: torch.accelerator.current_stream(1),
                    lambda: torch.vtpu.Stream(device=1), lambda: torch.vtpu.get_device_name(1)):
        with pytest.raises(RuntimeError, match="invalid device"):
            name_it()
    assert torch.vtpu.current_device() == 0


@pytest.mark.parametrize("factory", [
    lambda: torch.empty(2, device="vtpu", pin_memory=True),
    lambda: torch.zeros(2, device="vtpu", pin_memory=True),
    lambda: torch.empty_strided((2,), (1,), device="vtpu", pin_memory=True),
])
def test_pinned_device_tensors_are_refused_as_on_cuda(factory):
    # Pinning is a property of host memory: CUDA's factories refuse it, and
    # vtpu's dropped the flag silently (found by review).
    with pytest.raises(RuntimeError, match="Only dense CPU tensors can be pinned"):
        factory()


def test_to_and_back_roundtrip_all_dtypes():
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
                  torch.int32, torch.int8, torch.uint8, torch.bool):
        cpu = (torch.arange(24) % 5).to(dtype).reshape(2, 3, 4)
        dev = cpu.to("vtpu")
        assert dev.dtype == dtype and dev.device.type == "vtpu"
        assert torch.equal(dev.cpu(), cpu)


def test_non_contiguous_views_and_copies():
    cpu = torch.randn(6, 8)
    dev = cpu.to("vtpu")
    torch.testing.assert_close(dev.t().contiguous().cpu(), cpu.t().contiguous())
    torch.testing.assert_close(dev[1:5:2, ::3].cpu(), cpu[1:5:2, ::3])
    dev[::2] = 0
    cpu[::2] = 0
    assert torch.equal(dev.cpu(), cpu)


def test_generated_methods():
    m = torch.nn.Linear(3, 2).vtpu()
    assert all(p.is_vtpu for p in m.parameters())
    s = torch.ones(4).untyped_storage().vtpu()
    assert s.device.type == "vtpu"
    t = torch.ones(3).vtpu()
    assert t.is_vtpu


def test_model_to_and_forward_matches_cpu():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.GELU(), torch.nn.Linear(7, 2))
    x = torch.randn(4, 5)
    expected = m(x)
    got = m.to("vtpu")(x.to("vtpu"))
    torch.testing.assert_close(got.cpu(), expected)


def test_printing():
    x = torch.arange(4.0, device="vtpu")
    text = repr(x)
    assert "device='vtpu:0'" in text and "3." in text


def test_save_load_map_location(tmp_path):
    x = torch.randn(3, 3, device="vtpu")
    path = tmp_path / "t.pt"
    torch.save({"x": x}, path)
    on_device = torch.load(path)["x"]
    on_cpu = torch.load(path, map_location="cpu")["x"]
    assert on_device.device.type == "vtpu" and on_cpu.device.type == "cpu"
    assert torch.equal(on_device.cpu(), on_cpu)
    buf = io.BytesIO()
    torch.save(torch.nn.Linear(2, 2).to("vtpu").state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, map_location="vtpu")
    assert state["weight"].device.type == "vtpu"


def test_dataloader_batches_to_device():
    data = torch.utils.data.TensorDataset(torch.randn(20, 3), torch.arange(20))
    total = torch.zeros((), device="vtpu")
    for x, y in torch.utils.data.DataLoader(data, batch_size=6, num_workers=2):
        total += (x.to("vtpu") * y.to("vtpu")[:, None]).sum()
    expected = sum((x * y[:, None]).sum() for x, y in torch.utils.data.DataLoader(data, batch_size=6))
    torch.testing.assert_close(total.cpu(), expected)


def test_autograd_matches_cpu():
    torch.manual_seed(0)
    w = torch.randn(4, 4, requires_grad=True)
    wd = w.detach().to("vtpu").requires_grad_()
    x = torch.randn(3, 4)
    (x @ w).tanh().sum().backward()
    (x.to("vtpu") @ wd).tanh().sum().backward()
    torch.testing.assert_close(wd.grad.cpu(), w.grad)


def test_torch_accelerator_reports_vtpu():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator().type == "vtpu"
    assert torch.accelerator.device_count() == 1


def test_events_record_query_elapsed():
    start = torch.Event(device="vtpu", enable_timing=True)
    end = torch.Event(device="vtpu", enable_timing=True)
    x = torch.randn(64, 64, device="vtpu")
    start.record()
    for _ in range(5):
        x = x @ x / 64
    end.record()
    end.synchronize()
    assert end.query()
    assert start.elapsed_time(end) >= 0.0


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_event_synchronize_raises_a_pending_kernel_error(mode):
    """An event wait is a synchronisation point like stream and device
    synchronize: a kernel that failed asynchronously raises there (it
    returned normally and the error surfaced only at a later sync)."""
    torch_vtpu.set_mode(mode)
    x = torch.ones(8, device="vtpu")
    x[torch.tensor([0, 99], device="vtpu")]  # out of range: raised asynchronously
    event = torch.Event(device="vtpu")
    event.record()
    with pytest.raises(IndexError, match="out of bounds"):
        event.synchronize()
    torch.vtpu.synchronize()  # raised once, then cleared: the device is usable
    assert (x + 1).sum().item() == 16


def test_debug_mode_events_complete_when_recorded():
    """Debug mode runs each op before it returns, so an event recorded after
    them is already complete: query() is true and elapsed_time works without
    a wait (the marker used to wait for the stream's worker)."""
    torch_vtpu.set_mode("debug")
    x = torch.ones(256, 256, device="vtpu")
    start = torch.Event(device="vtpu", enable_timing=True)
    end = torch.Event(device="vtpu", enable_timing=True)
    start.record()
    y = x @ x
    end.record()
    assert end.query()
    assert start.elapsed_time(end) >= 0.0
    assert y[0, 0].item() == 256


def test_autocast_bfloat16_matches_cpu_autocast():
    torch.manual_seed(0)
    m = torch.nn.Linear(8, 4)
    x = torch.randn(2, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = m(x)
    md = m.to("vtpu")
    with torch.autocast("vtpu", dtype=torch.bfloat16):
        y = md(x.to("vtpu"))
        z = torch.log_softmax(y, dim=-1)  # an fp32-policy op
    assert y.dtype == torch.bfloat16 and expected.dtype == torch.bfloat16
    assert z.dtype == torch.float32
    torch.testing.assert_close(y.cpu(), expected)


def test_autocast_to_float32_runs_lower_precision_ops_in_float32_as_cuda():
    # CUDA's autocast takes float32; vtpu's used the CPU's list and warned
    # "not supported. Disabling autocast" (found by review).
    a, b = torch.randn(8, 8, dtype=torch.bfloat16), torch.randn(8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("vtpu", dtype=torch.float32):
            assert torch.is_autocast_enabled("vtpu")
            product = torch.mm(a.to("vtpu"), b.to("vtpu"))  # bf16 @ f32 raises without autocast
    assert product.dtype == torch.float32
    torch.testing.assert_close(product.cpu(), a.float() @ b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_3d_network_with_avg_pool3d_trains_under_autocast_as_on_the_cpu(dtype):
    # avg_pool3d has no 16-bit CPU kernel (the one vtpu runs); CUDA's policy
    # left it in the convolution's dtype and the step raised NotImplementedError
    # (found by a review of vision workloads). Computed in float32, as CPU
    # autocast does.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv3d(2, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.AvgPool3d(2),
                                torch.nn.Flatten(), torch.nn.Linear(4 * 2 * 2 * 2, 3))
    x = torch.randn(2, 2, 4, 4, 4)
    with torch.autocast("cpu", dtype=dtype):
        want = model(x)
    want.float().sum().backward()
    want_grad = model[0].weight.grad.clone()
    device_model = copy.deepcopy(model).to("vtpu")
    device_model.zero_grad()
    with torch.autocast("vtpu", dtype=dtype):
        pooled = device_model[:3](x.to("vtpu"))
        got = device_model[3:](pooled)
    assert pooled.dtype == torch.float32
    got.float().sum().backward()
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.float().cpu(), want.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(device_model[0].weight.grad.cpu(), want_grad, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("mode", ["debug", "strict", "fused"])
def test_binary_cross_entropy_is_refused_under_autocast_as_on_cuda(mode):
    # CUDA's autocast refuses it (a sigmoid in float16 then log(1 - p)); vtpu's
    # gave a dtype error for a float32 target and a float16 loss for a float16 one.
    torch_vtpu.set_mode(mode)
    x, y = torch.randn(16, 4, device="vtpu"), torch.rand(16, 4, device="vtpu")
    with torch.autocast("vtpu", dtype=torch.float16):
        p = torch.sigmoid(x @ x.t()[:, :4])
        for target in (y, y.half()):
            with pytest.raises(RuntimeError, match="unsafe to autocast"):
                torch.nn.functional.binary_cross_entropy(p, target)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ x.t()[:, :4], y)
        assert loss.dtype == torch.float32
        with torch.autocast("vtpu", enabled=False):
            inside = torch.nn.functional.binary_cross_entropy(p.float(), y)
    outside = torch.nn.functional.binary_cross_entropy(p.float(), y)
    torch.testing.assert_close(inside.cpu(), torch.nn.functional.binary_cross_entropy(p.float().cpu(), y.cpu()))
    assert torch.equal(inside.cpu(), outside.cpu())


def test_record_stream_is_accepted_for_vtpu_streams():
    # FSDP and prefetching code call it; it raised NotImplementedError.
    x = torch.ones(4, device="vtpu")
    assert x.record_stream(torch.vtpu.Stream()) is None
    assert x.record_stream(torch.vtpu.current_stream()) is None
    with pytest.raises(RuntimeError, match="expected a vtpu stream"):
        x.record_stream(torch.Stream("cpu"))
    assert torch.equal(x.cpu(), torch.ones(4))


def test_cuda_style_device_queries_answer_for_vtpu():
    v = torch.vtpu
    assert v.get_device_name().startswith("vTPU") and v.get_device_name(0) == v.get_device_name("vtpu:0")
    props = v.get_device_properties()
    assert props.total_memory == v.mem_get_info()[1] and props.multi_processor_count >= 1
    assert props.name == v.get_device_name() and "total_memory" in repr(props)
    x = torch.ones(1000, device="vtpu")
    summary = v.memory_summary()
    assert "Allocated memory" in summary and "Device capacity" in summary
    assert v.default_generators[0].device.type == "vtpu"
    v.default_generators[0].manual_seed(4)
    a = torch.rand(3, device="vtpu").cpu()
    torch.vtpu.manual_seed(4)
    assert torch.equal(a, torch.rand(3, device="vtpu").cpu())
    assert v.OutOfMemoryError is torch.OutOfMemoryError
    with v.device_of(x), v.device_of(torch.ones(1)):
        pass
    v.set_stream(v.current_stream())
    with pytest.raises(ValueError, match="vtpu stream"):
        v.set_stream(torch.Stream("cpu"))
    v.reset_accumulated_memory_stats()
    capacity = v.mem_get_info()[1]
    try:
        v.set_per_process_memory_fraction(0.25)
        assert abs(v.mem_get_info()[1] - torch_vtpu._C._physical_memory() // 4) <= 1
        with pytest.raises(ValueError, match="Allowed range"):
            v.set_per_process_memory_fraction(1.5)
        with pytest.raises(TypeError, match="float"):
            v.set_per_process_memory_fraction(1)
    finally:
        v.set_memory_limit(capacity)
    assert v.mem_get_info()[1] == capacity
    with pytest.raises(AttributeError, match="no attribute 'not_a_function'"):
        v.not_a_function


def test_autoload_entry_point_declared():
    from importlib.metadata import entry_points

    names = [ep.value for ep in entry_points(group="torch.backends")]
    assert "torch_vtpu:_autoload" in names


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_attention_runs_cpu_flash_kernel_with_cpu_bits(mode):
    """F.scaled_dot_product_attention on vtpu takes ATen's CPU backend policy, so it runs
    the CPU flash-attention kernel (forward and backward: one op each, queued, no
    synchronisation) instead of the math decomposition's ~16 ops, and gives CPU's bits."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator().manual_seed(0)
    mask = torch.ones(16, 16, dtype=torch.bool).tril()
    cases = [
        ((2, 4, 16, 8), (2, 4, 16, 8), dict(is_causal=True)),
        ((2, 4, 16, 8), (2, 4, 16, 8), dict(attn_mask=mask)),
        ((1, 4, 1, 8), (1, 4, 20, 8), dict(scale=0.3)),  # a decoding step against a KV cache
        ((1, 4, 5, 8), (1, 2, 7, 8), dict(enable_gqa=True)),
    ]
    with torch_vtpu.mode(mode):
        for q_shape, kv_shape, kw in cases:
            q = torch.randn(q_shape, generator=g, requires_grad=True)
            k, v = (torch.randn(kv_shape, generator=g, requires_grad=True) for _ in range(2))
            expected = F.scaled_dot_product_attention(q, k, v, **kw)
            expected.square().sum().backward()
            dq, dk, dv = (t.detach().to("vtpu").requires_grad_(True) for t in (q, k, v))
            dkw = {n: a.to("vtpu") if isinstance(a, torch.Tensor) else a for n, a in kw.items()}
            torch_vtpu.reset_metrics()
            out = F.scaled_dot_product_attention(dq, dk, dv, **dkw)
            out.square().sum().backward()
            metrics = torch_vtpu.metrics()
            assert set(metrics["host_fallback_ops"]) == {
                "aten::_scaled_dot_product_flash_attention_for_cpu",
                "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}, (kw, metrics["host_fallback_ops"])
            assert set(metrics["syncs"]) <= {"unfused_op"}, metrics["syncs"]  # window flushes only
            assert torch.equal(out.detach().cpu(), expected.detach()), kw
            for mine, ref in zip((dq, dk, dv), (q, k, v)):
                assert torch.equal(mine.grad.cpu(), ref.grad), kw
        # The policy honours the user's backend choice: math still works.
        with sdpa_kernel(SDPBackend.MATH):
            q, k, v = (torch.randn(2, 4, 16, 8, generator=g) for _ in range(3))
            torch_vtpu.reset_metrics()
            out = F.scaled_dot_product_attention(q.to("vtpu"), k.to("vtpu"), v.to("vtpu"), is_causal=True)
            torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, k, v, is_causal=True))
            assert "aten::_scaled_dot_product_flash_attention_for_cpu" not in torch_vtpu.metrics()["host_fallback_ops"]


def test_stream_context_manager_as_cuda():
    # torch.cuda.stream(s) code ran into AttributeError (found by review).
    s = torch.vtpu.Stream()
    with torch.vtpu.stream(s) as entered:
        assert entered is s and torch.vtpu.current_stream() == s
        x = torch.ones(3, device="vtpu") * 2
    with torch.vtpu.stream(None) as entered:
        assert entered is None
    assert torch.equal(x.cpu(), torch.full((3,), 2.0))
    with pytest.raises(ValueError, match="vtpu stream"):
        torch.vtpu.stream(torch.Stream(device="cpu"))
