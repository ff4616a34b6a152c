// collators.h - `padded-collator` and `packed-collator`: Examples -> Batches (sdk/batch.h).
//
// Both keep examples in arrival order unless a strategy says otherwise, fill every field of the
// batch contract (Note [Packing boundaries are data] in batch.h) and count tokens exactly:
//   real_tokens    = tokens of samples;
//   padding_tokens = padded: B*S - real; packed: the tail added to reach pad_to_multiple;
//   loss_tokens    = positions t >= 1 of a sample with labels[t] != -100 (the targets left after
//                    the model's in-sample shift).
// Budgets: padded batches satisfy B * S <= tokens_per_batch where S is the longest sample rounded
// up to pad_to_multiple; packed batches satisfy sum(len) <= tokens_per_batch (the padded tail, if
// any, can round the total up to pad_to_multiple).
// A sample that cannot fit the budget alone is `overlong`: truncated to the budget (the first
// tokens are kept) or dropped; both are counted and logged, never silent.
// packed strategies:
//   greedy   - in order; a batch is closed when the next sample does not fit.
//   best-fit - keeps up to `window` examples; each batch is built best-fit-decreasing: the
//              buffered samples are tried longest first (ties: earliest first) and each is put in
//              if it fits. An example waiting more than 4*window arrivals goes first (no
//              starvation). Samples in a batch are emitted in arrival order.
// state(): JSON with the buffered examples and counters; restore() puts them back, so reopening
// the dataset at its cursor and restoring yields exactly the batches of an uninterrupted run.
#pragma once

#include <qrun/sdk/config.h>
#include <qrun/sdk/data.h>

#include <deque>

namespace qrun::chatdata {

struct CollatorOptions {
  int64_t tokens_per_batch = 8192;
  int64_t pad_to_multiple = 1;
  int64_t pad_id = 0;
  bool overlong_drop = false;
  bool best_fit = false;  // packed only
  int64_t window = 256;   // packed best-fit only
};

Schema padded_collator_schema();
Schema packed_collator_schema();
CollatorOptions collator_options(const Config& c, bool packed);

struct Buffered {
  Example ex;
  int64_t arrival = 0;
  mutable std::string enc;  // its serialised form in state(), computed once
};

class CollatorBase : public Collator {
 public:
  explicit CollatorBase(CollatorOptions o) : opt_(o) {}
  std::string state() const override;
  void restore(const std::string& state) override;
  int64_t dropped() const { return dropped_; }
  int64_t truncated() const { return truncated_; }

 protected:
  // Pulls the next example that fits alone within `max_len` (truncating or dropping overlong ones).
  bool pull(ExampleStream& s, int64_t max_len);
  static const std::string& encoded(const Buffered& b);
  CollatorOptions opt_;
  std::deque<Buffered> buf_;
  int64_t arrived_ = 0;
  int64_t dropped_ = 0;
  int64_t truncated_ = 0;
};

class PaddedCollator : public CollatorBase {
 public:
  using CollatorBase::CollatorBase;
  std::optional<Batch> next(ExampleStream& examples) override;
  std::optional<Layout> layout() const override { return Layout::Padded; }
};

class PackedCollator : public CollatorBase {
 public:
  using CollatorBase::CollatorBase;
  std::optional<Batch> next(ExampleStream& examples) override;
  std::optional<Layout> layout() const override { return Layout::Packed; }
};

// Builders (exposed for tests and tools).
Batch make_packed_batch(const std::vector<const Example*>& xs, int64_t pad_to_multiple, int64_t pad_id);
Batch make_padded_batch(const std::vector<const Example*>& xs, int64_t pad_to_multiple, int64_t pad_id);
int64_t count_loss_tokens(const Example& e);

}  // namespace qrun::chatdata
