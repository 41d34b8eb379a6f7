#include "fused_cluster.h"
#include "env_knobs.h"

#include <cstdlib>
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "call_site.h"
#include "device_context.h"
#include "fused_compiler.h"
#include "generated_kernels.h"
#include "matmul_epilogue.h"
#include "vtpu/compiler/kernel_provider.h"
#include "vtpu/ir/graph.h"
#include "vtpu/runtime/error.h"

namespace vtpu::bridge::fused {
namespace {

// A fused launch over more elements than this runs alone, parallel inside.
constexpr std::int64_t kBatchedElementLimit = std::int64_t{1} << 20;

void launch_unfused(std::vector<WindowOp>& ops, const Cluster& cluster, FusionStats& stats, LaunchBatch& batch) {
  batch.enqueue();
  DeviceContext& context = DeviceContext::get();
  for (std::size_t i : cluster.ops) {
    WindowOp& op = ops[i];
    context.metrics().count_kernel();
    context.enqueue_task([fn = op.single_op_fn, kind = op.op, rank = op.single_op_rank,
                          tensors = std::move(op.single_op_tensors), scalars = std::move(op.single_op_scalars)] {
      run_generated_kernel(fn, kind, rank, tensors, scalars);
    }, std::string(ir::name(op.op)));
  }
  count_generated_launches(cluster.ops.size());
  stats.unfused_ops += cluster.ops.size();
}

// Whether `arg` covers one gap-free block of memory in the iteration space
// `sizes` (any order of dims: contiguous, channels-last, a permutation).
bool dense_in(const compiler::VtpuTensorArg& arg, const std::vector<std::int64_t>& sizes) {
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;  // (stride, size) of dims that are not 1
  for (std::size_t d = 0; d < sizes.size(); ++d)
    if (sizes[d] != 1) dims.emplace_back(arg.strides[d], sizes[d]);
  std::sort(dims.begin(), dims.end());
  std::int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

bool same_walk(const compiler::VtpuTensorArg& a, const compiler::VtpuTensorArg& b,
               const std::vector<std::int64_t>& sizes) {
  for (std::size_t d = 0; d < sizes.size(); ++d)
    if (sizes[d] != 1 && a.strides[d] != b.strides[d]) return false;
  return true;
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

// A number without temporaries (patterns are spelled at every flush, for
// every cluster); doubles in their shortest exact form, so two attribute
// values never spell the same.
template <typename Number>
void append_number(std::string& out, Number number) {
  char digits[32];
  const auto end = std::to_chars(digits, digits + sizeof digits, number).ptr;
  out.append(digits, end);
}

void append_tagged(std::string& out, char tag, std::uint64_t number) {
  out += tag;
  append_number(out, number);
}

void append_attr_value(std::string& out, const ir::AttrValue& v) {
  std::visit(
      [&](const auto& x) {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<X, std::string>) {
          out += x;
        } else if constexpr (std::is_same_v<X, std::vector<std::int64_t>>) {
          for (std::int64_t i : x) {
            append_number(out, i);
            out += ',';
          }
        } else if constexpr (std::is_same_v<X, ir::DType>) {
          out += ir::name(x);
        } else if constexpr (std::is_same_v<X, bool>) {
          out += x ? '1' : '0';
        } else {
          append_number(out, x);
        }
      },
      v);
}

// What a strided kernel specialises on for one tensor (the IR's generic key:
// contiguous, broadcast with a stride-0 mask, or strided), so a pattern
// serves every shape of its kind, as strict mode's kernels do.
void append_layout_word(std::string& out, const compiler::VtpuTensorArg& arg, const std::vector<std::int64_t>& sizes) {
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
  if (contiguous) out += 'c';
  else if (row_major) append_tagged(out, 'b', broadcast);
  else out += 's';
}

double scalar_of(const ir::AttrValue& v) {
  if (const auto* d = std::get_if<double>(&v)) return *d;
  if (const auto* i = std::get_if<std::int64_t>(&v)) return static_cast<double>(*i);
  if (const auto* b = std::get_if<bool>(&v)) return *b ? 1.0 : 0.0;
  return 0;
}

// Whether another cluster may read what cluster `index` leaves in the memory
// of `mine`: one before it touches the memory (kept, conservatively), or the
// next one after it does, unless that one overwrites the same elements before
// reading any (the allocator handing a dropped temporary's block to a later
// result: its first write makes this cluster's value unreadable).
bool read_elsewhere(const std::vector<Cluster>& clusters, std::size_t index, const UseMap& uses, const Geometry& mine) {
  const std::vector<Use>& list = uses.at(mine.storage);
  std::size_t next = clusters.size();
  for (const Use& use : list)
    if (use.cluster > index) next = std::min(next, use.cluster);
  if (next == clusters.size()) return false;
  bool overwritten = false;
  for (const Use& use : list) {
    if (use.cluster != next) continue;
    if (use.read_first) return true;
    overwritten = overwritten || (use.written && use.geometry == mine &&
                                  clusters[next].iter_sizes == clusters[index].iter_sizes);
  }
  return !overwritten;
}

// A cluster's fused kernel and its launch, ready to queue.
struct PreparedCluster {
  KernelLaunch launch;
  std::int64_t numel = 0;
  bool flat = false;
  std::vector<std::size_t> itemsizes;  // per launch tensor
  std::vector<const void*> reads, writes;
  std::string label;
};

enum class Prepared {
  kReady,       // `out` holds the fused launch (stats counted)
  kNotReady,    // the fused kernel is not built (yet): run the ops unfused
  kNothingToRun  // every result is dead (stats counted)
};

// Binds cluster `index`'s operands, spells its pattern and looks up (or
// requests) its fused kernel. `may_flatten`: a dense cluster may run as one
// flat dim (a product's epilogue run over column blocks needs its dims).
Prepared prepare_cluster(std::vector<WindowOp>& ops, const std::vector<Cluster>& clusters, std::size_t index,
                         const UseMap& uses, FusionStats& stats, bool may_flatten, PreparedCluster& out);

}  // namespace

void launch_cluster(std::vector<WindowOp>& ops, const std::vector<Cluster>& clusters, std::size_t index,
                    const UseMap& uses, FusionStats& stats, LaunchBatch& batch) {
  const Cluster& cluster = clusters[index];
  if (cluster.ops.size() == 1) {
    launch_unfused(ops, cluster, stats, batch);
    return;
  }
  PreparedCluster prepared;
  switch (prepare_cluster(ops, clusters, index, uses, stats, /*may_flatten=*/true, prepared)) {
    case Prepared::kNothingToRun:
      return;
    case Prepared::kNotReady:
      launch_unfused(ops, cluster, stats, batch);
      return;
    case Prepared::kReady:
      break;
  }
  ++stats.fused_kernels;
  ++stats.ops_per_kernel[cluster.ops.size()];
  DeviceContext::get().metrics().count_kernel();
  count_generated_launches(1);
  batch.add(std::move(prepared.launch), prepared.numel, std::move(prepared.reads), std::move(prepared.writes),
            prepared.label);
}

void launch_product_cluster(std::vector<WindowOp>& ops, const std::vector<Cluster>& clusters, std::size_t index,
                            const UseMap& uses, FusionStats& stats, LaunchBatch& batch, WindowProduct& product,
                            bool as_epilogue) {
  batch.enqueue();
  const Cluster& cluster = clusters[index];
  PreparedCluster prepared;
  const Prepared state = cluster.ops.empty() || !as_epilogue
                             ? Prepared::kNothingToRun
                             : prepare_cluster(ops, clusters, index, uses, stats, !product.by_columns, prepared);
  std::shared_ptr<const MatmulEpilogue> epilogue;
  if (state == Prepared::kReady) {
    epilogue = std::make_shared<const MatmulEpilogue>(std::move(prepared.launch), std::move(prepared.itemsizes),
                                                      prepared.flat, product.columns);
    ++stats.matmul_epilogues;
    stats.matmul_epilogue_ops += cluster.ops.size();
    count_generated_launches(1);
  }
  {
    // The product's task names the line that issued it, not the flush's.
    const CallSiteScope site(product.site);
    DeviceContext::get().enqueue_task([run = std::move(product.run), epilogue] { run(epilogue.get()); },
                                      product.name);
  }
  if (state == Prepared::kNotReady) launch_unfused(ops, cluster, stats, batch);
  if (!as_epilogue && !cluster.ops.empty()) launch_cluster(ops, clusters, index, uses, stats, batch);
}

namespace {

Prepared prepare_cluster(std::vector<WindowOp>& ops, const std::vector<Cluster>& clusters, std::size_t index,
                         const UseMap& uses, FusionStats& stats, bool may_flatten, PreparedCluster& out) {
  const Cluster& cluster = clusters[index];
  const std::size_t rank = cluster.iter_sizes.size();
  // Flatten when every tensor covers one dense block and all walk it alike
  // (all contiguous, or all channels-last...): element i of the block is the
  // same element of each, and one kernel serves every rank and layout.
  bool flat = may_flatten && rank >= 1 && cluster.reduction_out == nullptr;  // a reduction keeps its dims
  const compiler::VtpuTensorArg& reference = ops[cluster.ops.front()].out.arg;
  flat = flat && dense_in(reference, cluster.iter_sizes);
  for (std::size_t i : cluster.ops)
    for (const WindowOperand* o : tensor_operands(ops[i]))
      flat = flat && same_walk(o->arg, reference, cluster.iter_sizes);
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
  // The same elements, declared alike (a 0-dim tensor and a 1x1 view of it
  // promote apart).
  auto find_loaded = [&](const Geometry& g, bool zero_dim) -> std::ptrdiff_t {
    for (std::size_t i = 0; i < loaded.size(); ++i)
      if (loaded[i] == g && loaded_operand[i]->zero_dim == zero_dim) return static_cast<std::ptrdiff_t>(i);
    return -1;
  };
  for (std::size_t position = 0; position < cluster.ops.size(); ++position) {
    const WindowOp& op = ops[cluster.ops[position]];
    std::vector<Binding>& b = bindings.emplace_back();
    pattern += ir::name(op.op);
    const char* runtime = ir::runtime_scalar_attribute(op.op);
    for (const auto& [key, value] : op.attrs.entries()) {
      if (runtime != nullptr && key == runtime) continue;
      pattern += ';';
      pattern += key;
      pattern += '=';
      append_attr_value(pattern, value);
    }
    pattern += '(';
    for (const WindowOperand& in : op.inputs) {
      if (!in.is_tensor) {
        b.push_back({Binding::kConstant, 0});
        scalars.push_back(scalar_of(in.constant));
        append_tagged(pattern, 'c', in.constant.index());
        pattern += ',';
        continue;
      }
      const Geometry g = geometry_of(in, rank);
      if (auto w = find(written, g, first); w >= 0) {
        b.push_back({Binding::kWritten, written[static_cast<std::size_t>(w)].second});
        append_tagged(pattern, 'w', written[static_cast<std::size_t>(w)].second);
        pattern += ',';
      } else if (auto l = find_loaded(g, in.zero_dim); l >= 0) {
        b.push_back({Binding::kLoaded, static_cast<std::size_t>(l)});
        append_tagged(pattern, 'l', static_cast<std::size_t>(l));
        pattern += ',';
      } else {
        b.push_back({Binding::kLoaded, loaded.size()});
        append_tagged(pattern, 'l', loaded.size());
        pattern += ':';
        pattern += ir::name(in.dtype);
        if (in.zero_dim) pattern += ":0d";
        pattern += ',';
        if (!flat) append_layout_word(pattern, in.arg, cluster.iter_sizes);
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
    pattern += '|';
  }
  // Outputs: every buffer written, except those nobody can read any more
  // (Python dropped the storage and no other cluster touches the memory).
  std::vector<compiler::VtpuTensorArg> args;
  args.reserve(written.size() + loaded.size());
  std::vector<std::size_t> outputs;  // op positions whose values are stored
  std::uint64_t dead = 0;
  for (std::size_t i = 0; i < written.size(); ++i) {
    const void* storage = written[i].first.storage;
    // A reduction's result is always stored: the fused kernel is built
    // around it.
    const bool dead_store = storage != cluster.reduction_out && written_operand[i]->weak.expired() &&
                            !read_elsewhere(clusters, index, uses, written[i].first);
    if (dead_store) {
      ++dead;
      continue;
    }
    outputs.push_back(written[i].second);
    args.push_back(launch_arg(*written_operand[i]));
    out.itemsizes.push_back(ir::itemsize(written_operand[i]->dtype));
    append_tagged(pattern, 'o', written[i].second);
    if (!flat) append_layout_word(pattern, written_operand[i]->arg, cluster.iter_sizes);
  }
  // The rank and which dims are 1 (they broadcast): as the IR's generic key.
  if (!flat)
    for (std::int64_t size : cluster.iter_sizes) pattern += size == 1 ? "#1" : "#n";
  if (outputs.empty()) {  // every result is dead: nothing to run
    stats.dead_stores_skipped += dead;
    return Prepared::kNothingToRun;
  }
  for (const WindowOperand* in : loaded_operand) {
    args.push_back(launch_arg(*in));
    out.itemsizes.push_back(ir::itemsize(in->dtype));
  }

  BackgroundCompiler& builder = fused_compiler();
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
            in->zero_dim ? ir::TensorType{in->dtype, {}, {}}
            : flat       ? ir::TensorType{in->dtype, sizes, {1}}
                         : ir::TensorType{in->dtype, sizes, std::vector<std::int64_t>(in->arg.strides, in->arg.strides + rank)}));
      for (std::size_t position = 0; position < cluster.ops.size(); ++position) {
        const WindowOp& op = ops[cluster.ops[position]];
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
      if (fused_compile_in_foreground()) {
        builder.wait_idle();
        std::lock_guard<std::mutex> lock(builder.patterns_mutex);
        fn = builder.patterns[pattern].fn;
      }
    }
  }
  if (fn == nullptr) {
    ++stats.pattern_misses;
    return Prepared::kNotReady;
  }
  ++stats.pattern_hits;
  stats.dead_stores_skipped += dead;
  for (const Geometry& g : loaded) out.reads.push_back(g.storage);
  // Only stored buffers: a dead store's block is not touched by this kernel,
  // and a later chain may reuse it in the same batch.
  for (std::size_t i = 0; i < written.size(); ++i)
    if (std::find(outputs.begin(), outputs.end(), written[i].second) != outputs.end())
      out.writes.push_back(written[i].first.storage);
  // VTPU_PROFILE_FUSED_NAMES=1 with per-op timing: device time by fused
  // pattern ("fused[elements]:op,op,...") instead of one "fused_kernel" row.
  static const bool name_patterns = env_switch("VTPU_PROFILE_FUSED_NAMES", false);
  if (name_patterns && DeviceContext::get().metrics().per_op_timing()) {
    out.label = "fused[" + std::to_string(numel) + "]:";
    for (std::size_t position = 0; position < cluster.ops.size() && position < 12; ++position)
      out.label += std::string(ir::name(ops[cluster.ops[position]].op)) + (position + 1 < cluster.ops.size() ? "," : "");
  }
  out.launch = KernelLaunch{fn, static_cast<std::int64_t>(sizes.size()), std::move(args), std::move(scalars)};
  out.numel = numel;
  out.flat = flat;
  return Prepared::kReady;
}

}  // namespace

void LaunchBatch::add(KernelLaunch launch, std::int64_t elements, std::vector<const void*> reads,
                      std::vector<const void*> writes, const std::string& label) {
  auto meets = [](const std::vector<const void*>& a, const std::vector<const void*>& b) {
    for (const void* x : a)
      if (std::find(b.begin(), b.end(), x) != b.end()) return true;
    return false;
  };
  if (meets(writes, reads_) || meets(writes, writes_) || meets(reads, writes_)) enqueue();
  reads_.insert(reads_.end(), reads.begin(), reads.end());
  writes_.insert(writes_.end(), writes.begin(), writes.end());
  if (elements > kBatchedElementLimit) {
    enqueue();
    label_ = label;
    launches_.push_back(std::move(launch));
    enqueue();  // alone: its own parallel_for splits it
    return;
  }
  launches_.push_back(std::move(launch));
  if (!label.empty()) label_ += (label_.empty() ? "" : " | ") + label;
  elements_ += elements;
}

void LaunchBatch::enqueue() {
  if (launches_.empty()) return;
  DeviceContext& context = DeviceContext::get();
  if (launches_.size() == 1) {
    context.enqueue_task([launch = std::move(launches_.front())] {
      run_generated_kernel(launch.fn, ir::OpKind::Add, launch.rank, launch.tensors, launch.scalars);
    }, label_.empty() ? "fused_kernel" : label_);
  } else {
    context.enqueue_task([launches = std::move(launches_)] { run_generated_kernels_batch(launches); },
                         label_.empty() ? "fused_kernel" : label_);
  }
  label_.clear();
  launches_.clear();
  reads_.clear();
  writes_.clear();
  elements_ = 0;
}

}  // namespace vtpu::bridge::fused
