#include "checkpoint.h"

#include <qrun/sdk/error.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <regex>
#include <vector>

namespace fs = std::filesystem;

namespace qrun {
namespace {

void fsync_path(const fs::path& p, bool directory) {
  int fd = ::open(p.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  QRUN_CHECK(fd >= 0, "cannot open {} to sync it: {}", p.string(), std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  QRUN_CHECK(rc == 0, "cannot sync {}: {}", p.string(), std::strerror(err));
}

std::string step_name(int64_t step) { return fmt::format("step-{:08d}", step); }

std::vector<CheckpointRef> list_checkpoints(const fs::path& root) {
  std::vector<CheckpointRef> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  static const std::regex re("^step-([0-9]{8,})$");
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::smatch m;
    std::string name = e.path().filename().string();
    if (e.is_directory() && std::regex_match(name, m, re) && fs::exists(e.path() / "state.json"))
      out.push_back({e.path(), std::stoll(m[1])});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

}  // namespace

fs::path write_checkpoint(const fs::path& root, int64_t step,
                          const std::function<void(const fs::path&)>& fill) {
  std::error_code ec;
  fs::create_directories(root, ec);
  QRUN_CHECK(!ec, "cannot create checkpoint folder {}: {}", root.string(), ec.message());
  fs::path final_dir = root / step_name(step);
  fs::path tmp = root / fmt::format(".{}.tmp-{}", step_name(step), ::getpid());
  fs::remove_all(tmp, ec);
  try {
    fs::create_directories(tmp);
    fill(tmp);
    for (const auto& e : fs::recursive_directory_iterator(tmp))
      fsync_path(e.path(), e.is_directory());
    fsync_path(tmp, true);
    if (fs::exists(final_dir)) fs::remove_all(final_dir);  // the same step written again
    fs::rename(tmp, final_dir);
    fsync_path(root, true);
  } catch (Error& e) {
    fs::remove_all(tmp, ec);
    e.add_context(fmt::format("while writing checkpoint {} (the previous checkpoints are intact)",
                              final_dir.string()));
    throw;
  } catch (const std::exception& e) {
    fs::remove_all(tmp, ec);
    throw UserError(fmt::format("cannot write checkpoint {}: {}; the previous checkpoints are intact",
                                final_dir.string(), e.what()));
  }
  return final_dir;
}

std::optional<CheckpointRef> newest_checkpoint(const fs::path& root) {
  auto all = list_checkpoints(root);
  if (all.empty()) return std::nullopt;
  return all.back();
}

void prune_checkpoints(const fs::path& root, int64_t keep) {
  auto all = list_checkpoints(root);
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) {
    std::error_code ec;
    fs::remove_all(all[i].dir, ec);
  }
}

void write_file_atomically(const fs::path& file, const std::string& text) {
  fs::path tmp = file;
  tmp += fmt::format(".tmp-{}", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    QRUN_CHECK(out.good(), "cannot write {}", tmp.string());
    out << text;
    out.flush();
    QRUN_CHECK(out.good(), "cannot write {} (disk full?)", tmp.string());
  }
  fsync_path(tmp, false);
  fs::rename(tmp, file);
}

}  // namespace qrun
