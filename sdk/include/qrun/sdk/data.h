// qrun/sdk/data.h - the data kinds: tokenizer, chat_format, dataset, collator.
//
// Flow: a dataset reads rows (chat JSONL, HF parquet shards), renders each conversation with the
// chat_format and the tokenizer into an Example (token ids + labels), and streams them in a
// deterministic order; a collator turns the stream into Batches (batch.h) under a token budget.
//
// Resumability: an ExampleStream's cursor and a collator's state are opaque strings (JSON by
// convention) saved in checkpoints; reopening a dataset at a cursor and restoring the collator
// yields exactly the batches an uninterrupted run would have produced. Added in SDK 1.
#pragma once

#include <qrun/sdk/batch.h>
#include <qrun/sdk/component.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qrun {

// Text <-> token ids. Immutable once built; every method is thread-safe.
class Tokenizer : public Component {
 public:
  static constexpr const char* kKind = "tokenizer";
  // parse_special: added/special tokens spelled in the text become their ids.
  virtual std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual int64_t vocab_size() const = 0;
};

struct Message {
  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
};

enum class LossOn { Assistant, All };

struct Example {
  int64_t id = -1;               // stable id of the row in the dataset (for error reports)
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;   // same length; -100 = no loss; not shifted (batch.h)
};

// Renders a conversation into tokens and labels. Thread-safe (called from loader threads).
class ChatFormat : public Component {
 public:
  static constexpr const char* kKind = "chat_format";
  // Throws UserError for conversations the format cannot render (the caller adds file/row).
  virtual Example render(const std::vector<Message>& conversation, const Tokenizer& tokenizer,
                         LossOn loss_on) const = 0;
};

// A stream of examples in the dataset's deterministic order for one epoch.
class ExampleStream {
 public:
  virtual ~ExampleStream() = default;
  // The next example, or nullopt at the end of the epoch. Blocking.
  virtual std::optional<Example> next() = 0;
  // Position just after the last example returned by next(); reopen with it to resume.
  virtual std::string cursor() const = 0;
  // Rows skipped as malformed so far (only with skip-and-count error handling).
  virtual int64_t skipped_rows() const { return 0; }
};

struct DataContext {
  const Tokenizer* tokenizer = nullptr;     // not owned
  const ChatFormat* chat_format = nullptr;  // not owned
  uint64_t seed = 0;
};

class Dataset : public Component {
 public:
  static constexpr const char* kKind = "dataset";
  // Opens the stream of `epoch` at `cursor` ("" = the start). Validates the files and fails early
  // with their names.
  virtual std::unique_ptr<ExampleStream> open(const DataContext& ctx, int64_t epoch,
                                              const std::string& cursor) = 0;
};

// Turns examples into batches under the collator's token budget.
class Collator : public Component {
 public:
  static constexpr const char* kKind = "collator";
  // Pulls as many examples as it needs from `examples` and returns the next batch, or nullopt
  // when the stream is exhausted and nothing is buffered. Tensors are on the CPU.
  virtual std::optional<Batch> next(ExampleStream& examples) = 0;
  // Examples pulled but not yet emitted, serialised; restore() puts them back (exact resume).
  virtual std::string state() const { return "{}"; }
  virtual void restore(const std::string& state) { (void)state; }
  // Added in SDK 3. The layout of every batch it makes, when that is fixed (the host checks the
  // kernel backends against it before the run, kernels.h); nullopt: it may make either.
  virtual std::optional<Layout> layout() const { return std::nullopt; }
};

}  // namespace qrun
