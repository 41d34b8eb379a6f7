#include "fused_window.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <type_traits>
#include <utility>
#include <variant>

#include "device_context.h"
#include "generated_kernels.h"
#include "vtpu/compiler/host_codegen.h"
#include "vtpu/compiler/kernel_provider.h"
#include "vtpu/ir/graph.h"
#include "vtpu/runtime/error.h"

namespace vtpu::bridge {
namespace {

// Bounds that keep a fused kernel's source (and its compile) small and a
// window's bookkeeping cheap. Both are program properties: reaching them is
// a deterministic flush point.
constexpr std::size_t kMaxOpsPerCluster = 48;
constexpr std::size_t kMaxWindowOps = 1024;

// Where an operand lives: same storage, same first element, same strides
// and dtype over the same iteration space means the same elements.
struct Geometry {
  const void* storage = nullptr;  // the allocation's base address
  const void* data = nullptr;
  ir::DType dtype = ir::DType::kFloat32;
  std::size_t rank = 0;
  std::int64_t strides[compiler::kMaxRank] = {};
  bool operator==(const Geometry& o) const {
    return storage == o.storage && data == o.data && dtype == o.dtype && rank == o.rank &&
           std::equal(strides, strides + rank, o.strides);
  }
};

Geometry geometry_of(const WindowOperand& o, std::size_t rank) {
  Geometry g{o.base, o.arg.data, o.dtype, rank, {}};
  std::copy(o.arg.strides, o.arg.strides + rank, g.strides);
  return g;
}

struct Use {
  std::size_t cluster;
  Geometry geometry;
  bool written;
};

using UseMap = std::unordered_map<const void*, std::vector<Use>>;

struct Cluster {
  std::vector<std::int64_t> iter_sizes;
  std::vector<std::size_t> ops;                     // indices into Window::ops, program order
  std::vector<const void*> storages;    // touched (may repeat)
};

struct PatternState {
  compiler::VtpuKernelFn fn = nullptr;
  bool failed = false;
};

// Builds fused kernels off the issuing thread, one at a time.
class BackgroundCompiler {
 public:
  ~BackgroundCompiler() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  void submit(std::string symbol, ir::Graph graph);
  void wait_idle() {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
  }
  // The pattern table: symbol -> built kernel (or failure).
  std::mutex patterns_mutex;
  std::unordered_map<std::string, PatternState> patterns;
  std::unordered_map<std::string, bool> requested;  // guarded by patterns_mutex
  std::atomic<std::uint64_t> compiles{0};

 private:
  void loop();
  std::mutex mutex_;
  std::condition_variable ready_, idle_;
  std::deque<std::pair<std::string, ir::Graph>> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  std::thread worker_;
};

void BackgroundCompiler::submit(std::string symbol, ir::Graph graph) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!worker_.joinable()) worker_ = std::thread([this] { loop(); });
  queue_.emplace_back(std::move(symbol), std::move(graph));
  ready_.notify_one();
}

void BackgroundCompiler::loop() {
  for (;;) {
    std::pair<std::string, ir::Graph> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    PatternState state;
    try {
      compiler::KernelProvider* provider = generated_kernel_provider();
      state.fn = provider == nullptr ? nullptr : provider->get(job.second);
    } catch (const std::exception& e) {
      // The pattern keeps running on single-op kernels (same results).
      std::fprintf(stderr, "vtpu: fused kernel unavailable, its ops stay unfused: %s\n", e.what());
      state.fn = nullptr;
    }
    state.failed = state.fn == nullptr;
    ++compiles;
    {
      std::lock_guard<std::mutex> lock(patterns_mutex);
      patterns[job.first] = state;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      busy_ = false;
    }
    idle_.notify_all();
  }
}

BackgroundCompiler& background() {
  // Leaked on purpose, like the device context: kernels stay loaded to exit.
  static auto* compiler = new BackgroundCompiler();
  return *compiler;
}

bool compile_in_foreground() {
  static const bool foreground = [] {
    const char* env = std::getenv("VTPU_FUSED_COMPILE");
    return env != nullptr && std::string(env) == "sync";
  }();
  return foreground;
}

class Window {
 public:
  void record(WindowOp op);
  void flush(const char* reason, bool count);
  FusionStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_ = {};
  }

 private:
  std::size_t choose_cluster(const WindowOp& op, const std::vector<Geometry>& geometries, bool& joins);
  void flush_locked(std::vector<WindowOp>& released);
  void launch_cluster(const Cluster& cluster, std::size_t index);
  void launch_unfused(const Cluster& cluster);

  std::mutex mutex_;
  std::vector<WindowOp> ops_;
  std::vector<Cluster> clusters_;
  UseMap uses_;
  std::vector<Geometry> scratch_geometries_;  // reused by record()
  FusionStats stats_;
};

Window& window() {
  static auto* w = new Window();
  return *w;
}

// The operands of `op` in order: the output, then the tensor inputs. A
// small fixed array: this runs for every recorded op.
struct TensorOperands {
  const WindowOperand* items[8];
  std::size_t count = 0;
  const WindowOperand* const* begin() const { return items; }
  const WindowOperand* const* end() const { return items + count; }
};

TensorOperands tensor_operands(const WindowOp& op) {
  TensorOperands out;
  out.items[out.count++] = &op.out;
  for (const WindowOperand& in : op.inputs)
    if (in.is_tensor && out.count < 8) out.items[out.count++] = &in;
  return out;
}

// How the buffers touched by an op or a cluster (`geometries`, `writes`)
// meet cluster k: whether they share a storage, whether a write is involved
// (then the op cannot move across k), and whether every shared use has the
// same geometry where a write is involved (then the op can join k).
struct Contact {
  bool shares = false;
  bool conflicts = false;
  bool compatible = true;
};


Contact contact(const UseMap& uses, const std::vector<Geometry>& geometries, const std::vector<bool>& writes,
                std::size_t k) {
  Contact c;
  for (std::size_t i = 0; i < geometries.size(); ++i) {
    auto found = uses.find(geometries[i].storage);
    if (found == uses.end()) continue;
    for (const Use& use : found->second) {
      if (use.cluster != k) continue;
      c.shares = true;
      const bool write = writes[i] || use.written;
      c.conflicts = c.conflicts || write;
      if (write && !(use.geometry == geometries[i])) c.compatible = false;
    }
  }
  return c;
}

// The clusters that touch any of `geometries`' storages, latest first.
std::vector<std::size_t> touching(const UseMap& uses, const std::vector<Geometry>& geometries) {
  std::vector<std::size_t> clusters;
  for (const Geometry& g : geometries)
    if (auto found = uses.find(g.storage); found != uses.end())
      for (const Use& use : found->second) clusters.push_back(use.cluster);
  std::sort(clusters.begin(), clusters.end(), std::greater<>());
  clusters.erase(std::unique(clusters.begin(), clusters.end()), clusters.end());
  return clusters;
}

// The op joins the latest cluster of its iteration space that shares a
// buffer with it, if it can legally move back there (no cluster in between
// writes what it touches or touches what it writes); an op sharing nothing
// starts a cluster, so unrelated work is not interleaved into one kernel.
// Earlier related clusters that can move forward to the chosen one are
// merged into it: a parameter's optimizer ops, issued one foreach at a time
// across all parameters, end up in one kernel per parameter.
std::size_t Window::choose_cluster(const WindowOp& op, const std::vector<Geometry>& geometries, bool& joins) {
  std::vector<bool> writes(geometries.size(), false);
  writes[0] = true;
  joins = false;
  const std::vector<std::size_t> related = touching(uses_, geometries);
  std::size_t target = clusters_.size();
  for (std::size_t k : related) {
    const Contact c = contact(uses_, geometries, writes, k);
    if (c.compatible && clusters_[k].iter_sizes == op.iter_sizes && clusters_[k].ops.size() < kMaxOpsPerCluster) {
      target = k;
      joins = true;
      break;
    }
    if (c.conflicts) return clusters_.size();
  }
  if (!joins) return target;
  // Merge earlier related clusters into the target, latest first.
  for (std::size_t r : related) {
    if (r >= target) continue;
    Cluster& candidate = clusters_[r];
    if (candidate.ops.empty() || candidate.iter_sizes != op.iter_sizes ||
        candidate.ops.size() + clusters_[target].ops.size() >= kMaxOpsPerCluster)
      continue;
    std::vector<Geometry> r_geometries;
    std::vector<bool> r_writes;
    std::vector<const void*> seen;
    for (const void* storage : candidate.storages) {
      if (std::find(seen.begin(), seen.end(), storage) != seen.end()) continue;
      seen.push_back(storage);
      for (const Use& use : uses_.at(storage))
        if (use.cluster == r) {
          r_geometries.push_back(use.geometry);
          r_writes.push_back(use.written);
        }
    }
    if (!contact(uses_, r_geometries, r_writes, target).compatible ||
        !contact(uses_, geometries, writes, r).compatible)
      continue;
    // Moving r forward to the target passes the clusters in between that
    // touch its buffers; none may write them or be written by r.
    bool movable = true;
    for (std::size_t q : touching(uses_, r_geometries))
      if (q > r && q < target && contact(uses_, r_geometries, r_writes, q).conflicts) movable = false;
    if (!movable) continue;
    for (const void* storage : seen)
      for (Use& use : uses_.at(storage))
        if (use.cluster == r) use.cluster = target;
    Cluster& into = clusters_[target];
    into.ops.insert(into.ops.end(), candidate.ops.begin(), candidate.ops.end());
    std::sort(into.ops.begin(), into.ops.end());  // program order within the kernel
    into.storages.insert(into.storages.end(), candidate.storages.begin(), candidate.storages.end());
    candidate.ops.clear();
    candidate.storages.clear();
  }
  return target;
}

void Window::record(WindowOp op) {
  std::vector<WindowOp> released;  // storages die outside the lock
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ops_.size() >= kMaxWindowOps) {
      DeviceContext::get().metrics().count_sync("window_limit");
      flush_locked(released);
    }
    const std::size_t rank = op.iter_sizes.size();
    std::vector<Geometry>& geometries = scratch_geometries_;
    geometries.clear();
    for (const WindowOperand* o : tensor_operands(op)) geometries.push_back(geometry_of(*o, rank));
    if (ops_.empty()) ops_.reserve(kMaxWindowOps);
    bool joins = false;
    const std::size_t k = choose_cluster(op, geometries, joins);
    if (!joins) clusters_.push_back(Cluster{op.iter_sizes, {}, {}});
    clusters_[k].ops.push_back(ops_.size());
    for (std::size_t i = 0; i < geometries.size(); ++i) {
      uses_[geometries[i].storage].push_back(Use{k, geometries[i], i == 0});
      clusters_[k].storages.push_back(geometries[i].storage);
    }
    ops_.push_back(std::move(op));
    DeviceContext::get().set_window_pending(true);
  }
}

void Window::flush(const char* reason, bool count) {
  std::vector<WindowOp> released;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ops_.empty()) return;
    if (count) DeviceContext::get().metrics().count_sync(reason);
    flush_locked(released);
  }
}

void Window::flush_locked(std::vector<WindowOp>& released) {
  for (std::size_t k = 0; k < clusters_.size(); ++k)
    if (!clusters_[k].ops.empty()) launch_cluster(clusters_[k], k);
  released = std::move(ops_);
  ops_.clear();
  clusters_.clear();
  uses_.clear();
  DeviceContext::get().set_window_pending(false);
}

void Window::launch_unfused(const Cluster& cluster) {
  DeviceContext& context = DeviceContext::get();
  for (std::size_t i : cluster.ops) {
    WindowOp& op = ops_[i];
    context.metrics().count_kernel();
    context.enqueue_task([fn = op.single_op_fn, kind = op.op, rank = op.single_op_rank,
                          tensors = std::move(op.single_op_tensors), scalars = std::move(op.single_op_scalars)] {
      run_generated_kernel(fn, kind, rank, tensors, scalars);
    }, std::string(ir::name(op.op)));
  }
  count_generated_launches(cluster.ops.size());
  stats_.unfused_ops += cluster.ops.size();
}

bool contiguous_in(const compiler::VtpuTensorArg& arg, const std::vector<std::int64_t>& sizes) {
  std::int64_t expected = 1;
  for (std::size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] != 1 && arg.strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

// How each operand of a cluster's ops is bound: a Constant, a value an
// earlier op of the cluster wrote (forwarded in a register), or a load of
// one of the kernel's inputs.
struct Binding {
  enum Kind { kConstant, kWritten, kLoaded } kind;
  std::size_t index;  // op position in the cluster (kWritten) or input slot (kLoaded)
};

void append_attr_value(std::string& out, const ir::AttrValue& v) {
  std::visit(
      [&](const auto& x) {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<X, std::string>) {
          out += x;
        } else if constexpr (std::is_same_v<X, std::vector<std::int64_t>>) {
          for (std::int64_t i : x) out += std::to_string(i) + ",";
        } else if constexpr (std::is_same_v<X, ir::DType>) {
          out += ir::name(x);
        } else {
          out += std::to_string(x);
        }
      },
      v);
}

// What a strided kernel specialises on for one tensor (the IR's generic key:
// contiguous, broadcast with a stride-0 mask, or strided), so a pattern
// serves every shape of its kind, as strict mode's kernels do.
std::string layout_word(const compiler::VtpuTensorArg& arg, const std::vector<std::int64_t>& sizes) {
  std::uint64_t broadcast = 0;
  std::int64_t expected = 1;
  bool contiguous = true, row_major = true;
  for (std::size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] == 1) continue;
    if (arg.strides[d] != expected) contiguous = false;
    if (arg.strides[d] == 0) {
      broadcast |= std::uint64_t{1} << d;
      continue;
    }
    if (arg.strides[d] != expected) row_major = false;
    expected *= sizes[d];
  }
  if (contiguous) return "c";
  return row_major ? "b" + std::to_string(broadcast) : "s";
}

double scalar_of(const ir::AttrValue& v) {
  if (const auto* d = std::get_if<double>(&v)) return *d;
  if (const auto* i = std::get_if<std::int64_t>(&v)) return static_cast<double>(*i);
  if (const auto* b = std::get_if<bool>(&v)) return *b ? 1.0 : 0.0;
  return 0;
}

void Window::launch_cluster(const Cluster& cluster, std::size_t index) {
  if (cluster.ops.size() == 1) {
    launch_unfused(cluster);
    return;
  }
  const std::size_t rank = cluster.iter_sizes.size();
  // Flatten when every tensor is dense in the iteration order: one kernel
  // then serves every rank.
  bool flat = rank >= 1;
  for (std::size_t i : cluster.ops)
    for (const WindowOperand* o : tensor_operands(ops_[i])) flat = flat && contiguous_in(o->arg, cluster.iter_sizes);
  std::int64_t numel = 1;
  for (std::int64_t s : cluster.iter_sizes) numel *= s;
  const std::vector<std::int64_t> sizes = flat ? std::vector<std::int64_t>{numel} : cluster.iter_sizes;
  auto launch_arg = [&](const WindowOperand& o) {
    compiler::VtpuTensorArg arg = o.arg;
    if (flat) {
      arg.sizes[0] = numel;
      arg.strides[0] = 1;
    }
    return arg;
  };

  // Pass 1: bind every operand, collect the launch arguments and scalars,
  // and spell the pattern (everything the kernel depends on) as a string.
  std::vector<std::vector<Binding>> bindings;
  std::vector<Geometry> loaded;                                  // input slots
  std::vector<const WindowOperand*> loaded_operand;
  std::vector<std::pair<Geometry, std::size_t>> written;         // buffer -> last writer (op position)
  std::vector<const WindowOperand*> written_operand;
  std::vector<double> scalars;
  std::string pattern = !flat ? "strided|" : numel == 1 ? "flat1|" : "flat|";
  pattern.reserve(64 * cluster.ops.size());
  bindings.reserve(cluster.ops.size());
  auto find = [](const auto& list, const Geometry& g, auto key) -> std::ptrdiff_t {
    for (std::size_t i = 0; i < list.size(); ++i)
      if (key(list[i]) == g) return static_cast<std::ptrdiff_t>(i);
    return -1;
  };
  auto first = [](const auto& p) -> const Geometry& { return p.first; };
  auto self = [](const Geometry& g) -> const Geometry& { return g; };
  for (std::size_t position = 0; position < cluster.ops.size(); ++position) {
    const WindowOp& op = ops_[cluster.ops[position]];
    std::vector<Binding>& b = bindings.emplace_back();
    pattern += ir::name(op.op);
    const char* runtime = ir::runtime_scalar_attribute(op.op);
    for (const auto& [key, value] : op.attrs.entries()) {
      if (runtime != nullptr && key == runtime) continue;
      pattern += ";" + key + "=";
      append_attr_value(pattern, value);
    }
    pattern += "(";
    for (const WindowOperand& in : op.inputs) {
      if (!in.is_tensor) {
        b.push_back({Binding::kConstant, 0});
        scalars.push_back(scalar_of(in.constant));
        pattern += "c" + std::to_string(in.constant.index()) + ",";
        continue;
      }
      const Geometry g = geometry_of(in, rank);
      if (auto w = find(written, g, first); w >= 0) {
        b.push_back({Binding::kWritten, written[static_cast<std::size_t>(w)].second});
        pattern += "w" + std::to_string(written[static_cast<std::size_t>(w)].second) + ",";
      } else if (auto l = find(loaded, g, self); l >= 0) {
        b.push_back({Binding::kLoaded, static_cast<std::size_t>(l)});
        pattern += "l" + std::to_string(l) + ",";
      } else {
        b.push_back({Binding::kLoaded, loaded.size()});
        pattern += "l" + std::to_string(loaded.size()) + ":" + std::string(ir::name(in.dtype)) + ",";
        if (!flat) pattern += layout_word(in.arg, cluster.iter_sizes);
        loaded.push_back(g);
        loaded_operand.push_back(&in);
      }
    }
    if (runtime != nullptr && op.attrs.has(runtime)) scalars.push_back(op.attrs.get_double(runtime));
    pattern += ")->";
    pattern += ir::name(op.out.dtype);
    const Geometry g = geometry_of(op.out, rank);
    if (auto w = find(written, g, first); w >= 0) {
      written[static_cast<std::size_t>(w)].second = position;
      written_operand[static_cast<std::size_t>(w)] = &op.out;  // the last writer's storage decides liveness
    } else {
      written.emplace_back(g, position);
      written_operand.push_back(&op.out);
    }
    pattern += "|";
  }
  // Outputs: every buffer written, except those nobody can read any more
  // (Python dropped the storage and no other cluster touches the memory).
  std::vector<compiler::VtpuTensorArg> args;
  args.reserve(written.size() + loaded.size());
  std::vector<std::size_t> outputs;  // op positions whose values are stored
  std::uint64_t dead = 0;
  for (std::size_t i = 0; i < written.size(); ++i) {
    const void* storage = written[i].first.storage;
    bool used_elsewhere = false;
    for (const Use& use : uses_.at(storage)) used_elsewhere = used_elsewhere || use.cluster != index;
    const bool dead_store = !used_elsewhere && written_operand[i]->weak.expired();
    if (dead_store) {
      ++dead;
      continue;
    }
    outputs.push_back(written[i].second);
    args.push_back(launch_arg(*written_operand[i]));
    pattern += "o" + std::to_string(written[i].second);
    if (!flat) pattern += layout_word(written_operand[i]->arg, cluster.iter_sizes);
  }
  // The rank and which dims are 1 (they broadcast): as the IR's generic key.
  if (!flat)
    for (std::int64_t size : cluster.iter_sizes) pattern += size == 1 ? "#1" : "#n";
  if (outputs.empty()) {  // every result is dead: nothing to run
    stats_.dead_stores_skipped += dead;
    return;
  }
  for (const WindowOperand* in : loaded_operand) args.push_back(launch_arg(*in));

  BackgroundCompiler& builder = background();
  compiler::VtpuKernelFn fn = nullptr;
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(builder.patterns_mutex);
    if (auto it = builder.patterns.find(pattern); it != builder.patterns.end()) {
      fn = it->second.fn;
      known = true;
    } else {
      known = !builder.requested.emplace(pattern, true).second;
    }
  }
  if (!known) {
    // Pass 2, once per pattern: the IR graph of the bindings.
    ir::Graph graph;
    try {
      std::vector<ir::ValueId> input_ids, value_ids;
      for (const WindowOperand* in : loaded_operand)
        input_ids.push_back(graph.add_input(
            flat ? ir::TensorType{in->dtype, sizes, {1}}
                 : ir::TensorType{in->dtype, sizes, std::vector<std::int64_t>(in->arg.strides, in->arg.strides + rank)}));
      for (std::size_t position = 0; position < cluster.ops.size(); ++position) {
        const WindowOp& op = ops_[cluster.ops[position]];
        std::vector<ir::ValueId> ids;
        for (std::size_t k = 0; k < op.inputs.size(); ++k) {
          const Binding& b = bindings[position][k];
          if (b.kind == Binding::kConstant)
            ids.push_back(graph.add_node(ir::OpKind::Constant, {}, {{"value", op.inputs[k].constant}}));
          else
            ids.push_back(b.kind == Binding::kWritten ? value_ids[b.index] : input_ids[b.index]);
        }
        value_ids.push_back(graph.add_node(op.op, ids, op.attrs));
        if (graph.type(value_ids.back()).dtype != op.out.dtype)
          throw runtime::Error(runtime::ErrorKind::kInvalidArgument, "[fused] result dtype differs");
      }
      for (std::size_t position : outputs) graph.mark_output(value_ids[position]);
    } catch (const runtime::Error& e) {
      // The ops keep running on strict's kernels (same results); say so once.
      static std::once_flag warned;
      std::call_once(warned, [&] { std::fprintf(stderr, "vtpu: a fused pattern stays unfused: %s\n", e.what()); });
      std::lock_guard<std::mutex> lock(builder.patterns_mutex);
      builder.patterns[pattern] = PatternState{nullptr, true};  // stays on strict's kernels
      graph = ir::Graph();
    }
    if (!graph.outputs().empty()) {
      builder.submit(pattern, std::move(graph));
      if (compile_in_foreground()) {
        builder.wait_idle();
        std::lock_guard<std::mutex> lock(builder.patterns_mutex);
        fn = builder.patterns[pattern].fn;
      }
    }
  }
  if (fn == nullptr) {
    ++stats_.pattern_misses;
    launch_unfused(cluster);
    return;
  }
  ++stats_.pattern_hits;
  ++stats_.fused_kernels;
  ++stats_.ops_per_kernel[cluster.ops.size()];
  stats_.dead_stores_skipped += dead;
  DeviceContext& context = DeviceContext::get();
  context.metrics().count_kernel();
  count_generated_launches(1);
  context.enqueue_task([fn, rank = static_cast<std::int64_t>(sizes.size()), args = std::move(args),
                        scalars = std::move(scalars)] {
    run_generated_kernel(fn, ir::OpKind::Add, rank, args, scalars);
  }, "fused_kernel");
}

void flush_hook(const char* reason, bool count) { window().flush(reason, count); }

}  // namespace

bool fused_recording_active() {
  DeviceContext& context = DeviceContext::get();
  return context.mode() == Mode::kFused && !context.stream().on_worker_thread();
}

void record_in_window(WindowOp op) {
  static const bool registered = [] {
    DeviceContext::get().set_window_flusher(&flush_hook);
    return true;
  }();
  (void)registered;
  window().record(std::move(op));
}

FusionStats fusion_stats() {
  FusionStats f = window().stats();
  f.background_compiles = background().compiles.load();
  return f;
}

void reset_fusion_stats() {
  window().reset_stats();
  background().compiles = 0;
}

void wait_for_fusion_compiles() { background().wait_idle(); }

}  // namespace vtpu::bridge
