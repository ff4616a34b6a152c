// sources.h - finding chat files and reading their rows (JSONL lines, parquet `messages`).
//
// Files come from a path (a file, a folder searched recursively, or a glob with * ? [..] in the
// file name part) or a Hugging Face dataset id ("org/name") in the local hub cache
// ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub; the snapshot named by
// refs/main, else the only snapshot). Nothing is ever downloaded.
//
// Index: at open, JSONL files are scanned once for line starts (blank lines are not rows) and
// parquet files have their footers read (row group sizes; the `messages` column must exist).
// Rows are numbered 1.. within each file in error messages ("file:row N"): for JSONL N is the
// line number. Rows are grouped in *blocks* (a parquet row group, or 1024 JSONL lines): the unit
// of reading and of the block-level shuffle (chat_dataset.cpp).
#pragma once

#include "chat_rows.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace qrun::chatdata {

// Resolves `path` (and optional split) to a sorted list of .jsonl/.parquet files.
// Throws UserError saying where it looked (and how to download a missing HF dataset).
std::vector<std::string> resolve_files(const std::string& path, const std::optional<std::string>& split);

// One read row: either a structurally valid conversation (content not yet validated) or the reason
// it is malformed. JSONL lines are carried raw and parsed by the worker threads.
struct RawRow {
  int64_t position = 0;   // index in the epoch order
  int64_t id = 0;         // global row id (stable: file order, then row order)
  int32_t file = 0;       // index into files
  int64_t row = 0;        // 1-based row number in its file (line number for JSONL)
  bool is_jsonl = false;
  std::string line;                  // JSONL
  std::vector<RowMessage> messages;  // parquet
  std::optional<std::string> error;  // parquet: malformed row
};

struct Block {
  int32_t file = 0;
  int64_t first_id = 0;  // global id of the block's first row
  int64_t rows = 0;
  int64_t index_in_file = 0;  // parquet: row group; JSONL: block number
};

// The files and their row index. Immutable after build(); read() is thread-safe.
class SourceIndex {
 public:
  static std::shared_ptr<const SourceIndex> build(std::vector<std::string> files);

  const std::vector<std::string>& files() const { return files_; }
  const std::vector<Block>& blocks() const { return blocks_; }
  int64_t num_rows() const { return num_rows_; }
  // Reads every row of a block, in order. Throws UserError naming the file on I/O or decode errors.
  std::vector<RawRow> read_block(const Block& b) const;

  struct FileInfo {
    bool jsonl = false;
    std::vector<uint64_t> line_offsets;  // JSONL: start of each row's line
    std::vector<uint64_t> line_ends;
    std::vector<int64_t> line_numbers;   // JSONL: 1-based line number of each row
    int messages_leaf_role = -1, messages_leaf_content = -1;  // parquet leaf columns
  };

 private:
  std::vector<std::string> files_;
  std::vector<FileInfo> info_;
  std::vector<Block> blocks_;
  int64_t num_rows_ = 0;
};

constexpr int64_t kJsonlBlockRows = 1024;

}  // namespace qrun::chatdata
