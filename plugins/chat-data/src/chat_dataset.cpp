// chat_dataset.cpp - see chat_dataset.h.
#include "chat_dataset.h"

#include <qrun/sdk/log.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <thread>

namespace qrun::chatdata {

// ---------------------------------------------------------------- deterministic random numbers

namespace {
uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// Fisher-Yates with a fixed generator and reduction, so orders are the same on every platform
// and standard library (std::shuffle's distribution is not specified).
template <typename T>
void shuffle_vec(std::vector<T>& v, uint64_t seed) {
  uint64_t s = seed;
  for (size_t i = v.size(); i > 1; i--) {
    uint64_t r = splitmix64(s);
    size_t j = static_cast<size_t>((static_cast<unsigned __int128>(r) * i) >> 64);
    std::swap(v[i - 1], v[j]);
  }
}
}  // namespace

uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t s = a;
  uint64_t x = splitmix64(s) ^ b;
  x = splitmix64(x) ^ c;
  return splitmix64(x);
}

// ---------------------------------------------------------------- schema

Schema chat_dataset_schema() {
  return Schema{
      Field::string("path").require().doc(
          "a .jsonl/.parquet file, a folder, a glob, or a Hugging Face dataset id in the local "
          "cache (org/name)"),
      Field::string("split").optional().doc(
          "only files of this split (a folder named so, or files named '<split>-*')"),
      Field::choice("loss_on", "assistant", {"assistant", "all"})
          .doc("tokens that carry loss: assistant turns (with their end-of-turn token) or all"),
      Field::integer("max_length").optional().min(2).doc(
          "truncate longer examples to this many tokens"),
      Field::choice("on_error", "fail", {"fail", "skip"})
          .doc("malformed rows: stop with file:row and the reason, or skip them and count"),
      Field::boolean("shuffle", true).doc("shuffle rows by the run seed and the epoch"),
      Field::integer("shuffle_window", 16384).min(1).doc(
          "rows shuffled together (whole blocks of rows are shuffled first)"),
      Field::integer("num_workers", 2).min(0).max(256).doc(
          "tokenizer threads (0: on the training thread)"),
      Field::integer("prefetch", 512).min(1).doc("rows read and tokenized ahead, at most"),
  };
}

ChatDatasetOptions chat_dataset_options(const Config& c) {
  ChatDatasetOptions o;
  o.path = c.get_string("path");
  o.split = c.get_optional_string("split");
  o.loss_on = c.get_string("loss_on") == "all" ? LossOn::All : LossOn::Assistant;
  if (c.has("max_length")) o.max_length = c.get_int("max_length");
  o.skip_errors = c.get_string("on_error") == "skip";
  o.shuffle = c.get_bool("shuffle");
  o.shuffle_window = c.get_int("shuffle_window");
  o.num_workers = static_cast<int>(c.get_int("num_workers"));
  o.prefetch = c.get_int("prefetch");
  return o;
}

// ---------------------------------------------------------------- order

EpochOrder::EpochOrder(std::shared_ptr<const SourceIndex> idx, uint64_t seed, int64_t epoch,
                       bool shuffle, int64_t window_rows)
    : idx_(std::move(idx)), seed_(seed), epoch_(epoch), shuffle_(shuffle) {
  const auto& blocks = idx_->blocks();
  std::vector<int64_t> perm(blocks.size());
  for (size_t i = 0; i < perm.size(); i++) perm[i] = static_cast<int64_t>(i);
  if (shuffle_) shuffle_vec(perm, mix_seed(seed_, static_cast<uint64_t>(epoch_), 0x626c6f636bull));
  int64_t pos = 0, acc = 0;
  for (int64_t b : perm) {
    if (windows_.empty() || (shuffle_ ? acc >= window_rows : true)) {
      windows_.emplace_back();
      starts_.push_back(pos);
      acc = 0;
    }
    windows_.back().push_back(b);
    acc += blocks[b].rows;
    pos += blocks[b].rows;
  }
  starts_.push_back(pos);
}

int64_t EpochOrder::window_of(int64_t position) const {
  auto it = std::upper_bound(starts_.begin(), starts_.end() - 1, position);
  return static_cast<int64_t>(it - starts_.begin()) - 1;
}

std::vector<RawRow> EpochOrder::load_window(int64_t w) const {
  std::vector<RawRow> rows;
  for (int64_t b : windows_[w]) {
    auto part = idx_->read_block(idx_->blocks()[b]);
    rows.insert(rows.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  if (shuffle_)
    shuffle_vec(rows, mix_seed(seed_, static_cast<uint64_t>(epoch_), 0x726f7773ull + static_cast<uint64_t>(w) * 0x9E37ull));
  for (size_t i = 0; i < rows.size(); i++) rows[i].position = starts_[w] + static_cast<int64_t>(i);
  return rows;
}

// ---------------------------------------------------------------- the stream

namespace {

struct Slot {
  enum Kind { Ok, Skip, Fatal } kind = Ok;
  Example example;
  std::string reason;           // Skip: "file:row N: reason"
  std::exception_ptr error;     // Fatal
};

class ChatStream : public ExampleStream {
 public:
  ChatStream(std::shared_ptr<const SourceIndex> idx, const ChatDatasetOptions& opt,
             const DataContext& ctx, int64_t epoch, int64_t start, int64_t skipped)
      : idx_(std::move(idx)),
        opt_(opt),
        ctx_(ctx),
        epoch_(epoch),
        order_(idx_, ctx.seed, epoch, opt.shuffle, opt.shuffle_window),
        consumed_(start),
        skipped_(skipped),
        read_pos_(start),
        consumer_pos_(start) {
    if (opt_.num_workers > 0) {
      reader_ = std::thread([this] { reader_loop(); });
      for (int i = 0; i < opt_.num_workers; i++) workers_.emplace_back([this] { worker_loop(); });
    }
  }

  ~ChatStream() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (reader_.joinable()) reader_.join();
    for (auto& t : workers_) t.join();
  }

  std::optional<Example> next() override {
    for (;;) {
      if (failed_) std::rethrow_exception(failed_);
      if (consumed_ >= total()) return std::nullopt;
      Slot s = opt_.num_workers > 0 ? take_threaded() : take_inline();
      if (s.kind == Slot::Fatal) {
        failed_ = s.error;
        std::rethrow_exception(s.error);
      }
      consumed_++;
      if (s.kind == Slot::Skip) {
        skipped_++;
        if (skipped_ <= 20) log_warn("skipping malformed row: {}", s.reason);
        if (skipped_ == 20) log_warn("further malformed rows are skipped without a message");
        continue;
      }
      return std::move(s.example);
    }
  }

  std::string cursor() const override {
    nlohmann::json j{{"v", 1},       {"epoch", epoch_},          {"position", consumed_},
                     {"skipped", skipped_}, {"rows", idx_->num_rows()}, {"seed", ctx_.seed},
                     {"shuffle", opt_.shuffle}};
    return j.dump();
  }
  int64_t skipped_rows() const override { return skipped_; }

 private:
  int64_t total() const { return idx_->num_rows(); }

  // Reads the row at read_pos_ (loading its window when needed). Caller serialises.
  RawRow read_next() {
    if (window_ < 0 || read_pos_ >= order_.window_start(window_ + 1)) {
      window_ = order_.window_of(read_pos_);
      rows_ = order_.load_window(window_);
    }
    return std::move(rows_[read_pos_ - order_.window_start(window_)]);
  }

  Slot process(RawRow& raw) const {
    Slot s;
    auto where = [&] { return fmt::format("{}:row {}", idx_->files()[raw.file], raw.row); };
    std::optional<std::string> err;
    std::vector<RowMessage> msgs;
    if (raw.is_jsonl) err = parse_jsonl_row(raw.line, msgs);
    else if (raw.error) err = raw.error;
    else msgs = std::move(raw.messages);
    if (!err) err = validate_conversation(msgs, opt_.loss_on == LossOn::Assistant);
    if (!err) {
      std::vector<Message> conv;
      conv.reserve(msgs.size());
      for (auto& m : msgs) conv.push_back(Message{std::move(m.role), std::move(m.content)});
      try {
        s.example = ctx_.chat_format->render(conv, *ctx_.tokenizer, opt_.loss_on);
      } catch (const Error& e) {
        if (!e.is_user_error()) {
          s.kind = Slot::Fatal;
          s.error = std::current_exception();
          return s;
        }
        err = e.message();
      }
    }
    if (err) {
      std::string msg = fmt::format("{}: {}", where(), *err);
      if (opt_.skip_errors) {
        s.kind = Slot::Skip;
        s.reason = std::move(msg);
      } else {
        UserError e(std::move(msg));
        e.add_context(fmt::format(
            "while reading dataset '{}' (on_error: skip skips malformed rows and counts them)",
            opt_.path));
        s.kind = Slot::Fatal;
        s.error = std::make_exception_ptr(e);
      }
      return s;
    }
    s.example.id = raw.id;
    if (opt_.max_length && static_cast<int64_t>(s.example.input_ids.size()) > *opt_.max_length) {
      if (!warned_truncation_.exchange(true))
        log_info("dataset '{}': examples longer than max_length {} are truncated (first: {}, {} "
                 "tokens)",
                 opt_.path, *opt_.max_length, where(), s.example.input_ids.size());
      s.example.input_ids.resize(*opt_.max_length);
      s.example.labels.resize(*opt_.max_length);
    }
    return s;
  }

  Slot take_inline() {
    Slot s;
    try {
      RawRow raw = read_next();
      read_pos_++;
      s = process(raw);
    } catch (...) {
      s.kind = Slot::Fatal;
      s.error = std::current_exception();
    }
    return s;
  }

  Slot take_threaded() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return done_.count(consumed_) > 0; });
    auto it = done_.find(consumed_);
    Slot s = std::move(it->second);
    done_.erase(it);
    // consumed_ is advanced by next(); let the reader run ahead one more row.
    consumer_pos_ = consumed_ + 1;
    l.unlock();
    cv_.notify_all();
    return s;
  }

  void reader_loop() {
    for (;;) {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || read_pos_ - consumer_pos_ < opt_.prefetch; });
      if (stop_ || read_pos_ >= total()) return;
      int64_t pos = read_pos_;
      l.unlock();
      RawRow raw;
      std::exception_ptr err;
      try {
        raw = read_next();
      } catch (...) {
        err = std::current_exception();
      }
      l.lock();
      read_pos_++;
      if (err) {
        Slot s;
        s.kind = Slot::Fatal;
        s.error = err;
        done_[pos] = std::move(s);
        read_pos_ = total();  // nothing after a read error
        l.unlock();
        cv_.notify_all();
        return;
      }
      queue_.push_back(std::move(raw));
      l.unlock();
      cv_.notify_all();
    }
  }

  void worker_loop() {
    for (;;) {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      RawRow raw = std::move(queue_.front());
      queue_.pop_front();
      l.unlock();
      int64_t pos = raw.position;
      Slot s;
      try {
        s = process(raw);
      } catch (...) {
        s.kind = Slot::Fatal;
        s.error = std::current_exception();
      }
      l.lock();
      done_[pos] = std::move(s);
      l.unlock();
      cv_.notify_all();
    }
  }

  std::shared_ptr<const SourceIndex> idx_;
  ChatDatasetOptions opt_;
  DataContext ctx_;
  int64_t epoch_;
  EpochOrder order_;
  int64_t consumed_;
  int64_t skipped_;
  std::exception_ptr failed_;
  mutable std::atomic<bool> warned_truncation_{false};

  // Reader state (reader thread only, or the consumer when num_workers == 0).
  int64_t window_ = -1;
  std::vector<RawRow> rows_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int64_t read_pos_;         // next position the reader reads (guarded by mu_ when threaded)
  int64_t consumer_pos_;     // backpressure mark (guarded by mu_)
  std::deque<RawRow> queue_;
  std::map<int64_t, Slot> done_;
  std::thread reader_;
  std::vector<std::thread> workers_;
};

}  // namespace

std::shared_ptr<const SourceIndex> ChatDataset::index() {
  std::lock_guard<std::mutex> l(mu_);
  if (!index_) {
    try {
      index_ = SourceIndex::build(resolve_files(opt_.path, opt_.split));
    } catch (Error& e) {
      e.add_context(fmt::format("while opening dataset '{}'", opt_.path));
      throw;
    }
    log_info("dataset '{}': {} files, {} rows", opt_.path, index_->files().size(),
             index_->num_rows());
  }
  return index_;
}

std::unique_ptr<ExampleStream> ChatDataset::open(const DataContext& ctx, int64_t epoch,
                                                 const std::string& cursor) {
  QRUN_ASSERT(ctx.tokenizer != nullptr && ctx.chat_format != nullptr,
              "chat dataset opened without a tokenizer and chat format");
  auto idx = index();
  int64_t start = 0, skipped = 0;
  if (!cursor.empty()) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(cursor);
      QRUN_CHECK(j.is_object() && j.value("v", 0) == 1, "unknown cursor format");
      QRUN_CHECK(j.at("epoch").get<int64_t>() == epoch,
                 "the cursor is for epoch {}, but epoch {} was opened", j.at("epoch").get<int64_t>(),
                 epoch);
      QRUN_CHECK(j.at("rows").get<int64_t>() == idx->num_rows(),
                 "the dataset changed since the cursor was saved ({} rows then, {} now)",
                 j.at("rows").get<int64_t>(), idx->num_rows());
      QRUN_CHECK(j.at("seed").get<uint64_t>() == ctx.seed && j.at("shuffle").get<bool>() == opt_.shuffle,
                 "the cursor was saved with seed {} and shuffle {}, now seed {} and shuffle {}; the "
                 "order would differ",
                 j.at("seed").get<uint64_t>(), j.at("shuffle").get<bool>(), ctx.seed, opt_.shuffle);
      start = j.at("position").get<int64_t>();
      skipped = j.at("skipped").get<int64_t>();
      QRUN_CHECK(start >= 0 && start <= idx->num_rows(), "cursor position {} is out of range",
                 start);
    } catch (const nlohmann::json::exception& e) {
      fail("invalid dataset cursor '{}': {}", cursor, e.what());
    } catch (Error& e) {
      e.add_context(fmt::format("while resuming dataset '{}' from cursor {}", opt_.path, cursor));
      throw;
    }
  }
  auto s = std::make_unique<ChatStream>(idx, opt_, ctx, epoch, start, skipped);
  return s;
}

}  // namespace qrun::chatdata
