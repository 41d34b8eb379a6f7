// PrivateUse1 hooks (what torch.accelerator, autograd and serialization ask a
// backend) and the device's Philox generator.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/ops/empty.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>

#include <algorithm>
#include <cstring>

#include "aten_bridge.h"
#include "device_context.h"
#include "pinned_memory.h"
#include "vtpu/runtime/philox.h"

namespace vtpu::bridge {
namespace {

constexpr std::size_t kStateBytes = 2 * sizeof(std::uint64_t);  // seed, offset

class VtpuGeneratorImpl final : public c10::GeneratorImpl {
 public:
  static c10::DeviceType device_type() { return kVtpu; }

  VtpuGeneratorImpl()
      : c10::GeneratorImpl(c10::Device(kVtpu, 0), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}

  void set_current_seed(std::uint64_t seed) override { state_.set_seed(seed); }
  void set_offset(std::uint64_t offset) override { state_.set_offset(offset); }
  std::uint64_t get_offset() const override { return state_.offset(); }
  std::uint64_t current_seed() const override { return state_.seed(); }
  std::uint64_t seed() override {
    const std::uint64_t random = c10::detail::getNonDeterministicRandom();
    set_current_seed(random);
    return random;
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto state = at::empty({static_cast<int64_t>(kStateBytes)}, at::TensorOptions().dtype(at::kByte));
    const std::uint64_t words[2] = {state_.seed(), state_.offset()};
    std::memcpy(state.data_ptr(), words, kStateBytes);
    return state.getIntrusivePtr();
  }
  void set_state(const c10::TensorImpl& new_state) override {
    // CPU and CUDA generators' checks, with their exception types: the bytes
    // are read directly, so a strided view or device memory (whose queued
    // writes may not have run) would give a wrong state silently.
    TORCH_CHECK_WITH(TypeError,
                     new_state.layout() == c10::kStrided && new_state.device().type() == c10::DeviceType::CPU &&
                         new_state.dtype() == caffe2::TypeMeta::Make<std::uint8_t>(),
                     "RNG state must be a torch.ByteTensor (a uint8 CPU tensor); got ", new_state.dtype(), " on ",
                     new_state.device());
    TORCH_CHECK(new_state.is_contiguous(), "RNG state must be contiguous");
    TORCH_CHECK(new_state.numel() == static_cast<int64_t>(kStateBytes), "RNG state is wrong size: a vtpu "
                "generator's state has ", kStateBytes, " bytes (seed, offset), got ", new_state.numel());
    std::uint64_t words[2];
    std::memcpy(words, new_state.data(), kStateBytes);
    state_.set_seed(words[0]);
    state_.set_offset(words[1]);
  }
  // Reserves one counter value and turns (seed, offset) into a 64-bit seed.
  std::uint64_t next_host_seed() {
    const std::uint64_t offset = state_.advance(1);
    return runtime::PhiloxState::derive(state_.seed(), offset);
  }

 private:
  VtpuGeneratorImpl* clone_impl() const override {
    auto* copy = new VtpuGeneratorImpl();
    copy->state_ = state_;
    return copy;
  }
  runtime::PhiloxState state_{67280421310721ull};
};

class VtpuHooks final : public at::PrivateUse1HooksInterface {
 public:
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  // torch.Generator(device="vtpu:1") used to give a generator of vtpu:0.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    check_generator_device(index);
    return default_generator();
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    check_generator_device(index);
    return at::make_generator<VtpuGeneratorImpl>();
  }
  static void check_generator_device(c10::DeviceIndex index) {
    TORCH_CHECK(index == -1 || index == 0, "vtpu: invalid device index ", static_cast<int>(index),
                "; this process has 1 vtpu device (vtpu:0)");
  }
  at::Device getDeviceFromPtr(void*) const override { return c10::Device(kVtpu, 0); }
  bool isPinnedPtr(const void* ptr) const override { return is_pinned_pointer(ptr); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return pinned_memory_allocator(); }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  void setCurrentDevice(c10::DeviceIndex index) const override {
    TORCH_CHECK(index == 0, "vtpu: invalid device index ", static_cast<int>(index),
                "; this process has 1 vtpu device (vtpu:0)");
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex) const override { return 0; }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex) const override { return 0; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_nbytes) const override {
    resize_storage_bytes(storage, new_nbytes);
  }
};

struct HooksRegistration {
  HooksRegistration() { at::RegisterPrivateUse1HooksInterface(new VtpuHooks()); }
} g_hooks_registration;

}  // namespace

const at::Generator& default_generator() {
  static at::Generator generator = at::make_generator<VtpuGeneratorImpl>();
  return generator;
}

at::Generator host_generator_for(const std::optional<at::Generator>& vtpu_generator) {
  at::Generator source = default_generator();
  if (vtpu_generator.has_value() && vtpu_generator->defined()) {
    TORCH_CHECK(vtpu_generator->device().type() == kVtpu,
                "Expected a 'vtpu' device type for generator but found '",
                vtpu_generator->device().type(), "'");
    source = *vtpu_generator;
  }
  std::uint64_t seed;
  {
    std::lock_guard<std::mutex> lock(source.mutex());
    seed = at::check_generator<VtpuGeneratorImpl>(source)->next_host_seed();
  }
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

void resize_storage_bytes(const c10::Storage& storage, std::size_t new_nbytes) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
  const std::size_t old_nbytes = impl->nbytes();
  if (new_nbytes == old_nbytes) return;
  // Queued kernels may still write the old bytes, which we are about to copy;
  // an empty storage has none to wait for (out= results grow from empty).
  if (old_nbytes > 0) DeviceContext::get().synchronize("storage_resize");
  c10::DataPtr fresh = device_allocator()->allocate(new_nbytes);
  const std::size_t keep = std::min(old_nbytes, new_nbytes);
  if (keep > 0 && impl->data() != nullptr) std::memcpy(fresh.get(), impl->data(), keep);
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(new_nbytes);
}

}  // namespace vtpu::bridge
