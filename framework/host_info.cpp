#include "host_info.h"

#include <qrun/sdk/plugin.h>

#include <fmt/format.h>

#include <unistd.h>

#include <climits>

namespace qrun {

std::filesystem::path executable_path() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return {};
  buf[n] = '\0';
  return std::filesystem::path(buf);
}

std::string qrun_version() { return QRUN_VERSION; }

std::string build_id() { return QRUN_BUILD_ID; }

std::string version_report() {
  std::string cuda = QRUN_CUDA_MAJOR == 0 ? std::string("built without CUDA")
                                          : fmt::format("CUDA {}", QRUN_CUDA_VERSION);
  return fmt::format("qrun {} (build {}, plugin ABI {})\nLibTorch {} (C++11 ABI {})\n{}",
                     QRUN_VERSION, QRUN_BUILD_ID, QRUN_ABI_VERSION, TORCH_VERSION,
                     _GLIBCXX_USE_CXX11_ABI, cuda);
}

}  // namespace qrun
