// framework/checkpoint.h - atomic checkpoint directories.
//
// A checkpoint is a directory `<root>/step-<8 digits>/`. It is written under a temporary name,
// every file is fsync'd, then the directory is renamed into place and the parent fsync'd, so a
// crash (kill -9, power loss, full disk) at any moment leaves either the complete new checkpoint or
// none: the previous one stays intact and loadable. `state.json` is written last.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

namespace qrun {

struct CheckpointRef {
  std::filesystem::path dir;
  int64_t step = 0;
};

// Calls `fill(tmp_dir)` to write the files, then publishes them atomically as step `step`.
// On any failure the temporary directory is removed and a UserError names the cause.
std::filesystem::path write_checkpoint(const std::filesystem::path& root, int64_t step,
                                      const std::function<void(const std::filesystem::path&)>& fill);

// The newest complete checkpoint under root (temporary directories are ignored).
std::optional<CheckpointRef> newest_checkpoint(const std::filesystem::path& root);

// Deletes all but the newest `keep` checkpoints.
void prune_checkpoints(const std::filesystem::path& root, int64_t keep);

// Writes a small file atomically (temp file, fsync, rename).
void write_file_atomically(const std::filesystem::path& file, const std::string& text);

// A new file written with write(2) where every result is checked: a failing write, fsync or close
// throws UserError naming the file and the errno text ("No space left on device", "File too
// large"). sink_write() is for writers that call back through C code and cannot take a failure
// (LibTorch's zip writer aborts the process when its write callback comes up short: its
// destructor re-checks the file position): it always reports the bytes as taken, remembers the
// first failure and drops everything after it; close() then throws that failure.
class CheckedFile {
 public:
  explicit CheckedFile(const std::filesystem::path& path);
  ~CheckedFile();
  CheckedFile(const CheckedFile&) = delete;
  CheckedFile& operator=(const CheckedFile&) = delete;
  void write(const void* data, size_t size);
  size_t sink_write(const void* data, size_t size) noexcept;
  // fsync + close; throws on failure (also when an earlier sink_write failed).
  void close();
  const std::string& error() const { return error_; }

 private:
  void write_all(const void* data, size_t size) noexcept;
  std::filesystem::path path_;
  int fd_ = -1;
  std::string error_;
};

// A whole file through CheckedFile (written, fsync'd, closed).
void write_file_checked(const std::filesystem::path& file, const std::string& text);

}  // namespace qrun
