// plugins/synthetic/synthetic.cpp - dataset `synthetic`: `count` examples per epoch of uniformly
// random token ids, every token a loss token, with lengths drawn from
//   lognormal  exp(N(log(median), sigma)), truncated to an integer (the chat-like default:
//              median 900, sigma 0.75, as ../shared/bench/hf_anchor.py draws its samples)
//   uniform    uniform in [min_len, max_len]
//   fixed      always `median`
// and clamped to [min_len, max_len]. Example i of epoch e depends only on (run seed, e, i), so a
// stream reopened at a cursor continues exactly (exact resume) and two runs with one seed see the
// same batches (`qrun compare`).
#include <qrun/sdk.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

struct Spec {
  std::string lengths;
  double median = 900, sigma = 0.75;
  int64_t min_len = 16, max_len = 8192, count = 100000, vocab = 0;
};

class SyntheticStream final : public qrun::ExampleStream {
 public:
  SyntheticStream(const Spec& s, int64_t vocab, uint64_t seed, int64_t epoch, int64_t start)
      : s_(s), vocab_(vocab), seed_(seed), epoch_(epoch), next_(start) {}

  std::optional<qrun::Example> next() override {
    if (next_ >= s_.count) return std::nullopt;
    std::mt19937_64 rng(splitmix64(seed_ ^ splitmix64(static_cast<uint64_t>(epoch_) << 32 ^
                                                        static_cast<uint64_t>(next_))));
    int64_t len = 0;
    if (s_.lengths == "lognormal") {
      std::lognormal_distribution<double> d(std::log(s_.median), s_.sigma);
      len = static_cast<int64_t>(d(rng));
    } else if (s_.lengths == "uniform") {
      len = std::uniform_int_distribution<int64_t>(s_.min_len, s_.max_len)(rng);
    } else {
      len = static_cast<int64_t>(s_.median);
    }
    len = std::clamp(len, s_.min_len, s_.max_len);
    qrun::Example e;
    e.id = next_++;
    e.input_ids.resize(static_cast<size_t>(len));
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab_ - 1));
    for (auto& t : e.input_ids) t = tok(rng);
    e.labels = e.input_ids;
    return e;
  }
  std::string cursor() const override { return std::to_string(next_); }

 private:
  Spec s_;
  int64_t vocab_;
  uint64_t seed_;
  int64_t epoch_, next_;
};

class Synthetic final : public qrun::Dataset {
 public:
  explicit Synthetic(const qrun::Config& c) {
    s_.lengths = c.get_string("lengths");
    s_.median = c.get_float("median");
    s_.sigma = c.get_float("sigma");
    s_.min_len = c.get_int("min_len");
    s_.max_len = c.get_int("max_len");
    s_.count = c.get_int("count");
    s_.vocab = c.get_int("vocab");
    QRUN_CHECK(s_.min_len <= s_.max_len, "{}: min_len {} is above max_len {}", c.location("min_len"),
               s_.min_len, s_.max_len);
    vocab_where_ = c.location("vocab");
  }

  std::unique_ptr<qrun::ExampleStream> open(const qrun::DataContext& ctx, int64_t epoch,
                                            const std::string& cursor) override {
    int64_t vocab = s_.vocab;
    if (vocab == 0) {
      QRUN_CHECK(ctx.tokenizer != nullptr, "{}: vocab is 0 (the tokenizer's) but no tokenizer is named",
                 vocab_where_);
      vocab = ctx.tokenizer->vocab_size();
    }
    int64_t start = 0;
    if (!cursor.empty()) {
      try {
        size_t used = 0;
        start = std::stoll(cursor, &used);
        QRUN_CHECK(used == cursor.size() && start >= 0, "bad cursor");
      } catch (const std::exception&) {
        throw qrun::UserError(fmt::format("synthetic: cursor '{}' is not an example index", cursor));
      }
    }
    return std::make_unique<SyntheticStream>(s_, vocab, ctx.seed, epoch, start);
  }

 private:
  Spec s_;
  std::string vocab_where_;
};

void register_synthetic(qrun::Registrar& r) {
  using qrun::Field;
  r.add<qrun::Dataset>(
      "synthetic", "random token sequences with a chat-like length mix (no data set needed)",
      qrun::Schema{
          Field::choice("lengths", "lognormal", {"lognormal", "uniform", "fixed"})
              .doc("length distribution: lognormal (median, sigma), uniform [min_len, max_len], "
                   "fixed (median)"),
          Field::number("median", 900.0).min(1).doc("median length in tokens (lognormal, fixed)"),
          Field::number("sigma", 0.75).min(0).max(10).doc("log-space standard deviation (lognormal)"),
          Field::integer("min_len", 16).min(1).doc("shortest example, tokens"),
          Field::integer("max_len", 8192).min(1).doc("longest example, tokens (cap)"),
          Field::integer("count", 100000).min(1).doc("examples per epoch"),
          Field::integer("vocab", 0).min(0).max(1 << 30).doc(
              "token ids are drawn from [0, vocab); 0 = the tokenizer's vocabulary size"),
      },
      [](const qrun::Config& c) { return std::make_unique<Synthetic>(c); });
}

}  // namespace

QRUN_PLUGIN("synthetic", "0.1.0", register_synthetic)
