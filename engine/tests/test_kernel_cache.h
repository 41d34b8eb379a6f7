// The shared object of a generated translation unit for the kernel tests,
// compiled once per build tree: CTest runs each test case in its own
// process, so a suite's SetUpTestSuite compiled the same translation unit
// once per case (~35 s each for the norm kernels). Keyed by the source and
// the compiler's identity and flags, so any change to the code generator or
// the compiler recompiles; a cache that cannot be written is only slower.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "vtpu/cache/sha256.h"
#include "vtpu/compiler/system_compiler.h"

namespace vtpu::compiler::testing {

inline std::vector<std::uint8_t> compile_once(const std::string& source, const SystemCompiler& compiler = SystemCompiler()) {
#ifdef VTPU_TEST_KERNEL_DIR
  std::string identity = source + '\n' + compiler.executable() + '\n' + compiler.identity();
  for (const std::string& flag : compiler.flags()) identity += '\n' + flag;
  const auto digest = cache::sha256({reinterpret_cast<const std::uint8_t*>(identity.data()), identity.size()});
  const std::filesystem::path dir = VTPU_TEST_KERNEL_DIR;
  const std::filesystem::path path = dir / (cache::digest_hex(digest) + ".so");
  if (std::ifstream in{path, std::ios::binary}) {
    std::vector<std::uint8_t> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (!bytes.empty()) return bytes;
  }
  std::vector<std::uint8_t> bytes = compiler.compile(source);
  std::error_code ignored;
  std::filesystem::create_directories(dir, ignored);
  // Written whole under a private name, then renamed: a concurrent case
  // reads either nothing or the whole object.
  const std::filesystem::path temp = path.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out{temp, std::ios::binary};
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  std::filesystem::rename(temp, path, ignored);
  if (ignored) std::filesystem::remove(temp, ignored);
  return bytes;
#else
  return compiler.compile(source);
#endif
}

}  // namespace vtpu::compiler::testing
