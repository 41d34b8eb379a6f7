#include "vtpu/compiler/kernel_library.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "vtpu/runtime/error.h"

namespace vtpu::compiler {
namespace {

using runtime::Error;
using runtime::ErrorKind;

// An anonymous in-memory file; closed on scope exit (dlopen keeps its own mapping).
class MemoryFile {
 public:
  MemoryFile() : fd_(memfd_create("vtpu-kernel", MFD_CLOEXEC)) {
    if (fd_ < 0) throw Error(ErrorKind::kRuntime, "[kernel library] memfd_create failed");
  }
  ~MemoryFile() {
    if (fd_ >= 0) close(fd_);
  }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

KernelLibrary KernelLibrary::load(const std::vector<std::uint8_t>& shared_object) {
  MemoryFile file;
  std::size_t written = 0;
  while (written < shared_object.size()) {
    const ssize_t n = write(file.fd(), shared_object.data() + written, shared_object.size() - written);
    if (n <= 0) throw Error(ErrorKind::kRuntime, "[kernel library] cannot write the kernel image");
    written += static_cast<std::size_t>(n);
  }
  return open("/proc/self/fd/" + std::to_string(file.fd()));
}

KernelLibrary KernelLibrary::open(const std::string& path) {
  // RTLD_LOCAL: kernels of different libraries share symbol names.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw Error(ErrorKind::kRuntime, std::string("[kernel library] cannot load: ") + (why ? why : path));
  }
  return KernelLibrary(handle);
}

KernelLibrary::~KernelLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

KernelLibrary::KernelLibrary(KernelLibrary&& other) noexcept : handle_(other.handle_) { other.handle_ = nullptr; }

KernelLibrary& KernelLibrary::operator=(KernelLibrary&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) dlclose(handle_);
    handle_ = other.handle_;
    other.handle_ = nullptr;
  }
  return *this;
}

VtpuKernelFn KernelLibrary::find(const std::string& symbol) const {
  return reinterpret_cast<VtpuKernelFn>(dlsym(handle_, symbol.c_str()));
}

VtpuKernelFn KernelLibrary::get(const std::string& symbol) const {
  VtpuKernelFn fn = find(symbol);
  if (fn == nullptr) throw Error(ErrorKind::kInvalidArgument, "[kernel library] no kernel named '" + symbol + "'");
  return fn;
}

}  // namespace vtpu::compiler
