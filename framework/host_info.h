// framework/host_info.h - facts about this qrun build (versions, paths) for --version and the loader.
#pragma once

#include <filesystem>
#include <string>

#ifndef QRUN_CUDA_MAJOR
#define QRUN_CUDA_MAJOR 0
#endif

namespace qrun {

std::filesystem::path executable_path();
std::string qrun_version();
// The commit this binary was built from (12 hex digits, or "nogit").
std::string build_id();
// "qrun 0.1.0 (abc123)\nLibTorch 2.11.0 (CUDA 13.0, ...)".
std::string version_report();

}  // namespace qrun
