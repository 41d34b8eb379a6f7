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

}  // namespace

KernelLibrary KernelLibrary::load(const std::vector<std::uint8_t>& shared_object) {
  // An anonymous in-memory file, kept open while the library is loaded: the
  // loader knows libraries by path, and a closed descriptor's number (hence
  // its /proc/self/fd path) would be reused by the next kernel, which dlopen
  // would then take for the one already loaded.
  const int fd = memfd_create("vtpu-kernel", MFD_CLOEXEC);
  if (fd < 0) throw Error(ErrorKind::kRuntime, "[kernel library] memfd_create failed");
  std::size_t written = 0;
  while (written < shared_object.size()) {
    const ssize_t n = write(fd, shared_object.data() + written, shared_object.size() - written);
    if (n <= 0) {
      close(fd);
      throw Error(ErrorKind::kRuntime, "[kernel library] cannot write the kernel image");
    }
    written += static_cast<std::size_t>(n);
  }
  try {
    KernelLibrary library = open("/proc/self/fd/" + std::to_string(fd));
    library.fd_ = fd;
    return library;
  } catch (...) {
    close(fd);
    throw;
  }
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

void KernelLibrary::release() noexcept {
  if (handle_ != nullptr) dlclose(handle_);
  if (fd_ >= 0) close(fd_);
  handle_ = nullptr;
  fd_ = -1;
}

KernelLibrary::~KernelLibrary() { release(); }

KernelLibrary::KernelLibrary(KernelLibrary&& other) noexcept : handle_(other.handle_), fd_(other.fd_) {
  other.handle_ = nullptr;
  other.fd_ = -1;
}

KernelLibrary& KernelLibrary::operator=(KernelLibrary&& other) noexcept {
  if (this != &other) {
    release();
    handle_ = other.handle_;
    fd_ = other.fd_;
    other.handle_ = nullptr;
    other.fd_ = -1;
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
