// Helpers shared by the bridge's ATen-facing files: making vtpu tensors,
// viewing vtpu memory as CPU tensors for ATen's CPU kernels, and checks.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Allocator.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <string>

namespace vtpu::bridge {

constexpr c10::DeviceType kVtpu = c10::DeviceType::PrivateUse1;

c10::Allocator* device_allocator();
// Whether this process ever asked for device memory (so ever made a vtpu tensor).
bool device_memory_ever_requested();

// A new vtpu tensor; memory comes from the engine's caching allocator.
at::Tensor empty_device(c10::IntArrayRef sizes, c10::ScalarType dtype,
                        std::optional<c10::MemoryFormat> memory_format = std::nullopt);
at::Tensor empty_device_strided(c10::IntArrayRef sizes, c10::IntArrayRef strides,
                                c10::ScalarType dtype);

// A CPU tensor over the same bytes as `device_tensor` (zero-copy): ATen's CPU
// kernels compute directly in device memory. The caller keeps `device_tensor`
// alive for as long as the alias is used.
at::Tensor cpu_alias(const at::Tensor& device_tensor);

// cpu_alias that holds a reference to the device storage for as long as the
// alias (or any view of it) lives: for aliases handed out of the bridge, to
// Python or to a collective's transport, whose lifetimes we do not control.
at::Tensor owning_cpu_alias(const at::Tensor& device_tensor);

// cpu_alias for the device tensors of one op call: tensors over one device
// storage get CPU aliases over one CPU storage, so ATen's overlap checks (an
// out= partly over an input is an error on the CPU) and its same-storage
// tests see what they would see there. Separate cpu_alias calls give
// separate storages, which those checks take for unrelated memory.
class CpuAliases {
 public:
  at::Tensor operator()(const at::Tensor& device_tensor);

 private:
  c10::SmallVector<std::pair<const c10::StorageImpl*, c10::Storage>, 4> storages_;
};

// A tensor operand captured at dispatch for a kernel that runs later on the
// stream: a device tensor's data pointer and geometry (Python may restride
// the tensor meanwhile), or a private copy of a host scalar. The storage is
// not kept alive: a block Python drops returns to the allocator at once and
// is reused only by work queued behind this kernel (stream-ordered reuse, as
// for generated kernels). The CPU alias is built when the kernel runs.
class KernelOperand {
 public:
  static KernelOperand capture(const at::Tensor& t);
  at::Tensor host() const;

 private:
  void* data_ = nullptr;
  std::size_t nbytes_ = 0;
  c10::SmallVector<int64_t, 5> sizes_;
  c10::SmallVector<int64_t, 5> strides_;
  int64_t offset_ = 0;
  caffe2::TypeMeta dtype_;
  bool conj_ = false;
  bool neg_ = false;
  at::Tensor host_copy_;  // set for non-device operands
};

// The device's default generator (Philox: seed + offset).
const at::Generator& default_generator();
// A CPU generator seeded from the vtpu generator's next counter value: the
// host-kernel path hands it to ATen's CPU random kernels, so values depend on
// (seed, op order) only, never on thread timing or mode.
at::Generator host_generator_for(const std::optional<at::Generator>& vtpu_generator);

}  // namespace vtpu::bridge

namespace vtpu::bridge {
// Grows or shrinks a vtpu storage to `new_nbytes`, keeping the common prefix.
// Waits for the stream first: queued kernels may still write the old bytes.
void resize_storage_bytes(const c10::Storage& storage, std::size_t new_nbytes);
}  // namespace vtpu::bridge

namespace vtpu::bridge {
// Test-only (torch_vtpu._C._debug_corrupt_next): the next host-kernel-path
// kernel of `op` ("aten::mm") returns a wrong result; "" disarms.
// Runs an op (its arguments on `stack`) on the host-kernel path, as the
// PrivateUse1 fallback does: for kernels that handle some inputs themselves
// and leave the rest to ATen's CPU kernel.
void run_on_host_kernel_path_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// The same, run at once on a drained stream (the CPU kernel raises at the
// call); `reason` is counted under metrics()["syncs"].
void run_on_host_kernel_path_at_once_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                                           const char* reason);

void debug_corrupt_next(const std::string& op);
}  // namespace vtpu::bridge
