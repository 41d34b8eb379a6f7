// Generated indexing and source kernels (host_codegen_indexing.cpp) against
// the reference interpreter: every op over dtypes, index dtypes, strided and
// zero-size operands; accumulations bitwise the same serial and threaded;
// out-of-range indices reported through the status record and skipped
// without writing outside the output (guard bytes around it stay intact).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernel_test_support.h"
#include "test_kernel_cache.h"
#include "vtpu/compiler/host_codegen.h"
#include "vtpu/compiler/kernel_library.h"
#include "vtpu/compiler/launch_abi.h"
#include "vtpu/compiler/system_compiler.h"
#include "vtpu/ir/interpreter.h"
#include "vtpu/runtime/error.h"

namespace vtpu::compiler {
namespace {

using testing::kGuard;
using testing::kGuardByte;
using testing::Output;
using testing::launch_outputs;
using testing::split_launches;
using testing::tensor_arg;
using testing::threaded_for;

using ir::Attributes;
using ir::DType;
using ir::OpKind;
using ir::TensorType;


TensorType dense(DType dtype, std::vector<std::int64_t> sizes) { return TensorType::contiguous(dtype, std::move(sizes)); }
TensorType strided(DType dtype, std::vector<std::int64_t> sizes, std::vector<std::int64_t> strides) {
  return TensorType{dtype, std::move(sizes), std::move(strides)};
}

// Data in [-3, 3] (integers in [-9, 9]) over the whole strided extent.
ir::Buffer random_data(const TensorType& type, std::mt19937& rng) {
  ir::Buffer buffer = ir::Buffer::zeros(type);
  const std::int64_t extent = type.storage_extent();
  std::vector<double> values(static_cast<std::size_t>(extent));
  std::uniform_real_distribution<double> real(-3.0, 3.0);
  std::uniform_int_distribution<int> integer(-9, 9);
  for (auto& v : values) v = ir::is_floating(type.dtype) ? real(rng) : integer(rng);
  if (type.dtype == DType::kBool)
    for (auto& v : values) v = integer(rng) & 1;
  const ir::Buffer flat = ir::make_buffer(type.dtype, {extent}, values);
  std::memcpy(buffer.bytes.data(), flat.bytes.data(), flat.bytes.size());
  return buffer;
}

// Indices in [0, bound) over the whole strided extent (so duplicates when the
// index is longer than bound).
ir::Buffer random_index(const TensorType& type, std::int64_t bound, std::mt19937& rng) {
  const std::int64_t extent = type.storage_extent();
  std::vector<std::int64_t> values(static_cast<std::size_t>(extent));
  std::uniform_int_distribution<std::int64_t> pick(0, std::max<std::int64_t>(bound - 1, 0));
  for (auto& v : values) v = pick(rng);
  ir::Buffer buffer = ir::Buffer::zeros(type);
  const ir::Buffer flat = ir::make_int_buffer(type.dtype, {extent}, values);
  std::memcpy(buffer.bytes.data(), flat.bytes.data(), flat.bytes.size());
  return buffer;
}

// Writes `value` at logical element `linear` of an index buffer.
void set_index(ir::Buffer& b, std::int64_t linear, std::int64_t value) {
  std::int64_t off = 0, rest = linear;
  for (std::size_t d = b.type.sizes.size(); d-- > 0;) {
    off += (rest % b.type.sizes[d]) * b.type.strides[d];
    rest /= b.type.sizes[d];
  }
  if (b.type.dtype == DType::kInt64) std::memcpy(b.bytes.data() + off * 8, &value, 8);
  else {
    const auto v = static_cast<std::int32_t>(value);
    std::memcpy(b.bytes.data() + off * 4, &v, 4);
  }
}

struct Case {
  std::string symbol;
  ir::Graph graph;
  std::vector<ir::Buffer> inputs;
  std::vector<double> scalars;
};



class HostCodegenIndexing : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    std::vector<GeneratedKernel> kernels;
    for (const auto& c : cases()) kernels.push_back(generate_host_kernel(c.graph, c.symbol));
    library() = std::make_unique<KernelLibrary>(KernelLibrary::load(testing::compile_once(host_translation_unit(kernels))));
  }
  static void TearDownTestSuite() { library().reset(); }
  static std::unique_ptr<KernelLibrary>& library() {
    static std::unique_ptr<KernelLibrary> lib;
    return lib;
  }
  static std::vector<Case>& cases();
  // The case named `name` (symbols are "ix<n>_<name>").
  static const Case& find(const std::string& name) {
    for (const auto& c : cases()) {
      const std::string suffix = "_" + name;
      if (c.symbol.size() > suffix.size() && c.symbol.compare(c.symbol.size() - suffix.size(), suffix.size(), suffix) == 0)
        return c;
    }
    throw std::runtime_error("no case " + name);
  }

  // Launches the case with `inputs` (the case's own when empty); the output
  // starts as `fill` bytes.
  // The output is the graph's (contiguous) type unless `out_type` is given.
  static Output launch(const Case& c, VtpuParallelFor parallel_for, VtpuKernelStatus* status,
                       std::uint8_t fill = 0, std::vector<ir::Buffer> inputs = {},
                       const TensorType* out_type = nullptr) {
    if (inputs.empty()) inputs = c.inputs;
    Output out;
    out.type = out_type != nullptr ? *out_type : c.graph.type(c.graph.outputs()[0]);
    out.storage.assign(static_cast<std::size_t>(out.type.storage_extent() * ir::itemsize(out.type.dtype)) + 2 * kGuard,
                       fill);
    std::fill(out.storage.begin(), out.storage.begin() + kGuard, kGuardByte);
    std::fill(out.storage.end() - kGuard, out.storage.end(), kGuardByte);
    std::vector<VtpuTensorArg> args{tensor_arg(out.data(), out.type)};
    for (auto& b : inputs) args.push_back(tensor_arg(b.bytes.data(), b.type));
    VtpuLaunchArgs launch_args{kLaunchAbiVersion, static_cast<std::int32_t>(out.type.rank()),
                               static_cast<std::int32_t>(args.size()), args.data(), c.scalars.data(),
                               parallel_for, nullptr, status};
    library()->get(c.symbol)(&launch_args);
    return out;
  }
};

Attributes dim(std::int64_t d) { return {{"dim", d}}; }

std::vector<Case>& HostCodegenIndexing::cases() {
  static std::vector<Case> all = [] {
    std::vector<Case> cs;
    std::mt19937 rng(11);
    // Inputs: data operands random; index operand (position 1) in [0, bound).
    auto add = [&](const std::string& name, OpKind op, std::vector<TensorType> types, Attributes attrs,
                   std::int64_t bound) {
      Case c;
      c.symbol = "ix" + std::to_string(cs.size()) + "_" + name;
      c.graph = ir::single_op(op, types, attrs);
      for (std::size_t k = 0; k < types.size(); ++k)
        c.inputs.push_back(k == 1 ? random_index(types[k], bound, rng) : random_data(types[k], rng));
      cs.push_back(std::move(c));
    };
    const DType f32 = DType::kFloat32, bf16 = DType::kBFloat16, i64 = DType::kInt64, i32 = DType::kInt32;

    add("isel_f32", OpKind::IndexSelect, {dense(f32, {6, 5, 4}), dense(i64, {7})}, dim(1), 5);
    add("isel_bf16_i32", OpKind::IndexSelect, {dense(bf16, {8, 3}), dense(i32, {10})}, dim(0), 8);
    add("isel_i64_strided", OpKind::IndexSelect, {strided(i64, {4, 6}, {1, 4}), strided(i64, {5}, {2})}, dim(-1), 6);
    add("isel_inner_strided", OpKind::IndexSelect, {strided(f32, {5, 3, 4}, {1, 20, 5}), dense(i64, {6})}, dim(0), 5);
    add("isel_empty_x", OpKind::IndexSelect, {dense(f32, {0, 3}), dense(i64, {2})}, dim(1), 3);
    add("isel_empty_index", OpKind::IndexSelect, {dense(f32, {3, 4}), dense(i32, {0})}, dim(0), 3);
    add("isel_rank0", OpKind::IndexSelect, {dense(f32, {}), dense(i64, {1})}, dim(0), 1);
    add("isel_large", OpKind::IndexSelect, {dense(f32, {300, 64}), dense(i64, {2000})}, dim(0), 300);

    add("emb_f32", OpKind::Embedding, {dense(f32, {10, 16}), dense(i64, {3, 5})}, {}, 10);
    add("emb_bf16_i32", OpKind::Embedding, {dense(bf16, {9, 7}), dense(i32, {11})}, {}, 9);
    add("emb_strided", OpKind::Embedding, {strided(f32, {6, 5}, {1, 6}), strided(i64, {4, 3}, {1, 4})}, {}, 6);
    add("emb_rank0_index", OpKind::Embedding, {dense(i64, {5, 4}), dense(i64, {})}, {}, 5);
    add("emb_empty", OpKind::Embedding, {dense(f32, {5, 4}), dense(i64, {0, 2})}, {}, 5);
    add("emb_large", OpKind::Embedding, {dense(f32, {1000, 32}), dense(i64, {4096})}, {}, 1000);

    add("gather_f32_d1", OpKind::Gather, {dense(f32, {5, 6}), dense(i64, {5, 4})}, dim(1), 6);
    add("gather_f32_d0", OpKind::Gather, {dense(f32, {5, 6}), dense(i64, {3, 6})}, dim(0), 5);
    add("gather_i64_strided", OpKind::Gather, {strided(i64, {4, 5, 3}, {1, 12, 4}), strided(i64, {2, 7, 3}, {42, 6, 2})},
        dim(1), 5);
    add("gather_bf16_small", OpKind::Gather, {dense(bf16, {6, 8}), dense(i64, {4, 3})}, dim(-1), 8);
    add("gather_empty", OpKind::Gather, {dense(f32, {4, 3}), dense(i64, {0, 3})}, dim(0), 4);
    add("gather_large", OpKind::Gather, {dense(f32, {128, 1000}), dense(i64, {128, 300})}, dim(1), 1000);

    auto eb = [](std::int64_t n, std::int64_t pad, bool freq) {
      return Attributes{{"num_weights", n}, {"padding_idx", pad}, {"scale_grad_by_freq", freq}};
    };
    add("embb_f32", OpKind::EmbeddingBackward, {dense(f32, {4, 6, 8}), dense(i64, {4, 6})}, eb(10, -1, false), 10);
    add("embb_pad_freq", OpKind::EmbeddingBackward, {dense(f32, {30, 5}), dense(i64, {30})}, eb(7, 3, true), 7);
    add("embb_bf16_i32", OpKind::EmbeddingBackward, {dense(bf16, {20, 12}), dense(i32, {20})}, eb(6, 0, true), 6);
    add("embb_strided", OpKind::EmbeddingBackward, {strided(f32, {9, 4}, {1, 9}), strided(i64, {9}, {3})},
        eb(4, -1, false), 4);
    add("embb_empty_index", OpKind::EmbeddingBackward, {dense(f32, {0, 4}), dense(i64, {0})}, eb(5, -1, true), 5);
    add("embb_large", OpKind::EmbeddingBackward, {dense(f32, {5000, 16}), dense(i64, {5000})}, eb(50, 2, true), 50);
    add("embb_wide", OpKind::EmbeddingBackward, {dense(f32, {64, 600}), dense(i64, {64})}, eb(8, -1, false), 8);

    add("iadd_f32", OpKind::IndexAdd, {dense(f32, {6, 5}), dense(i64, {8}), dense(f32, {8, 5})}, dim(0), 6);
    Attributes alpha = dim(1);
    alpha.set("alpha", 2.5);
    add("iadd_alpha_i32", OpKind::IndexAdd, {dense(f32, {3, 4, 5}), dense(i32, {9}), dense(f32, {3, 9, 5})}, alpha, 4);
    Attributes int_alpha = dim(0);
    int_alpha.set("alpha", std::int64_t{3});
    add("iadd_i64", OpKind::IndexAdd, {dense(i64, {5, 3}), dense(i64, {12}), dense(i64, {12, 3})}, int_alpha, 5);
    add("iadd_bf16", OpKind::IndexAdd, {dense(bf16, {4, 6}), dense(i64, {10}), dense(bf16, {4, 10})}, dim(-1), 6);
    add("iadd_strided", OpKind::IndexAdd,
        {strided(f32, {4, 6}, {1, 4}), strided(i64, {7}, {2}), strided(f32, {7, 6}, {1, 7})}, dim(0), 4);
    add("iadd_empty", OpKind::IndexAdd, {dense(f32, {4, 0}), dense(i64, {3}), dense(f32, {3, 0})}, dim(0), 4);
    add("iadd_large", OpKind::IndexAdd, {dense(f32, {100, 128}), dense(i64, {3000}), dense(f32, {3000, 128})}, dim(0), 100);

    add("sadd_f32_d1", OpKind::ScatterAdd, {dense(f32, {5, 7}), dense(i64, {4, 10}), dense(f32, {5, 12})}, dim(1), 7);
    add("sadd_f32_d0", OpKind::ScatterAdd, {dense(f32, {5, 7}), dense(i64, {9, 6}), dense(f32, {9, 7})}, dim(0), 5);
    add("sadd_i64", OpKind::ScatterAdd, {dense(i64, {3, 4, 5}), dense(i64, {3, 8, 5}), dense(i64, {3, 8, 5})}, dim(1), 4);
    add("sadd_bf16", OpKind::ScatterAdd, {dense(bf16, {6, 4}), dense(i64, {6, 9}), dense(bf16, {6, 9})}, dim(-1), 4);
    add("sadd_strided", OpKind::ScatterAdd,
        {strided(f32, {4, 6}, {1, 4}), strided(i64, {3, 8}, {16, 2}), strided(f32, {4, 8}, {1, 4})}, dim(1), 6);
    add("sadd_empty_index", OpKind::ScatterAdd, {dense(f32, {3, 4}), dense(i64, {0, 4}), dense(f32, {2, 4})}, dim(0), 3);
    add("sadd_long_line", OpKind::ScatterAdd, {dense(f32, {3, 3000}), dense(i64, {3, 5000}), dense(f32, {3, 5000})},
        dim(1), 3000);
    // dim != last: blocks of neighbouring lines, partial blocks, lines
    // partly outside the index, long lines (heap accumulator), strided.
    add("sadd_blocks", OpKind::ScatterAdd, {dense(f32, {50, 40}), dense(i64, {300, 37}), dense(f32, {300, 40})}, dim(0),
        50);
    add("sadd_blocks_long", OpKind::ScatterAdd, {dense(f32, {3000, 20}), dense(i64, {4000, 20}),
                                                 dense(f32, {4000, 20})}, dim(0), 3000);
    add("sadd_blocks_strided", OpKind::ScatterAdd,
        {strided(f32, {6, 4, 5}, {1, 30, 6}), strided(i64, {9, 3, 5}, {1, 45, 9}), dense(f32, {9, 4, 5})}, dim(0), 6);
    add("sadd_large", OpKind::ScatterAdd, {dense(f32, {64, 512}), dense(i64, {64, 1024}), dense(f32, {64, 1024})}, dim(1),
        512);

    // Sources: operands are graph inputs (0-dim tensors) or Constants (scalars).
    auto fill_attrs = [](DType dt, std::vector<std::int64_t> sizes) {
      return Attributes{{"dtype", dt}, {"sizes", std::move(sizes)}};
    };
    auto arange_attrs = [](DType dt, std::int64_t size) { return Attributes{{"dtype", dt}, {"size", size}}; };
    auto add_source = [&](const std::string& name, OpKind op, Attributes attrs, std::vector<ir::Buffer> values,
                          std::vector<double> constants) {
      Case c;
      c.symbol = "ix" + std::to_string(cs.size()) + "_" + name;
      std::vector<ir::ValueId> operands;
      for (auto& v : values) operands.push_back(c.graph.add_input(v.type));
      for (double k : constants) operands.push_back(c.graph.add_node(OpKind::Constant, {}, {{"value", k}}));
      c.graph.mark_output(c.graph.add_node(op, operands, attrs));
      c.inputs = std::move(values);
      c.scalars = std::move(constants);
      cs.push_back(std::move(c));
    };
    auto scalar = [](DType dt, double v) { return ir::make_buffer(dt, {}, {v}); };
    add_source("fill_f32", OpKind::Fill, fill_attrs(f32, {3, 4}), {scalar(DType::kFloat64, 1.25)}, {});
    add_source("fill_i32_from_f32", OpKind::Fill, fill_attrs(i32, {5}), {scalar(f32, -2.75)}, {});
    add_source("fill_bf16_const", OpKind::Fill, fill_attrs(bf16, {2, 3, 4}), {}, {3.14159});
    add_source("fill_bool", OpKind::Fill, fill_attrs(DType::kBool, {7}), {scalar(i64, 4)}, {});
    add_source("fill_empty", OpKind::Fill, fill_attrs(f32, {0, 5}), {scalar(f32, 1.0)}, {});
    add_source("fill_large", OpKind::Fill, fill_attrs(f32, {300, 400}), {scalar(f32, -0.5)}, {});
    add_source("arange_f32", OpKind::Arange, arange_attrs(f32, 100), {scalar(f32, -1.5), scalar(f32, 0.1)}, {});
    add_source("arange_i64", OpKind::Arange, arange_attrs(i64, 50), {scalar(i64, -3), scalar(i64, 7)}, {});
    add_source("arange_const", OpKind::Arange, arange_attrs(DType::kFloat64, 40), {}, {0.5, 0.25});
    add_source("arange_bf16", OpKind::Arange, arange_attrs(bf16, 64), {scalar(bf16, 2.0), scalar(bf16, 0.5)}, {});
    add_source("arange_empty", OpKind::Arange, arange_attrs(i32, 0), {scalar(i32, 0), scalar(i32, 1)}, {});
    add_source("arange_large", OpKind::Arange, arange_attrs(f32, 100000), {scalar(f32, 0.0), scalar(f32, 0.001)}, {});
    // Constants are scalars in node order: here step's node comes first.
    {
      Case c;
      c.symbol = "ix" + std::to_string(cs.size()) + "_arange_const_node_order";
      const auto step = c.graph.add_node(OpKind::Constant, {}, {{"value", 0.75}});
      const auto start = c.graph.add_node(OpKind::Constant, {}, {{"value", -2.0}});
      c.graph.mark_output(c.graph.add_node(OpKind::Arange, {start, step}, arange_attrs(f32, 9)));
      c.scalars = {0.75, -2.0};
      cs.push_back(std::move(c));
    }
    return cs;
  }();
  return all;
}

bool accumulates(OpKind op) {
  return op == OpKind::EmbeddingBackward || op == OpKind::IndexAdd || op == OpKind::ScatterAdd;
}

TEST_F(HostCodegenIndexing, EveryKernelMatchesTheInterpreterBitwise) {
  for (const auto& c : cases()) {
    VtpuKernelStatus status{};
    const Output got = launch(c, nullptr, &status);
    const auto expected = ir::interpret(c.graph, c.inputs);
    EXPECT_EQ(status.code, kVtpuOk) << c.symbol;
    EXPECT_TRUE(got.guards_intact()) << c.symbol;
    ASSERT_EQ(got.size(), expected[0].bytes.size()) << c.symbol;
    EXPECT_EQ(got.bytes(), expected[0].bytes) << c.symbol;
  }
}

TEST_F(HostCodegenIndexing, ThreadedLaunchIsBitwiseTheSerialOne) {
  int accumulating = 0;
  split_launches() = 0;
  for (const auto& c : cases()) {
    const Output serial = launch(c, nullptr, nullptr);
    const Output threaded = launch(c, &threaded_for, nullptr);
    EXPECT_EQ(serial.bytes(), threaded.bytes()) << c.symbol;
    accumulating += accumulates(c.graph.node(c.graph.outputs()[0]).op);
  }
  EXPECT_GE(accumulating, 15);
  // The large cases really ran on several threads.
  EXPECT_GE(split_launches().load(), 8);
}

// Outputs may have any strides: column-major outputs hold the same values.
TEST_F(HostCodegenIndexing, StridedOutputsHoldTheSameValues) {
  for (const std::string name : {"isel_f32", "isel_i64_strided", "emb_f32", "gather_f32_d1", "embb_pad_freq",
                                 "iadd_alpha_i32", "sadd_f32_d0", "sadd_f32_d1", "fill_bf16_const"}) {
    const Case& c = find(name);
    TensorType t = c.graph.type(c.graph.outputs()[0]);
    std::int64_t stride = 1;
    for (std::size_t d = 0; d < t.sizes.size(); ++d) {
      t.strides[d] = stride;
      stride *= t.sizes[d];
    }
    Output got = launch(c, &threaded_for, nullptr, 0, {}, &t);
    EXPECT_TRUE(got.guards_intact()) << name;
    const ir::Buffer as_buffer{t, got.bytes()};
    EXPECT_EQ(ir::to_doubles(as_buffer), ir::to_doubles(ir::interpret(c.graph, c.inputs)[0])) << name;
  }
}

// Duplicates really occur in the accumulating cases (else the ownership
// scheme would be untested): index_add's large case has 3000 indices over 100 rows.
TEST_F(HostCodegenIndexing, AccumulationSumsDuplicates) {
  const Case& c = find("iadd_large");
  const auto ix = ir::to_int64s(c.inputs[1]);
  std::vector<int> seen(100, 0);
  for (auto v : ix) ++seen[static_cast<std::size_t>(v)];
  EXPECT_GT(*std::max_element(seen.begin(), seen.end()), 1);
  // out = self + sum: row 0 differs from self's row 0 when it was hit.
  const Output got = launch(c, &threaded_for, nullptr);
  const auto out = ir::to_doubles(ir::interpret(c.graph, c.inputs)[0]);
  std::vector<float> got_f(static_cast<std::size_t>(got.size() / 4));
  std::memcpy(got_f.data(), got.bytes().data(), got.size());
  for (std::size_t i = 0; i < got_f.size(); ++i) ASSERT_EQ(static_cast<double>(got_f[i]), out[i]) << i;
}

struct BadIndex {
  std::string symbol;
  std::int64_t position;  // logical element of the index operand
  std::int64_t value;
  std::int64_t bound;
  std::int64_t dim;
};

TEST_F(HostCodegenIndexing, OutOfRangeIndexIsReportedAndSkipped) {
  const std::vector<BadIndex> bad = {
      {"isel_f32", 3, 5, 5, 1},          {"isel_bf16_i32", 0, -1, 8, 0},
      {"isel_i64_strided", 4, 100, 6, 1}, {"emb_f32", 7, 10, 10, 0},
      {"emb_bf16_i32", 10, -7, 9, 0},     {"gather_f32_d1", 9, 6, 6, 1},
      {"gather_f32_d0", 17, -2, 5, 0},   {"embb_f32", 13, 10, 10, 0},
      {"embb_bf16_i32", 5, -1, 6, 0},    {"iadd_f32", 2, 6, 6, 0},
      {"iadd_alpha_i32", 8, -4, 4, 1},   {"sadd_f32_d1", 21, 7, 7, 1},
      {"sadd_f32_d0", 0, 5, 5, 0},       {"sadd_i64", 50, -9, 4, 1},
      {"sadd_strided", 5, 1000000, 6, 1},     {"sadd_blocks", 300 * 37 - 1, 50, 50, 0},
      {"sadd_blocks_strided", 77, -1, 6, 0},  {"gather_i64_strided", 40, 5, 5, 1},
  };
  for (const auto& b : bad) {
    const Case& c = find(b.symbol);
    std::vector<ir::Buffer> inputs = c.inputs;
    set_index(inputs[1], b.position, b.value);
    // The interpreter rejects it too.
    EXPECT_THROW(ir::interpret(c.graph, inputs), runtime::Error) << b.symbol;
    for (VtpuParallelFor pf : {static_cast<VtpuParallelFor>(nullptr), &threaded_for}) {
      VtpuKernelStatus status{};
      const Output got = launch(c, pf, &status, 0x11, inputs);
      EXPECT_TRUE(got.guards_intact()) << b.symbol;
      EXPECT_EQ(status.code, kVtpuIndexOutOfRange) << b.symbol;
      EXPECT_EQ(status.operand, 1) << b.symbol;
      EXPECT_EQ(status.value, b.value) << b.symbol;
      EXPECT_EQ(status.bound, b.bound) << b.symbol;
      EXPECT_EQ(status.dim, b.dim) << b.symbol;
      // Without a status record the bad element is still skipped safely.
      EXPECT_TRUE(launch(c, pf, nullptr, 0x11, inputs).guards_intact()) << b.symbol;
    }
  }
}

// Serially, the first bad index in iteration order is the one reported, and
// the copies leave a skipped element's output as it was.
TEST_F(HostCodegenIndexing, FirstBadIndexWinsAndSkippedRowsAreUntouched) {
  const Case& c = find("emb_f32");  // weight [10, 16], indices [3, 5]
  std::vector<ir::Buffer> inputs = c.inputs;
  set_index(inputs[1], 4, 12);
  set_index(inputs[1], 9, -3);
  VtpuKernelStatus status{};
  const Output got = launch(c, nullptr, &status, 0x11, inputs);
  EXPECT_EQ(status.code, kVtpuIndexOutOfRange);
  EXPECT_EQ(status.value, 12);
  const auto bytes = got.bytes();
  for (std::int64_t row : {4, 9})
    for (std::size_t i = 0; i < 16 * 4; ++i) ASSERT_EQ(bytes[static_cast<std::size_t>(row) * 64 + i], 0x11) << row;
  // Another row was written.
  const auto w = ir::to_doubles(inputs[0]);
  const auto ix = ir::to_int64s(inputs[1]);
  float first;
  std::memcpy(&first, bytes.data(), 4);
  EXPECT_EQ(static_cast<double>(first), w[static_cast<std::size_t>(ix[0] * 16)]);
}

TEST(HostCodegenIndexingErrors, MoreThanOneOpIsRefusedByName) {
  ir::Graph g;
  const auto x = g.add_input(dense(DType::kFloat32, {4, 3}));
  const auto i = g.add_input(dense(DType::kInt64, {2}));
  g.mark_output(g.add_node(OpKind::Neg, {g.add_node(OpKind::IndexSelect, {x, i}, dim(0))}));
  try {
    generate_host_kernel(g, "k");
    FAIL() << "expected an error";
  } catch (const runtime::Error& e) {
    EXPECT_EQ(e.kind(), runtime::ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("index_select"), std::string::npos) << e.what();
  }
}

TEST(HostCodegenIndexingErrors, SupportsTheIndexingOps) {
  for (OpKind op : {OpKind::IndexSelect, OpKind::Embedding, OpKind::Gather, OpKind::EmbeddingBackward,
                    OpKind::IndexAdd, OpKind::ScatterAdd, OpKind::Fill, OpKind::Arange})
    EXPECT_TRUE(host_codegen_supports(op)) << ir::name(op);
}

}  // namespace
}  // namespace vtpu::compiler
