// The minimal op set implemented natively for PrivateUse1: allocation,
// views, resize, copies across the device boundary, scalar reads, set_, fill_
// and zero_. Everything else reaches the host-kernel path (host_kernel_path.cpp).
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/StorageImpl.h>
#include <torch/library.h>

#include "aten_bridge.h"
#include "device_context.h"
#include "generated_lowering.h"
#include "memory_overlap.h"

namespace vtpu::bridge {
namespace {

// Host-to-device copies up to this size are snapshotted and queued, so the
// caller never waits; larger ones wait for the stream and copy in place,
// avoiding a second copy of a whole checkpoint in memory.
constexpr std::size_t kQueuedUploadLimit = std::size_t{16} << 20;

const c10::DispatchKeySet kVtpuKeys(c10::DispatchKey::PrivateUse1);

void check_device_arg(std::optional<c10::Device> device) {
  if (!device.has_value()) return;
  TORCH_CHECK(device->type() == kVtpu, "vtpu: expected a vtpu device, got ", *device);
  TORCH_CHECK(!device->has_index() || device->index() == 0, "vtpu: invalid device ", *device,
              ": this process has 1 vtpu device (vtpu:0)");
}

// As CUDA's factories: pinning is a property of host memory.
void check_pin_memory_arg(std::optional<bool> pin_memory) {
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
}

void check_layout_arg(std::optional<c10::Layout> layout) {
  TORCH_CHECK_NOT_IMPLEMENTED(!layout.has_value() || *layout == c10::kStrided,
                              "vtpu: only torch.strided tensors are supported, got layout ",
                              *layout);
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout,
                               std::optional<c10::Device> device, std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  check_device_arg(device);
  check_pin_memory_arg(pin_memory);
  check_layout_arg(layout);
  DeviceContext::get().metrics().count_op();
  return empty_device(size, dtype.value_or(at::get_default_dtype_as_scalartype()), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  check_device_arg(device);
  check_pin_memory_arg(pin_memory);
  check_layout_arg(layout);
  DeviceContext::get().metrics().count_op();
  return empty_device_strided(size, stride, dtype.value_or(at::get_default_dtype_as_scalartype()));
}

// A view with the given geometry (what reshape asks for when the strides
// allow it): metadata only, like as_strided at the current offset.
at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::as_strided_tensorimpl(self, size, stride, self.storage_offset());
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) { return at::native::view(self, size); }

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  for (int64_t s : size) TORCH_CHECK(s >= 0, "vtpu: resize_ got a negative size ", size);
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  if (memory_format.has_value() && *memory_format != c10::MemoryFormat::Preserve)
    impl->empty_tensor_restride(*memory_format);
  const std::size_t needed = at::detail::computeStorageNbytes(
      self.sizes(), self.strides(), self.itemsize(), self.storage_offset());
  if (needed > self.storage().nbytes()) resize_storage_bytes(self.storage(), needed);
  return self;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  DeviceContext& context = DeviceContext::get();
  context.metrics().count_op();
  TORCH_CHECK(self.defined() && dst.defined(), "vtpu: _copy_from got an undefined tensor");
  if (dst.numel() == 0) return dst;
  const bool src_on_device = self.device().type() == kVtpu;
  const bool dst_on_device = dst.device().type() == kVtpu;
  TORCH_CHECK(src_on_device || self.device().is_cpu(), "vtpu: cannot copy from ", self.device());
  TORCH_CHECK(dst_on_device || dst.device().is_cpu(), "vtpu: cannot copy to ", dst.device());

  // Queued kernels hold CPU aliases, never the caller's tensors (dropping a
  // Python-owned tensor on the worker would need the GIL) nor the device
  // storages: as on the host-kernel path, a block Python drops goes back to the
  // allocator at once and is reused only by work queued behind this copy
  // (stream-ordered reuse). Holding the storage freed it whenever the stream
  // got to the task, so peak memory and buffer reuse (which fused windows see)
  // depended on timing.
  if (src_on_device && dst_on_device) {
    // A copy of the very same elements is nothing to do, as in ATen's copy_
    // (before its overlap checks: `x.permute(0, 1)[...] = x` of an expanded x
    // raised the written-twice error here).
    if (self.is_alias_of(dst) && self.storage_offset() == dst.storage_offset() &&
        self.sizes().equals(dst.sizes()) && self.strides().equals(dst.strides()) &&
        self.scalar_type() == dst.scalar_type() && self.is_conj() == dst.is_conj() && self.is_neg() == dst.is_neg())
      return dst;
    // ATen's overlap rules for copy_, at the call as on the CPU: the queued
    // copy's aliases are separate storages, which its own checks would take
    // for unrelated memory (t[100:].copy_(t[:-100]) chained the values).
    TORCH_CHECK(!writes_a_location_twice(dst),
                "unsupported operation: more than one element of the written-to tensor refers to a single memory "
                "location. Please clone() the tensor before performing the operation.");
    TORCH_CHECK(!aten_refuses_overlap(dst, self),
                "unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
                "single memory location. Please clone() the tensor before performing the operation.");
    if (launch_generated_copy(dst, self)) return dst;
    context.launch([src = cpu_alias(self), to = cpu_alias(dst)]() mutable { to.copy_(src); });
    return dst;
  }
  if (src_on_device) {
    // Device to host: the host reads the values now, so the stream must be done.
    context.synchronize("copy_to_cpu");
    at::Tensor dst_cpu = dst;
    dst_cpu.copy_(cpu_alias(self));
    return dst;
  }
  // Host to device.
  const std::size_t nbytes = static_cast<std::size_t>(self.numel()) * self.itemsize();
  if (context.mode() == Mode::kDebug) {
    context.wait_for_queued_work();
    cpu_alias(dst).copy_(self);
    return dst;
  }
  if (nbytes <= kQueuedUploadLimit || non_blocking) {
    // The caller may overwrite its tensor as soon as we return: queue a snapshot.
    at::Tensor snapshot = self.clone();
    context.launch([snapshot, to = cpu_alias(dst)]() mutable { to.copy_(snapshot); });
    return dst;
  }
  context.synchronize("large_upload");
  cpu_alias(dst).copy_(self);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.device().type() == kVtpu) {
    resize_(dst, self.sizes(), std::nullopt);
  } else {
    dst.resize_(self.sizes());
  }
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  DeviceContext& context = DeviceContext::get();
  context.metrics().count_op();
  context.synchronize("item");
  return at::_local_scalar_dense(cpu_alias(self));
}

at::Tensor& set_source_storage_offset(at::Tensor& self, at::Storage source, int64_t storage_offset,
                                      c10::IntArrayRef size, c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == kVtpu || source.nbytes() == 0,
              "vtpu: set_ expects a vtpu storage, got one on ", source.device());
  // ATen's checks, before self changes (found by review: a negative offset or
  // stride made a tensor that read and wrote outside its storage).
  TORCH_CHECK(storage_offset >= 0, "Tensor: invalid storage offset ", storage_offset);
  if (!stride.empty()) {
    TORCH_CHECK(size.size() == stride.size(), "unequal size length (", size.size(), ") and stride length (",
                stride.size(), ")");
    for (const int64_t s : stride)
      TORCH_CHECK(s >= 0, "Storage size calculation overflowed with sizes=", size, " and strides=", stride);
  }
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
    impl->set_storage_offset(storage_offset);
  } else {
    impl->set_sizes_and_strides(size, stride, storage_offset);
  }
  const std::size_t needed = at::detail::computeStorageNbytes(
      self.sizes(), self.strides(), self.itemsize(), self.storage_offset());
  if (needed > self.storage().nbytes()) resize_storage_bytes(self.storage(), needed);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.itemsize());
  return set_source_storage_offset(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return set_source_storage_offset(self, source.storage(), source.storage_offset(), source.sizes(),
                                   source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, device_allocator(), /*resizable=*/true);
  return set_source_storage_offset(self, std::move(storage), 0, {0}, {});
}

at::Tensor& fill_scalar(at::Tensor& self, const at::Scalar& value) {
  DeviceContext& context = DeviceContext::get();
  context.metrics().count_op();
  if (self.numel() == 0) return self;
  if (launch_generated_fill(self, value)) return self;
  context.launch([alias = cpu_alias(self), value]() mutable { alias.fill_(value); });
  return self;
}

at::Tensor& zero(at::Tensor& self) {
  DeviceContext& context = DeviceContext::get();
  context.metrics().count_op();
  if (self.numel() == 0) return self;
  if (launch_generated_fill(self, 0)) return self;
  context.launch([alias = cpu_alias(self)]() mutable { alias.zero_(); });
  return self;
}

// ATen's CPU dropout draws from the CPU generator internally; composing it
// from vtpu ops routes its randomness through the vtpu generator instead.
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p,
                                                  std::optional<bool> train) {
  TORCH_CHECK_WITH(ValueError, p >= 0 && p <= 1,
                   "dropout probability has to be between 0 and 1, but got ", p);
  if (!train.value_or(true) || p == 0) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  if (p == 1) {
    return {at::zeros_like(input), at::zeros_like(input, input.options().dtype(at::kBool))};
  }
  const double keep = 1.0 - p;
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool)).bernoulli_(keep);
  at::Tensor output = input.mul(mask).mul_(1.0 / keep);
  return {output, mask};
}

}  // namespace

at::Tensor empty_device(c10::IntArrayRef sizes, c10::ScalarType dtype,
                        std::optional<c10::MemoryFormat> memory_format) {
  return at::detail::empty_generic(sizes, device_allocator(), kVtpuKeys, dtype, memory_format);
}

at::Tensor empty_device_strided(c10::IntArrayRef sizes, c10::IntArrayRef strides,
                                c10::ScalarType dtype) {
  return at::detail::empty_strided_generic(sizes, strides, device_allocator(), kVtpuKeys, dtype);
}


namespace {

c10::Storage cpu_storage_over(void* bytes, std::size_t nbytes) {
  c10::DataPtr data(bytes, c10::Device(c10::DeviceType::CPU));
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                            std::move(data), /*allocator=*/nullptr,
                                                            /*resizable=*/false));
}

at::Tensor alias_in(c10::Storage storage, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset,
                    caffe2::TypeMeta dtype, bool conj, bool neg) {
  at::Tensor alias = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU), dtype);
  alias.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  // Lazy conjugation/negation travel with the view, so the CPU kernel resolves them.
  if (conj) alias._set_conj(true);
  if (neg) alias._set_neg(true);
  return alias;
}

at::Tensor alias_of(void* bytes, std::size_t nbytes, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                    int64_t offset, caffe2::TypeMeta dtype, bool conj, bool neg) {
  return alias_in(cpu_storage_over(bytes, nbytes), sizes, strides, offset, dtype, conj, neg);
}

}  // namespace

KernelOperand KernelOperand::capture(const at::Tensor& t) {
  KernelOperand operand;
  if (t.device().type() != kVtpu) {
    operand.host_copy_ = t.clone();  // the caller may change it after we return
    // A Python number ATen wrapped must stay one: type promotion counts it as
    // a number, where a 0-dim double made `int_tensor * 0.3` compute in double
    // and `int_tensor * 0.7j` in complex128 (both then rounded: not the CPU's bits).
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) operand.host_copy_.unsafeGetTensorImpl()->set_wrapped_number(true);
    return operand;
  }
  operand.data_ = t.storage().mutable_data();
  operand.nbytes_ = t.storage().nbytes();
  operand.sizes_.assign(t.sizes().begin(), t.sizes().end());
  operand.strides_.assign(t.strides().begin(), t.strides().end());
  operand.offset_ = t.storage_offset();
  operand.dtype_ = t.dtype();
  operand.conj_ = t.is_conj();
  operand.neg_ = t.is_neg();
  return operand;
}

at::Tensor KernelOperand::host() const {
  if (host_copy_.defined()) return host_copy_;
  return alias_of(data_, nbytes_, sizes_, strides_, offset_, dtype_, conj_, neg_);
}

at::Tensor cpu_alias(const at::Tensor& device_tensor) {
  c10::StorageImpl* storage = device_tensor.storage().unsafeGetStorageImpl();
  return alias_of(storage->mutable_data(), storage->nbytes(), device_tensor.sizes(), device_tensor.strides(),
                  device_tensor.storage_offset(), device_tensor.dtype(), device_tensor.is_conj(),
                  device_tensor.is_neg());
}

at::Tensor owning_cpu_alias(const at::Tensor& device_tensor) {
  c10::Storage device_storage = device_tensor.storage();
  void* bytes = device_storage.mutable_data();
  const std::size_t nbytes = device_storage.nbytes();
  // The DataPtr owns the reference from here on: its deleter drops it when the
  // last CPU tensor over these bytes goes away.
  c10::DataPtr data(
      bytes, new c10::Storage(std::move(device_storage)),
      [](void* held) { delete static_cast<c10::Storage*>(held); }, c10::Device(c10::DeviceType::CPU));
  c10::Storage cpu(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                         std::move(data), /*allocator=*/nullptr,
                                                         /*resizable=*/false));
  return alias_in(std::move(cpu), device_tensor.sizes(), device_tensor.strides(), device_tensor.storage_offset(),
                  device_tensor.dtype(), device_tensor.is_conj(), device_tensor.is_neg());
}

at::Tensor CpuAliases::operator()(const at::Tensor& device_tensor) {
  c10::StorageImpl* storage = device_tensor.storage().unsafeGetStorageImpl();
  const c10::Storage* shared = nullptr;
  for (const auto& [key, cpu] : storages_)
    if (key == storage) shared = &cpu;
  if (shared == nullptr) {
    storages_.emplace_back(storage, cpu_storage_over(storage->mutable_data(), storage->nbytes()));
    shared = &storages_.back().second;
  }
  return alias_in(*shared, device_tensor.sizes(), device_tensor.strides(), device_tensor.storage_offset(),
                  device_tensor.dtype(), device_tensor.is_conj(), device_tensor.is_neg());
}

// Copies resolve lazy conjugation/negation themselves (the CPU copy_ they
// run does); letting those fallbacks materialise first would recurse, since
// materialising is itself a copy into the device.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("as_strided", TORCH_FN(as_strided));
  m.impl("view", TORCH_FN(view));
  m.impl("_reshape_alias", TORCH_FN(reshape_alias));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("set_.source_Storage", TORCH_FN(set_source_storage));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_source_storage_offset));
  m.impl("set_.source_Tensor", TORCH_FN(set_source_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("fill_.Scalar", TORCH_FN(fill_scalar));
  m.impl("zero_", TORCH_FN(zero));
  m.impl("native_dropout", TORCH_FN(native_dropout));
}

}  // namespace vtpu::bridge
