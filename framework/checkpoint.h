// framework/checkpoint.h - atomic checkpoint directories.
//
// A checkpoint is a directory `<root>/step-<8 digits>/`. It is written under a temporary name,
// every file is fsync'd, then the directory is renamed into place and the parent fsync'd, so a
// crash (kill -9, power loss, full disk) at any moment leaves either the complete new checkpoint or
// none: the previous one stays intact and loadable. `state.json` is written last.
#pragma once

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

}  // namespace qrun
