#include "matmul_epilogue.h"

#include <algorithm>
#include <utility>

#include "vtpu/compiler/launch_abi.h"

namespace vtpu::bridge {

MatmulEpilogue::MatmulEpilogue(KernelLaunch launch, std::vector<std::size_t> itemsizes, bool flat,
                               std::int64_t columns)
    : launch_(std::move(launch)), itemsizes_(std::move(itemsizes)), flat_(flat), columns_(columns) {}

void MatmulEpilogue::run_box(const std::int64_t* start, const std::int64_t* sizes) const {
  const std::size_t rank = static_cast<std::size_t>(launch_.rank);
  std::vector<compiler::VtpuTensorArg> tensors = launch_.tensors;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    compiler::VtpuTensorArg& arg = tensors[t];
    std::int64_t offset = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      offset += start[d] * arg.strides[d];
      arg.sizes[d] = sizes[d];
    }
    arg.data = static_cast<char*>(arg.data) + offset * static_cast<std::int64_t>(itemsizes_[t]);
  }
  compiler::VtpuKernelStatus status{};
  // Serial: the block already is one thread's share of the product.
  const compiler::VtpuLaunchArgs args{compiler::kLaunchAbiVersion, static_cast<std::int32_t>(rank),
                                      static_cast<std::int32_t>(tensors.size()), tensors.data(),
                                      launch_.scalars.data(), nullptr, nullptr, &status};
  launch_.fn(&args);
}

void MatmulEpilogue::after_block(int dim, std::int64_t begin, std::int64_t count) const {
  const std::size_t rank = static_cast<std::size_t>(launch_.rank);
  const std::int64_t* full = launch_.tensors.front().sizes;
  std::int64_t start[compiler::kMaxRank] = {};
  std::int64_t sizes[compiler::kMaxRank];
  std::copy(full, full + rank, sizes);
  if (flat_) {  // rows [begin, begin + count) are one range of elements
    start[0] = begin * columns_;
    sizes[0] = count * columns_;
    run_box(start, sizes);
    return;
  }
  if (dim == 1) {  // columns: the last dim, every leading one whole
    start[rank - 1] = begin;
    sizes[rank - 1] = count;
    run_box(start, sizes);
    return;
  }
  // Rows [begin, end) of the leading dims flattened (row-major): the fewest
  // boxes, each whole along the dims inside the one it advances along and a
  // single index along the dims outside it.
  const std::size_t leading = rank - 1;
  std::int64_t inner[compiler::kMaxRank];
  std::int64_t product = 1;
  for (std::size_t d = leading; d-- > 0;) {
    inner[d] = product;
    product *= full[d];
  }
  const std::int64_t end = begin + count;
  for (std::int64_t at = begin; at < end;) {
    std::size_t k = 0;
    while (at % inner[k] != 0 || at + inner[k] > end) ++k;  // inner[leading - 1] == 1 ends it
    const std::int64_t index = (at / inner[k]) % full[k];
    const std::int64_t units = std::min((end - at) / inner[k], full[k] - index);
    for (std::size_t d = 0; d < leading; ++d) {
      if (d < k) {
        start[d] = (at / inner[d]) % full[d];
        sizes[d] = 1;
      } else if (d == k) {
        start[d] = index;
        sizes[d] = units;
      } else {
        start[d] = 0;
        sizes[d] = full[d];
      }
    }
    start[rank - 1] = 0;
    sizes[rank - 1] = full[rank - 1];
    run_box(start, sizes);
    at += units * inner[k];
  }
}

void MatmulEpilogue::after_product() const {
  run_generated_kernel(launch_.fn, ir::OpKind::Add, launch_.rank, launch_.tensors, launch_.scalars);
}

}  // namespace vtpu::bridge
