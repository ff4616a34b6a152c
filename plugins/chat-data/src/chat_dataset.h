// chat_dataset.h - the `chat` dataset: chat rows from JSONL/parquet -> Examples, in worker threads.
//
// Order (deterministic for a given seed, epoch and file list; independent of thread timing):
//   shuffle off: file order, then row order.
//   shuffle on : the blocks (parquet row groups, 1024-line JSONL chunks; sources.h) are permuted
//                with a generator seeded by (seed, epoch); consecutive permuted blocks form windows
//                of at least `shuffle_window` rows, and the rows inside each window are permuted
//                again. Reading stays sequential within a block, memory stays one window.
// Pipeline: one reader thread reads blocks and hands rows, in order, to `num_workers` threads that
// parse, validate, render and tokenize them; results are re-ordered by position, and at most
// `prefetch` rows are in flight ahead of the consumer (bounded memory). num_workers 0 does the
// work on the consumer's thread.
// Cursor: JSON {"v":1,"epoch","position","skipped","rows","seed","shuffle"}; position counts rows
// of the epoch order consumed (examples returned and rows skipped). Reopening at a cursor rebuilds
// the order and resumes at that position; a cursor from another epoch/seed/dataset is a UserError.
// Malformed rows: "file:row N: reason" (chat_rows.h); on_error fail throws it when the consumer
// reaches that row, on_error skip counts it (skipped_rows()) and warns for the first 20.
#pragma once

#include "sources.h"

#include <qrun/sdk/config.h>
#include <qrun/sdk/data.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace qrun::chatdata {

struct ChatDatasetOptions {
  std::string path;
  std::optional<std::string> split;
  LossOn loss_on = LossOn::Assistant;
  std::optional<int64_t> max_length;  // longer examples are truncated to this many tokens
  bool skip_errors = false;
  bool shuffle = true;
  int64_t shuffle_window = 16384;
  int num_workers = 2;
  int64_t prefetch = 512;
};

Schema chat_dataset_schema();
ChatDatasetOptions chat_dataset_options(const Config& c);

class ChatDataset : public Dataset {
 public:
  explicit ChatDataset(ChatDatasetOptions o) : opt_(std::move(o)) {}
  std::unique_ptr<ExampleStream> open(const DataContext& ctx, int64_t epoch,
                                      const std::string& cursor) override;
  // The file index (built on first use, then reused for every epoch).
  std::shared_ptr<const SourceIndex> index();
  const ChatDatasetOptions& options() const { return opt_; }

 private:
  ChatDatasetOptions opt_;
  std::mutex mu_;
  std::shared_ptr<const SourceIndex> index_;
};

// The epoch order: position -> (block, row) without materialising more than one window.
class EpochOrder {
 public:
  EpochOrder(std::shared_ptr<const SourceIndex> idx, uint64_t seed, int64_t epoch, bool shuffle,
             int64_t window_rows);
  int64_t num_windows() const { return static_cast<int64_t>(windows_.size()); }
  int64_t window_start(int64_t w) const { return starts_[w]; }
  int64_t window_of(int64_t position) const;
  // Reads window w's rows in epoch order (positions set).
  std::vector<RawRow> load_window(int64_t w) const;

 private:
  std::shared_ptr<const SourceIndex> idx_;
  uint64_t seed_;
  int64_t epoch_;
  bool shuffle_;
  std::vector<std::vector<int64_t>> windows_;  // block indices per window
  std::vector<int64_t> starts_;               // first position of each window (+ total)
};

uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c);

}  // namespace qrun::chatdata
