// Times generated elementwise kernels on a target (benchmarks/cuda_target.md
// has the numbers): one fused kernel of y = gelu(x) * s + r and one add,
// over N float32 elements, as bytes moved per second. Usage:
//   vtpu_target_bench [cuda|host] [elements]
// The host target launches serially (one thread): its figure is a floor, not
// the runtime's multi-threaded speed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "vtpu/compiler/host_codegen.h"
#include "vtpu/runtime/error.h"
#include "vtpu/targets/target.h"

namespace {

using vtpu::ir::DType;
using vtpu::ir::OpKind;
using vtpu::ir::TensorType;

struct Workload {
  const char* name;
  vtpu::ir::Graph graph;
  int bytes_per_element;  // read + written
};

std::vector<Workload> workloads(std::int64_t n) {
  const auto t = TensorType::contiguous(DType::kFloat32, {n});
  std::vector<Workload> all;
  {
    vtpu::ir::Graph g;
    const auto x = g.add_input(t), s = g.add_input(t), r = g.add_input(t);
    g.mark_output(g.add_node(OpKind::Add, {g.add_node(OpKind::Mul, {g.add_node(OpKind::Gelu, {x}), s}), r}));
    all.push_back({"gelu(x)*s+r, one fused kernel", std::move(g), 16});
  }
  all.push_back({"x+y", vtpu::ir::single_op(OpKind::Add, {t, t}), 12});
  return all;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "cuda";
  const std::int64_t n = argc > 2 ? std::atoll(argv[2]) : (std::int64_t{1} << 26);
  std::string why;
  std::unique_ptr<vtpu::targets::Target> target = vtpu::targets::make_target(name, &why);
  if (target == nullptr) {
    std::fprintf(stderr, "target %s unavailable: %s\n", name.c_str(), why.c_str());
    return 2;
  }
  try {
    std::printf("target %s: %s\n", name.c_str(), target->description().c_str());
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
    std::vector<float> host(static_cast<std::size_t>(n));
    for (auto& v : host) v = dist(rng);
    const std::size_t bytes = host.size() * sizeof(float);
    for (Workload& w : workloads(n)) {
      const auto compile_start = std::chrono::steady_clock::now();
      const auto kernel = target->compile(w.graph);
      const double compile_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - compile_start).count();
      const int tensors = static_cast<int>(w.graph.inputs().size() + w.graph.outputs().size());
      std::vector<void*> memory;
      std::vector<vtpu::compiler::VtpuTensorArg> args;
      for (int i = 0; i < tensors; ++i) {
        memory.push_back(target->allocate(bytes));
        target->copy_from_host(memory.back(), host.data(), bytes);
        vtpu::compiler::VtpuTensorArg arg{};
        arg.data = memory.back();
        arg.sizes[0] = n;
        arg.strides[0] = 1;
        args.push_back(arg);
      }
      const std::vector<double> scalars = vtpu::compiler::launch_scalars(w.graph);
      for (int i = 0; i < 3; ++i) target->launch(*kernel, args, 1, scalars);
      target->synchronize();
      std::vector<double> per_launch;
      constexpr int kLaunches = 20;
      for (int round = 0; round < 7; ++round) {
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < kLaunches; ++i) target->launch(*kernel, args, 1, scalars);
        target->synchronize();
        per_launch.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
                             kLaunches);
      }
      const double t = median(per_launch);
      std::printf("%-32s n=%lld  compile %.2f s  median %.3f ms  %.1f GB/s\n", w.name, static_cast<long long>(n),
                  compile_s, t * 1e3, static_cast<double>(w.bytes_per_element) * static_cast<double>(n) / t / 1e9);
      for (void* m : memory) target->release(m);
    }
  } catch (const vtpu::runtime::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
