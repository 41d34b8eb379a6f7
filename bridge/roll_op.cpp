// torch.roll as block copies on generated kernels. ATen has no roll for
// other backends, so it ran ATen's CPU kernel on the host-kernel path, 2.5-4x
// the CPU's own time (a 2048x2048 float32 roll: 7.5 ms of device time against
// ~2 ms); Swin-style models roll every block's activations.
//
// A roll along one dim by s (taken modulo the size n) is two block copies:
// the last s slices of the input to the front of the result and the first
// n - s after them. Rolling k dims at once splits every block along each
// dim, 2^k copies, each a generated Cast kernel over strided views (the
// kernel takes any strides), so strict, fused and debug mode run it like any
// other op. The semantics are ATen's: no dims means the flattened tensor,
// shifts and dims pair up, a dim named twice rolls by the sum of its shifts,
// an empty tensor is cloned; the result has the input's suggested memory
// format (ATen's concatenation of the blocks gives that layout) unless a
// named dim's shift is 0.
#include <ATen/ATen.h>
#include <ATen/WrapDimUtils.h>
#include <torch/library.h>

#include <map>
#include <utility>
#include <vector>

#include "aten_bridge.h"
#include "generated_kernels.h"

namespace vtpu::bridge {
namespace {

// dst <- src for two views of equal shape: the generated copy kernel when it
// takes the dtype (and generated kernels are on), ATen's copy_ otherwise.
void copy_block(const at::Tensor& dst, const at::Tensor& src) {
  const auto dtype = to_ir_dtype(dst.scalar_type());
  if (dtype && launch_generated(ir::OpKind::Cast, dst, {src}, {{"dtype", *dtype}})) return;
  dst.copy_(src);
}

at::Tensor roll_blocks(const at::Tensor& self, at::IntArrayRef shifts, at::IntArrayRef dims) {
  TORCH_CHECK(!shifts.empty(), "`shifts` required");
  if (dims.empty()) {
    TORCH_CHECK(shifts.size() == 1, "shifts and dimensions must align. shifts: ", shifts.size(), ", dims:", 0);
    const std::int64_t flat_dim = 0;
    return roll_blocks(self.contiguous().view(self.numel()), shifts, flat_dim).view(self.sizes());
  }
  TORCH_CHECK(shifts.size() == dims.size(), "shifts and dimensions must align. shifts: ", shifts.size(),
              ", dims:", dims.size());
  // An empty tensor is cloned before its dims are looked at, as ATen does.
  if (self.numel() == 0) return self.clone(at::MemoryFormat::Preserve);
  // Per dim, the total shift modulo the size (ATen rolls a named dim again
  // for each time it is named; reduced one by one, the sum cannot
  // overflow). Checked dims raise IndexError for a dim out of range, as
  // ATen's do. ATen concatenates two blocks per named dim, and a shift of
  // 0 makes one of them empty, which makes its result contiguous whatever
  // the input's layout; the result here follows.
  std::map<std::int64_t, std::int64_t> shift_of;
  bool some_shift_is_zero = false;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const std::int64_t dim = at::maybe_wrap_dim(dims[i], self.dim());
    const std::int64_t n = self.size(dim);  // a 0-dim tensor has no dim 0: IndexError, as ATen's
    const std::int64_t s = ((shifts[i] % n) + n) % n;
    some_shift_is_zero = some_shift_is_zero || s == 0;
    shift_of[dim] = (shift_of[dim] + s) % n;
  }
  const at::MemoryFormat format = some_shift_is_zero ? at::MemoryFormat::Contiguous : self.suggest_memory_format();
  at::Tensor result = at::empty(self.sizes(), self.options().memory_format(format));
  std::vector<std::pair<at::Tensor, at::Tensor>> blocks{{result, self}};  // (destination, source)
  for (const auto& [dim, s] : shift_of) {
    const std::int64_t n = self.size(dim);
    if (s == 0) continue;
    std::vector<std::pair<at::Tensor, at::Tensor>> split;
    for (const auto& [dst, src] : blocks) {
      split.emplace_back(dst.narrow(dim, 0, s), src.narrow(dim, n - s, s));
      split.emplace_back(dst.narrow(dim, s, n - s), src.narrow(dim, 0, n - s));
    }
    blocks = std::move(split);
  }
  for (const auto& [dst, src] : blocks) copy_block(dst, src);
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("roll", TORCH_FN(roll_blocks)); }

}  // namespace vtpu::bridge
