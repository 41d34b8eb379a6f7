#include "fused_window.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "call_site.h"
#include "device_context.h"
#include "env_knobs.h"
#include "fused_cluster.h"
#include "fused_compiler.h"
#include "vtpu/runtime/error.h"

namespace vtpu::bridge {
namespace {

using fused::Cluster;
using fused::Geometry;
using fused::Use;
using fused::UseMap;
using fused::geometry_of;
using fused::tensor_operands;

// Bounds that keep a fused kernel's source (and its compile) small and a
// window's bookkeeping cheap. Both are program properties: reaching them is
// a deterministic flush point.
constexpr std::size_t kMaxOpsPerCluster = 48;
// Earlier clusters examined for merging into the one an op joins.
constexpr std::size_t kMaxMergeCandidates = 16;
constexpr std::size_t kMaxWindowOps = 1024;
// Elements of the chain kernels held for one stream task (end_chain).
constexpr std::int64_t kHeldElementLimit = std::int64_t{1} << 20;

// How the buffers touched by an op or a cluster (`geometries`, `writes`)
// meet cluster k: whether they share a storage, whether a write is involved
// (then the op cannot move across k), and whether every shared use has the
// same geometry where a write is involved (then the op can join k).
struct Contact {
  bool shares = false;
  bool conflicts = false;
  bool compatible = true;
};

class Window {
 public:
  void record(WindowOp op);
  void record_product(WindowProduct product);
  void flush(const char* reason, bool count);
  void end_chain();
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
  // The first op over the pending product's result gives its cluster the
  // op's iteration space when that flattens to the product's (a linear
  // layer's (batch, sequence, features) over a (batch * sequence, features)
  // product).
  void adopt_product_shape(const WindowOp& op, const std::vector<Geometry>& geometries);
  bool holds_work() const { return !ops_.empty() || product_.has_value(); }
  // Launches the clusters; `hold` keeps their kernels in held_ (end_chain)
  // instead of queueing them.
  void flush_locked(std::vector<WindowOp>& released, bool hold = false);

  std::mutex mutex_;
  std::vector<WindowOp> ops_;
  std::atomic<std::size_t> ops_size_{0};  // ops_.size(), readable before locking
  // Kernels of the chains a compiled program ended since the last flush:
  // queued as one batch at the next flush, which any launch, synchronize,
  // memory release or mode change triggers (the window stays pending), so
  // they keep their place in the stream's order.
  fused::LaunchBatch held_;
  std::vector<Cluster> clusters_;
  // A product waiting for its epilogue: cluster 0 (fused_window.h).
  std::optional<WindowProduct> product_;
  bool product_epilogue_ = true;  // cluster 0 runs as the product's epilogue
  UseMap uses_;
  std::vector<Geometry> scratch_geometries_;  // reused by record()
  std::vector<Contact> scratch_contacts_;     // reused by choose_cluster()
  FusionStats stats_;
};

// A flush hands the window's ops to this per-thread list and drops them
// (their weak references) after unlocking; the two lists trade places, so
// neither gives its capacity back. A full window's list is a few hundred KB,
// and freeing a chunk that size at every flush made glibc consolidate its
// fast bins and trim the heap each time (perf, fused decoding).
std::vector<WindowOp>& released_ops() {
  thread_local std::vector<WindowOp> ops;
  return ops;
}

Window& window() {
  static auto* w = new Window();
  return *w;
}



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

// contact() with every cluster at once, in one pass over the uses of
// `geometries`' storages: `out[k]` for cluster k (default: no contact).
// Asking cluster by cluster scans every use of a widely read buffer (an
// input read by each of hundreds of clusters) once per cluster.
void contacts_by_cluster(const UseMap& uses, const std::vector<Geometry>& geometries, const std::vector<bool>& writes,
                         std::size_t clusters, std::vector<Contact>& out) {
  out.assign(clusters, Contact{});
  for (std::size_t i = 0; i < geometries.size(); ++i) {
    auto found = uses.find(geometries[i].storage);
    if (found == uses.end()) continue;
    for (const Use& use : found->second) {
      Contact& c = out[use.cluster];
      c.shares = true;
      const bool write = writes[i] || use.written;
      c.conflicts = c.conflicts || write;
      if (write && !(use.geometry == geometries[i])) c.compatible = false;
    }
  }
}

bool touches(const UseMap& uses, const void* storage, std::size_t k) {
  auto found = uses.find(storage);
  if (found == uses.end()) return false;
  for (const Use& use : found->second)
    if (use.cluster == k) return true;
  return false;
}

// Whether `arg` (in the reduction's iteration space) is read across rows by
// `reduction`: a row reduction (the trailing dims are reduced) whose tensor
// has unit stride along a kept dim and not along the innermost reduced one,
// as x.t().sum(-1) reads x. (A column reduction, x.sum(0), reads the same
// memory the same way, and the fused kernels walk it in column blocks: it
// fuses.) The single-op reduction kernel
// blocks such inputs (host_codegen_reduction.cpp); the fused reduction
// kernels walk each output's row element by element, one cache line per
// element: a fused (x.t() * 2).sum(-1) of 2048x2048 floats took 8x the
// CPU's time and 8x strict's (found by measuring, 2026-12-07).
bool read_across_rows(const compiler::VtpuTensorArg& arg, const WindowOp& reduction) {
  const std::size_t rank = reduction.iter_sizes.size();
  int reduced = -1, kept = -1, first_reduced = -1;
  for (std::size_t d = 0; d < rank; ++d) {
    if (reduction.iter_sizes[d] == 1) continue;
    if (reduction.out.arg.strides[d] == 0) {
      reduced = static_cast<int>(d);
      if (first_reduced < 0) first_reduced = reduced;
    } else {
      kept = static_cast<int>(d);
    }
  }
  // Rows only: every reduced dim after every kept one. Reductions over outer
  // dims too (batch norm's statistics of a channels-last tensor, over N, H
  // and W) keep fusing as before.
  // A tensor broadcast along the row (stride 0: a keepdim mean added back)
  // is not read across it.
  return first_reduced > kept && kept >= 0 && arg.strides[reduced] != 1 && arg.strides[reduced] != 0 && [&] {
    for (std::size_t d = 0; d < rank; ++d)
      if (reduction.iter_sizes[d] != 1 && reduction.out.arg.strides[d] != 0 && arg.strides[d] == 1) return true;
    return false;
  }();
}

// Whether any tensor `op` reads is read across rows by `reduction`.
bool reads_across_rows(const WindowOp& op, const WindowOp& reduction) {
  for (const WindowOperand& in : op.inputs)
    if (in.is_tensor && !in.zero_dim && read_across_rows(in.arg, reduction)) return true;
  return false;
}

// The reduction rules of joining: a cluster holds at most one reduction,
// and nothing else in it touches the reduction's output (its values exist
// only after whole rows are reduced, while the cluster's other ops run
// element by element). A reduction that would read a tensor of its cluster
// across rows stays alone, as in strict mode: its single-op kernel blocks
// the reads (and an elementwise op before it writes a buffer in tiles).
// Whether `op` reads a 0-dim tensor. The kernel declares it with rank 0 (it
// promotes as a 0-dim tensor), which the fused reduction kernels do not take:
// every input of theirs lies in the reduction's iteration space.
bool reads_zero_dim(const WindowOp& op) {
  for (const WindowOperand& in : op.inputs)
    if (in.is_tensor && in.zero_dim) return true;
  return false;
}

bool cluster_reads_zero_dim(const std::vector<WindowOp>& ops, const Cluster& cluster) {
  for (std::size_t i : cluster.ops)
    if (reads_zero_dim(ops[i])) return true;
  return false;
}

bool reduction_allows(const UseMap& uses, const std::vector<WindowOp>& ops, const Cluster& cluster, std::size_t k,
                      const WindowOp& op, const std::vector<Geometry>& geometries) {
  if (op.reduction && (cluster.reduction_out != nullptr || touches(uses, geometries[0].storage, k))) return false;
  // A 0-dim operand and a reduction never share a kernel (reads_zero_dim):
  // the fused kernel was refused at its build and all the cluster's ops ran
  // unfused (`v = o * h; v - v.mean(0)` with a 0-dim o, found by review).
  if (op.reduction ? cluster_reads_zero_dim(ops, cluster) : cluster.reduction_out != nullptr && reads_zero_dim(op))
    return false;
  if (cluster.reduction_out != nullptr)
    for (const Geometry& g : geometries)
      if (g.storage == cluster.reduction_out) return false;
  if (op.reduction) {
    if (reads_across_rows(op, op)) return false;
    for (std::size_t i : cluster.ops)
      if (reads_across_rows(ops[i], op)) return false;
  } else if (cluster.reduction_out != nullptr) {
    for (std::size_t i : cluster.ops)
      if (ops[i].reduction && (reads_across_rows(ops[i], ops[i]) || reads_across_rows(op, ops[i]))) return false;
  }
  return true;
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
  std::vector<Contact>& op_contacts = scratch_contacts_;
  contacts_by_cluster(uses_, geometries, writes, clusters_.size(), op_contacts);
  std::size_t target = clusters_.size();
  for (std::size_t k : related) {
    const Contact& c = op_contacts[k];
    if (c.compatible && clusters_[k].iter_sizes == op.iter_sizes && clusters_[k].ops.size() < kMaxOpsPerCluster &&
        reduction_allows(uses_, ops_, clusters_[k], k, op, geometries)) {
      // A product's epilogue runs block by block, and a reduction needs
      // whole rows: the product then runs alone, before the cluster, which
      // becomes an ordinary one (RMSNorm's add, pow and mean after a
      // projection stay one kernel that never stores the squares).
      if (product_ && k == 0 && op.reduction) product_epilogue_ = false;
      target = k;
      joins = true;
      break;
    }
    if (c.conflicts) return clusters_.size();
  }
  if (!joins) return target;
  // Merge earlier related clusters into the target, latest first. At most
  // kMaxMergeCandidates are examined: each costs a scan of its buffers' uses,
  // and a buffer read by the whole window (one input normalised a hundred
  // times over) relates every cluster to every op; leaving a cluster unmerged
  // only costs fusion.
  std::size_t examined = 0;
  for (std::size_t r : related) {
    if (r >= target || (product_ && r == 0)) continue;  // the product runs first
    Cluster& candidate = clusters_[r];
    if (candidate.ops.empty() || candidate.iter_sizes != op.iter_sizes ||
        candidate.ops.size() + clusters_[target].ops.size() >= kMaxOpsPerCluster)
      continue;
    if (++examined > kMaxMergeCandidates) break;
    // A reduction stays where it is; and nothing moves in beside the
    // target's reduction (or the op's) that touches its output.
    const void* target_reduction = op.reduction ? geometries[0].storage : clusters_[target].reduction_out;
    if (candidate.reduction_out != nullptr ||
        (target_reduction != nullptr &&
         (std::find(candidate.storages.begin(), candidate.storages.end(), target_reduction) != candidate.storages.end() ||
          cluster_reads_zero_dim(ops_, candidate))))
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
    // op_contacts[r] still holds: merges only move uses into the target.
    if (!contact(uses_, r_geometries, r_writes, target).compatible || !op_contacts[r].compatible) continue;
    // Moving r forward to the target passes the clusters in between that
    // touch its buffers; none may write them or be written by r.
    bool movable = true;
    for (std::size_t i = 0; i < r_geometries.size() && movable; ++i)
      for (const Use& use : uses_.at(r_geometries[i].storage))
        if (use.cluster > r && use.cluster < target && (r_writes[i] || use.written)) {
          movable = false;
          break;
        }
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
  std::vector<WindowOp>& released = released_ops();
  {
    // A full window is flushed under the lock: its tasks' call site is taken
    // before it (capturing may take the GIL). Should another thread fill the
    // window in between, its tasks go without a site rather than risk that.
    std::optional<CallSiteScope> site;
    if (ops_size_.load(std::memory_order_relaxed) >= kMaxWindowOps) site.emplace();
    std::lock_guard<std::mutex> lock(mutex_);
    if (ops_.size() >= kMaxWindowOps) {
      if (!site) site.emplace(CallSite{});
      DeviceContext::get().metrics().count_sync("window_limit");
      flush_locked(released);
    }
    const std::size_t rank = op.iter_sizes.size();
    std::vector<Geometry>& geometries = scratch_geometries_;
    geometries.clear();
    for (const WindowOperand* o : tensor_operands(op)) geometries.push_back(geometry_of(*o, rank));
    if (ops_.empty()) ops_.reserve(kMaxWindowOps);
    if (product_ && clusters_[0].ops.empty() && !op.reduction) adopt_product_shape(op, geometries);
    bool joins = false;
    const std::size_t k = choose_cluster(op, geometries, joins);
    if (!joins) clusters_.push_back(Cluster{op.iter_sizes, {}, {}, nullptr});
    clusters_[k].ops.push_back(ops_.size());
    if (op.reduction) clusters_[k].reduction_out = geometries[0].storage;
    for (std::size_t i = 0; i < geometries.size(); ++i) {
      // One use per (cluster, geometry), written if any op of the cluster
      // writes it: contact() and the flush only ask whether such a use
      // exists and whether it is a write, so repeats add nothing, and
      // without them a buffer read by every op (a shared bias, a reused
      // block) would make each record scan the whole window.
      std::vector<Use>& list = uses_[geometries[i].storage];
      auto same = std::find_if(list.rbegin(), list.rend(),
                               [&](const Use& u) { return u.cluster == k && u.geometry == geometries[i]; });
      if (same != list.rend()) {
        same->written = same->written || i == 0;
        continue;
      }
      // First access a read: an input, or an in-place op's output (it reads
      // the value before writing it).
      const bool read_first =
          i != 0 || std::find(geometries.begin() + 1, geometries.end(), geometries[0]) != geometries.end();
      list.push_back(Use{k, geometries[i], i == 0, read_first});
      clusters_[k].storages.push_back(geometries[i].storage);
    }
    ops_.push_back(std::move(op));
    ops_size_.store(ops_.size(), std::memory_order_relaxed);
    DeviceContext::get().set_window_pending(true);
  }
  released.clear();
}

void Window::record_product(WindowProduct product) {
  std::vector<WindowOp>& released = released_ops();
  {
    const CallSiteScope site;  // before the lock: capturing may take the GIL
    std::lock_guard<std::mutex> lock(mutex_);
    // The caller flushed; work another thread recorded since goes first.
    if (holds_work() || !held_.empty()) flush_locked(released);
    Cluster cluster{{product.rows, product.columns}, {}, {}, nullptr};
    // The result, written by the product, in its own (rows, columns) space.
    uses_[product.out.base].push_back(Use{0, geometry_of(product.out, 2), true, false});
    cluster.storages.push_back(product.out.base);
    // The operands, read with a geometry no op has (no data address): an op
    // of the window writing one conflicts with the product's cluster and is
    // incompatible with it, so it neither joins the epilogue nor moves
    // before the product.
    for (const void* base : product.reads) {
      Geometry operand;
      operand.storage = base;
      uses_[base].push_back(Use{0, operand, false, true});
      cluster.storages.push_back(base);
    }
    clusters_.push_back(std::move(cluster));
    product_ = std::move(product);
    product_epilogue_ = true;
    DeviceContext::get().set_window_pending(true);
  }
  released.clear();
}

void Window::adopt_product_shape(const WindowOp& op, const std::vector<Geometry>& geometries) {
  const WindowOperand& out = product_->out;
  const std::vector<std::int64_t>& sizes = op.iter_sizes;
  if (sizes.size() < 2 || sizes == clusters_[0].iter_sizes || sizes.back() != product_->columns) return;
  std::int64_t rows = 1;
  for (std::size_t d = 0; d + 1 < sizes.size(); ++d) rows *= sizes[d];
  if (rows != product_->rows) return;
  // The op must read the result row-major over its space (a view of the
  // whole result, not a transpose or a part of it).
  for (std::size_t i = 1; i < geometries.size(); ++i) {
    const Geometry& g = geometries[i];
    if (g.storage != out.base || g.data != out.arg.data || g.dtype != out.dtype) continue;
    std::int64_t expected = 1;
    bool row_major = true;
    for (std::size_t d = sizes.size(); d-- > 0;) {
      if (sizes[d] != 1 && g.strides[d] != expected) row_major = false;
      expected *= sizes[d];
    }
    if (!row_major) continue;
    for (Use& use : uses_.at(out.base))
      if (use.cluster == 0 && use.written) use.geometry = g;
    clusters_[0].iter_sizes = sizes;
    return;
  }
}

void Window::flush(const char* reason, bool count) {
  std::vector<WindowOp>& released = released_ops();
  {
    const CallSiteScope site;  // before the lock: capturing may take the GIL
    std::lock_guard<std::mutex> lock(mutex_);
    if (!holds_work() && held_.empty()) return;
    // Counted when recorded ops are flushed; a product waiting alone is just
    // launched, as it would have been at its dispatch.
    if (count && !ops_.empty()) DeviceContext::get().metrics().count_sync(reason);
    flush_locked(released);
  }
  released.clear();
}

// A chain's end: its clusters are final (no later op joins them, so a later
// chain's temporaries on blocks this chain freed do not relate the two, and
// this chain's dropped temporaries are dead stores), but their kernels wait
// in held_ and share one stream task with the chains after them.
void Window::end_chain() {
  std::vector<WindowOp>& released = released_ops();
  {
    const CallSiteScope site;  // before the lock: capturing may take the GIL
    std::lock_guard<std::mutex> lock(mutex_);
    if (!holds_work()) return;
    if (!ops_.empty()) DeviceContext::get().metrics().count_sync("graph_chain");
    flush_locked(released, /*hold=*/true);
  }
  released.clear();
}

void Window::flush_locked(std::vector<WindowOp>& released, bool hold) {
  for (std::size_t k = 0; k < clusters_.size(); ++k) {
    if (product_ && k == 0)
      fused::launch_product_cluster(ops_, clusters_, k, uses_, stats_, held_, *product_, product_epilogue_);
    else if (!clusters_[k].ops.empty())
      fused::launch_cluster(ops_, clusters_, k, uses_, stats_, held_);
  }
  product_.reset();
  // Held kernels go out once there is enough work for a task: the device
  // then runs them while the program records the next chains.
  if (!hold || held_.elements() >= kHeldElementLimit) held_.enqueue();
  released.clear();
  released.swap(ops_);
  ops_size_.store(0, std::memory_order_relaxed);
  clusters_.clear();
  uses_.clear();
  DeviceContext::get().set_window_pending(!held_.empty());
}

void flush_hook(const char* reason, bool count) { window().flush(reason, count); }

}  // namespace

void end_fused_chain() {
  if (fused_recording_active()) window().end_chain();
}

namespace {
// Depth of OpWindow scopes forcing strict mode to record on this thread.
thread_local int op_window_depth = 0;
}  // namespace

bool fused_recording_active() {
  DeviceContext& context = DeviceContext::get();
  const Mode mode = context.mode();
  return (mode == Mode::kFused || (mode == Mode::kStrict && op_window_depth > 0)) &&
         !context.stream().on_worker_thread();
}

OpWindow::OpWindow() {
  DeviceContext& context = DeviceContext::get();
  forced_ = context.mode() == Mode::kStrict && !context.stream().on_worker_thread();
  if (forced_) ++op_window_depth;
}

OpWindow::~OpWindow() {
  if (forced_) --op_window_depth;
}

void OpWindow::flush() {
  // Only the outermost scope queues: a nested one's ops stay with it.
  if (forced_ && op_window_depth == 1) window().flush("op_window", /*count=*/false);
}

namespace {
constexpr std::int64_t kDefaultFusedMinElements = 4096;

std::atomic<std::int64_t>& min_elements() {
  static std::atomic<std::int64_t> bound{env_non_negative("VTPU_FUSED_MIN_ELEMENTS", kDefaultFusedMinElements)};
  return bound;
}
}  // namespace

bool records_in_window(std::int64_t elements) {
  if (!fused_recording_active()) return false;
  return elements >= min_elements().load(std::memory_order_relaxed) || DeviceContext::get().window_pending();
}

std::int64_t fused_min_elements() { return min_elements().load(std::memory_order_relaxed); }

void set_fused_min_elements(std::int64_t elements) {
  if (elements < 0)
    throw runtime::Error(runtime::ErrorKind::kInvalidArgument,
                         "fused_min_elements must be >= 0, got " + std::to_string(elements));
  min_elements().store(elements, std::memory_order_relaxed);
}

bool matmul_epilogues_enabled() {
  static const bool enabled = env_switch("VTPU_MATMUL_EPILOGUES", true);
  return enabled;
}

namespace {
// The window, once the device context knows how to flush it.
Window& recording_window() {
  static const bool registered = [] {
    DeviceContext::get().set_window_flusher(&flush_hook);
    return true;
  }();
  (void)registered;
  return window();
}
}  // namespace

void record_product_in_window(WindowProduct product) { recording_window().record_product(std::move(product)); }

void record_in_window(WindowOp op) { recording_window().record(std::move(op)); }

FusionStats fusion_stats() {
  FusionStats f = window().stats();
  f.background_compiles = fused_compiler().compiles.load();
  return f;
}

void reset_fusion_stats() {
  window().reset_stats();
  fused_compiler().compiles = 0;
}

void wait_for_fusion_compiles() { fused_compiler().wait_idle(); }

}  // namespace vtpu::bridge
