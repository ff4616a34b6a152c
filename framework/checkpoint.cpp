#include "checkpoint.h"

#include <qrun/sdk/error.h>

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sys/statvfs.h>
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

// Bytes under a directory (0 if it cannot be read).
uintmax_t tree_size(const fs::path& dir) {
  uintmax_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  return total;
}

std::string mib(uintmax_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

// What the user needs to know after a failed checkpoint write: free space, the space a
// checkpoint takes (the previous one's size), and that nothing older was touched.
std::string space_report(const fs::path& root) {
  std::string out;
  struct statvfs vfs {};
  if (::statvfs(root.c_str(), &vfs) == 0)
    out += fmt::format("; {} free on the file system of {}", mib(static_cast<uintmax_t>(vfs.f_bavail) * vfs.f_frsize),
                       root.string());
  auto all = list_checkpoints(root);
  if (!all.empty())
    out += fmt::format("; a checkpoint needs about {} (the size of {})", mib(tree_size(all.back().dir)),
                       all.back().dir.filename().string());
  return out;
}

}  // namespace

CheckedFile::CheckedFile(const fs::path& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  QRUN_CHECK(fd_ >= 0, "cannot create {}: {}", path.string(), std::strerror(errno));
}

CheckedFile::~CheckedFile() {
  if (fd_ >= 0) ::close(fd_);
}

void CheckedFile::write_all(const void* data, size_t size) noexcept {
  if (!error_.empty() || fd_ < 0) return;
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::write(fd_, p + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // write(2) returns 0 only for a zero-length request; treat it as "no space" to never spin.
      error_ = fmt::format("cannot write {}: {}", path_.string(), std::strerror(n < 0 ? errno : ENOSPC));
      return;
    }
    done += static_cast<size_t>(n);
  }
}

size_t CheckedFile::sink_write(const void* data, size_t size) noexcept {
  write_all(data, size);
  return size;
}

void CheckedFile::write(const void* data, size_t size) {
  write_all(data, size);
  if (!error_.empty()) throw UserError(error_);
}

void CheckedFile::close() {
  if (!error_.empty()) throw UserError(error_);
  QRUN_CHECK(fd_ >= 0, "{} is already closed", path_.string());
  int rc = ::fsync(fd_);
  int err = errno;
  int fd = fd_;
  fd_ = -1;
  if (rc != 0) {
    ::close(fd);
    throw UserError(fmt::format("cannot sync {}: {}", path_.string(), std::strerror(err)));
  }
  QRUN_CHECK(::close(fd) == 0, "cannot close {}: {}", path_.string(), std::strerror(errno));
}

void write_file_checked(const fs::path& file, const std::string& text) {
  CheckedFile f(file);
  f.write(text.data(), text.size());
  f.close();
}

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
  } catch (const std::exception& e) {
    // Nothing of the new checkpoint stays: the partial temporary folder goes, older ones are
    // untouched (nothing is pruned before a new checkpoint is complete).
    fs::remove_all(tmp, ec);
    const auto* qe = dynamic_cast<const Error*>(&e);
    if (qe != nullptr && !qe->is_user_error()) throw;  // a bug stays an internal error (exit 1)
    const auto* c10e = dynamic_cast<const c10::Error*>(&e);
    std::string cause = c10e ? c10e->what_without_backtrace() : e.what();
    auto prev = newest_checkpoint(root);
    throw UserError(fmt::format(
        "cannot write checkpoint {}: {}{}; the partial {} was removed and {}", final_dir.string(),
        cause, space_report(root), tmp.filename().string(),
        prev ? fmt::format("the previous checkpoint {} is intact (resume with --resume)", prev->dir.string())
             : std::string("no earlier checkpoint exists")));
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
  try {
    write_file_checked(tmp, text);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  std::error_code ec;
  fs::rename(tmp, file, ec);
  QRUN_CHECK(!ec, "cannot rename {} to {}: {}", tmp.string(), file.string(), ec.message());
}

}  // namespace qrun
