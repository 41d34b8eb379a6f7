// torch_vtpu._C: the Python face of the bridge. Thin: state lives in the
// engine and in DeviceContext; this file only converts.
#include <ATen/ATen.h>
#include <pybind11/pybind11.h>

#include <chrono>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include "aten_bridge.h"
#include "call_site.h"
#include "device_context.h"
#include "device_trace.h"
#include "extern_blocks.h"
#include "onednn_gemm.h"
#include "fused_window.h"
#include "generated_kernels.h"
#include "sync_debug.h"
#include "vtpu/runtime/error.h"
#include "vtpu/runtime/memory_size.h"
#include "vtpu/cache/shared_tier.h"
#include "vtpu/targets/target.h"

namespace py = pybind11;

namespace vtpu::bridge {
namespace {

void synchronize_device() {
  // Release the GIL: a queued kernel might need it (a Python kernel), and
  // other Python threads should run while we wait.
  py::gil_scoped_release no_gil;
  DeviceContext::get().synchronize("synchronize");
}

// Generated-kernel counters are cumulative in the engine; reset_metrics()
// records a baseline and metrics() reports what happened since.
GeneratedKernelStats& generated_baseline() {
  static GeneratedKernelStats baseline;
  return baseline;
}

py::dict metrics_dict() {
  const MetricsSnapshot s = DeviceContext::get().metrics().snapshot();
  const GeneratedKernelStats now = generated_kernel_stats();
  const GeneratedKernelStats& base = generated_baseline();
  py::dict d;
  d["ops"] = s.ops;
  d["kernels_launched"] = s.kernels_launched;
  d["generated_kernels"] = now.launches;
  const FusionStats fusion = fusion_stats();
  d["fused_kernels"] = fusion.fused_kernels;
  d["ops_per_fused_kernel"] = fusion.ops_per_kernel;
  d["dead_stores_skipped"] = fusion.dead_stores_skipped;
  d["pattern_cache_hits"] = fusion.pattern_hits;
  d["pattern_cache_misses"] = fusion.pattern_misses;
  d["fusion_compiles"] = fusion.background_compiles;
  d["matmul_epilogues"] = fusion.matmul_epilogues;
  d["matmul_epilogue_ops"] = fusion.matmul_epilogue_ops;
  d["compiles"] = now.compiles - base.compiles;
  d["compile_seconds"] = now.compile_seconds - base.compile_seconds;
  py::dict hits;
  for (const char* tier : {"memory", "disk", "shared"}) {
    const auto get = [&](const GeneratedKernelStats& g) {
      auto it = g.cache_hits.find(tier);
      return it == g.cache_hits.end() ? std::uint64_t{0} : it->second;
    };
    hits[tier] = get(now) - get(base);
  }
  d["cache_hits"] = hits;
  // Kernels first served by the ahead-of-time library shipped with the package.
  const auto aot = [](const GeneratedKernelStats& g) {
    auto it = g.cache_hits.find("aot");
    return it == g.cache_hits.end() ? std::uint64_t{0} : it->second;
  };
  d["aot_hits"] = aot(now) - aot(base);
  d["cache_misses"] = now.cache_misses - base.cache_misses;
  // The shared tier's refusals (entries signed with another VTPU_CACHE_KEY)
  // and failed requests (store unreachable): both mean servers compile what
  // they could have fetched.
  d["shared_cache_refused"] = now.shared_refused - base.shared_refused;
  d["shared_cache_errors"] = now.shared_errors - base.shared_errors;
  d["host_fallback_ops"] = s.host_fallback_ops;
  d["host_serial_ops"] = s.host_serial_ops;
  d["syncs"] = s.syncs;
  // Seconds the stream spent in each kind of kernel (wall time of its tasks).
  d["device_time_s"] = s.device_seconds;
  if (DeviceContext::get().metrics().per_op_timing()) {
    py::dict by_op;
    for (const auto& [op, t] : s.device_seconds_by_op) by_op[py::str(op)] = py::make_tuple(t.first, t.second);
    d["device_time_by_op"] = by_op;
  }
  return d;
}

py::dict memory_stats() {
  const auto s = DeviceContext::get().allocator().stats();
  py::dict d;
  d["allocated_bytes"] = s.allocated_bytes;
  d["reserved_bytes"] = s.reserved_bytes;
  d["peak_allocated_bytes"] = s.peak_allocated_bytes;
  d["peak_reserved_bytes"] = s.peak_reserved_bytes;
  d["allocations"] = s.allocations;
  d["frees"] = s.frees;
  d["cache_hits"] = s.cache_hits;
  d["out_of_memory"] = s.out_of_memory;
  d["capacity_bytes"] = DeviceContext::get().allocator().capacity();
  return d;
}

// Runs `fn`, turning C++ errors into the matching Python exceptions
// (c10::ValueError -> ValueError, OutOfMemoryError -> torch.OutOfMemoryError).
template <typename Fn>
void guarded(Fn&& fn) {
  HANDLE_TH_ERRORS
  fn();
  END_HANDLE_TH_ERRORS_PYBIND
}

}  // namespace

void register_graph_program(py::module& m);  // graph_program.cpp
void register_collectives(py::module& m);     // collectives.cpp

}  // namespace vtpu::bridge

PYBIND11_MODULE(_C, m) {
  using namespace vtpu::bridge;
  set_blocking_wait_wrapper([](const std::function<void()>& wait) {
    if (Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release no_gil;
      wait();
    } else {
      wait();
    }
  });
  m.doc() = "vTPU torch bridge";
  register_graph_program(m);
  register_collectives(m);
  register_device_trace();
  m.def("_synchronize", [] { guarded([] { synchronize_device(); }); });
  m.def("_set_sync_debug_mode", [](int mode) {
    if (mode < 0 || mode > 2) throw std::invalid_argument("sync debug mode must be 0, 1 or 2");
    set_sync_debug_mode(static_cast<SyncDebugMode>(mode));
  });
  m.def("_get_sync_debug_mode", [] { return static_cast<int>(sync_debug_mode()); });
  m.def("_set_sync_debug_exempt", [](bool exempt) {
    const bool before = sync_debug_exempt();
    set_sync_debug_exempt(exempt);
    return before;
  });
  // A compiled program's chain boundary (torch_vtpu/compiler/schedule.py).
  m.def("_end_fused_chain", [] { guarded([] { end_fused_chain(); }); });
  m.def("_get_mode", [] { return std::string(mode_name(DeviceContext::get().mode())); });
  // The engine's targets (the hardware layer): (name, available, description
  // or why not). Making the cuda target retains a GPU's context and builds a
  // probe kernel, so this is for `python -m torch_vtpu info`, not hot paths.
  m.def("_engine_targets", [] {
    std::vector<std::tuple<std::string, bool, std::string>> targets;
    for (const char* name : {"host", "cuda"}) {
      std::string why;
      std::unique_ptr<vtpu::targets::Target> target;
      try {
        target = vtpu::targets::make_target(name, &why);
      } catch (const vtpu::runtime::Error& e) {
        why = e.what();
      }
      targets.emplace_back(name, target != nullptr, target != nullptr ? target->description() : why);
    }
    return targets;
  });
  // The shared compile-cache tier as this environment configures it, for
  // `python -m torch_vtpu cache stats`: None when VTPU_SHARED_CACHE is unset;
  // otherwise its location, what it holds (directories only) and whether a
  // probe lookup reached it, or the configuration error.
  m.def("_shared_cache_status", []() -> py::object {
    py::dict d;
    std::shared_ptr<vtpu::cache::SharedTier> tier;
    try {
      tier = vtpu::cache::SharedTier::from_env();
    } catch (const std::exception& e) {
      const char* where = std::getenv("VTPU_SHARED_CACHE");
      d["location"] = vtpu::cache::redact_url(where ? where : "");
      d["error"] = e.what();
      return d;
    }
    if (!tier) return py::none();
    vtpu::cache::StoreUsage usage;
    {
      py::gil_scoped_release no_gil;
      // A key no kernel has: the answer is a miss, or the store's failure.
      tier->get(vtpu::cache::make_key({"vtpu shared cache probe"}));
      try {
        usage = tier->usage();
      } catch (const std::exception&) {
        // counted below through the probe's error, if the store is down
      }
    }
    d["location"] = tier->describe();
    d["reachable"] = tier->stats().errors == 0;
    d["last_error"] = tier->last_error();
    d["counted"] = usage.counted;
    d["entries"] = usage.entries;
    d["bytes"] = usage.bytes;
    return d;
  });
  m.def("_set_mode", [](const std::string& name) { guarded([&] {
    Mode mode;
    try {
      mode = parse_mode(name);
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_WITH(ValueError, false, e.what());
    }
    py::gil_scoped_release no_gil;
    DeviceContext::get().set_mode(mode);
  }); });
  m.def("_fused_min_elements", [] { return fused_min_elements(); });
  m.def("_set_fused_min_elements", [](std::int64_t elements) {
    TORCH_CHECK_WITH(ValueError, elements >= 0, "fused_min_elements must be >= 0, got ", elements);
    set_fused_min_elements(elements);
  });
  m.def("_metrics", &metrics_dict);
  m.def("_set_per_op_timing", [](bool on) { DeviceContext::get().metrics().set_per_op_timing(on); });
  m.def("_reset_metrics", [] {
    DeviceContext::get().metrics().reset();
    reset_generated_kernel_launches();
    reset_fusion_stats();
    generated_baseline() = generated_kernel_stats();
  });
  // Test hook: matrix products run as row blocks on the pool so far.
  m.def("_gemm_row_block_runs", [] { return gemm_row_block_runs(); });
  m.def("_gemm_column_block_runs", [] { return gemm_column_block_runs(); });
  m.def("_skinny_gemm_runs", [] { return skinny_gemm_runs(); });
  m.def("_onednn_gemm_runs", [] { return onednn_gemm_runs(); });
  m.def("_onednn_gemm_enabled", [] { return onednn_gemm_enabled(); });
  m.def("_bmm_batch_block_runs", [] { return bmm_batch_block_runs(); });
  m.def("_attention_batch_block_runs", [] { return attention_batch_block_runs(); });
  m.def("_convolution_batch_block_runs", [] { return convolution_batch_block_runs(); });
  m.def("_convolution_batch_blocks", [] { return convolution_batch_blocks(); });
  m.def("_convolution_backward_batch_block_runs", [] { return convolution_backward_batch_block_runs(); });
  m.def("_layer_norm_row_block_runs", [] { return layer_norm_row_block_runs(); });
  m.def("_wait_for_fusion_compiles", [] {
    py::gil_scoped_release no_gil;
    wait_for_fusion_compiles();
  });
  m.def("_memory_stats", &memory_stats);
  m.def("_reset_peak_memory_stats", [] { DeviceContext::get().allocator().reset_peak_stats(); });
  m.def("_empty_cache", [] { guarded([] {
    py::gil_scoped_release no_gil;
    // Queued kernels may still hold buffers; they return to the cache when done.
    DeviceContext::get().synchronize("empty_cache");
    DeviceContext::get().allocator().empty_cache();
  }); });
  m.def("_set_memory_limit", [](const std::string& text) { guarded([&] {
    try {
      DeviceContext::get().allocator().set_capacity(vtpu::runtime::parse_memory_size(text));
    } catch (const vtpu::runtime::Error& e) {
      TORCH_CHECK_WITH(ValueError, false, e.what());
    }
  }); });
  m.def("_physical_memory", [] { return vtpu::runtime::physical_memory_bytes(); });
  // Called at interpreter exit: finish queued work while everything it uses
  // still exists; errors nobody asked for any more are dropped, not raised.
  m.def("_in_forked_child", [] { return in_forked_child(); });
  m.def("_device_was_used", [] { return device_memory_ever_requested(); });
  m.def("_shutdown", [] {
    if (in_forked_child()) return;  // no worker to wait for; the parent owns the device
    py::gil_scoped_release no_gil;
    auto& stream = DeviceContext::get().stream();
    stream.wait_for(stream.enqueued());
    (void)stream.take_error();
  });
  m.def("_stream_idle", [] { return DeviceContext::get().stream().query(); });
  m.def("_default_generator", [] { return default_generator(); });
  // Call sites (torch_vtpu.debug).
  m.def("_set_call_site_capture", [](bool on) { set_call_site_capture(on); });
  m.def("_call_site_capture", [] { return call_site_capture_enabled(); });
  m.def("_set_library_paths", [](std::vector<std::string> internal, std::vector<std::string> user) {
    set_library_paths(std::move(internal), std::move(user));
  });
  // The caller's site as (file, line, function), or None: what an op issued
  // here would record (also when capture is off).
  m.def("_call_site", []() -> py::object {
    auto resolved = resolve_call_site(vtpu::bridge::detail::capture_call_site_slow());
    if (!resolved) return py::none();
    return py::make_tuple(resolved->file, resolved->line, resolved->function);
  });
  // Nanoseconds per call-site capture from the calling frame, for the benchmark.
  m.def("_time_call_site_capture", [](int n) {
    py::gil_scoped_release no_gil;  // as torch's bindings dispatch
    const auto start = std::chrono::steady_clock::now();
    const void* sink = nullptr;
    for (int i = 0; i < n; ++i) sink = capture_call_site().code;
    const auto ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    return std::make_pair(ns / n, sink != nullptr);
  });
  m.def("_debug_corrupt_next", [](const std::string& op) { debug_corrupt_next(op); });
}
