// tests/plugins/zoo.cpp - the test plugin `test-zoo`: small but real components whose only job is
// to exercise the host (recipe validation over every field type, the data path, the ABI checks)
// without depending on the production plugins. Not installed.
//   tokenizer   zoo-bytes     UTF-8 bytes as token ids (0..255)
//   chat_format zoo-plain     "role: content\n", loss on assistant content
//   dataset     zoo-dataset   `count` deterministic synthetic examples, resumable cursor
//   collator    zoo-collator  greedy packing under a token budget (every schema field type)
//   profiler    zoo-profiler  logs step-time percentiles at the end of a run (float lists)
//   model       zoo-bigram    embedding -> tanh -> vocabulary head over bytes; trains in seconds
//   transport   test-store    CPU collectives over c10d's TCPStore (store_transport.cpp)
//   ops         zoo-scaled-ops  only SwiGLU (the other operations stay the reference's), its
//                             output scaled by `swiglu_scale` (1 = the exact formula): a backend
//                             that changes the numbers on purpose, for `qrun compare`
#include <qrun/sdk.h>
#include <qrun/sdk/kernels.h>

#include <ATen/ATen.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>

namespace zoo {
void register_store_transport(qrun::Registrar& r);  // store_transport.cpp
}

namespace {

class ZooBytes : public qrun::Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text, bool) const override {
    return std::vector<int32_t>(reinterpret_cast<const unsigned char*>(text.data()),
                                reinterpret_cast<const unsigned char*>(text.data()) + text.size());
  }
  std::string decode(const std::vector<int32_t>& ids, bool) const override {
    std::string s;
    for (int32_t i : ids) s.push_back(static_cast<char>(i));
    return s;
  }
  std::optional<int32_t> token_to_id(std::string_view t) const override {
    if (t.size() == 1) return static_cast<unsigned char>(t[0]);
    return std::nullopt;
  }
  int64_t vocab_size() const override { return 256; }
};

class ZooPlain : public qrun::ChatFormat {
 public:
  qrun::Example render(const std::vector<qrun::Message>& conv, const qrun::Tokenizer& tok,
                       qrun::LossOn loss_on) const override {
    QRUN_CHECK(!conv.empty(), "empty conversation");
    qrun::Example e;
    for (const auto& m : conv) {
      auto head = tok.encode(m.role + ": ");
      auto body = tok.encode(m.content + "\n");
      bool train_body = loss_on == qrun::LossOn::All || m.role == "assistant";
      for (int32_t id : head) {
        e.input_ids.push_back(id);
        e.labels.push_back(loss_on == qrun::LossOn::All ? id : qrun::kIgnoreIndex);
      }
      for (int32_t id : body) {
        e.input_ids.push_back(id);
        e.labels.push_back(train_body ? id : qrun::kIgnoreIndex);
      }
    }
    return e;
  }
};

class ZooStream : public qrun::ExampleStream {
 public:
  ZooStream(int64_t count, int64_t min_len, int64_t max_len, uint64_t seed, int64_t start)
      : count_(count), min_(min_len), max_(max_len), seed_(seed), next_(start) {}
  std::optional<qrun::Example> next() override {
    if (next_ >= count_) return std::nullopt;
    std::mt19937_64 rng(seed_ * 1000003ULL + static_cast<uint64_t>(next_));
    int64_t len = min_ + static_cast<int64_t>(rng() % static_cast<uint64_t>(max_ - min_ + 1));
    qrun::Example e;
    e.id = next_++;
    for (int64_t t = 0; t < len; ++t) {
      int32_t tok = static_cast<int32_t>(rng() % 256);
      e.input_ids.push_back(tok);
      e.labels.push_back(t < len / 2 ? qrun::kIgnoreIndex : tok);  // "prompt" half untrained
    }
    return e;
  }
  std::string cursor() const override { return std::to_string(next_); }

 private:
  int64_t count_, min_, max_;
  uint64_t seed_;
  int64_t next_;
};

class ZooDataset : public qrun::Dataset {
 public:
  explicit ZooDataset(const qrun::Config& c)
      : count_(c.get_int("count")), min_(c.get_int("min_len")), max_(c.get_int("max_len")) {
    QRUN_CHECK(min_ <= max_, "{}: min_len {} is larger than max_len {}", c.location("min_len"),
               min_, max_);
  }
  std::unique_ptr<qrun::ExampleStream> open(const qrun::DataContext& ctx, int64_t epoch,
                                            const std::string& cursor) override {
    int64_t start = cursor.empty() ? 0 : std::stoll(cursor);
    return std::make_unique<ZooStream>(count_, min_, max_, ctx.seed + 7919ULL * epoch, start);
  }

 private:
  int64_t count_, min_, max_;
};

class ZooCollator : public qrun::Collator {
 public:
  explicit ZooCollator(const qrun::Config& c)
      : budget_(c.get_int("tokens_per_batch")),
        single_(c.get_string("strategy") == "single"),
        drop_overlong_(c.get_bool("drop_overlong")),
        stats_file_(c.get_optional_string("stats_file").value_or("")) {}

  std::optional<qrun::Batch> next(qrun::ExampleStream& s) override {
    std::vector<qrun::Example> take;
    int64_t used = 0;
    while (true) {
      std::optional<qrun::Example> e;
      if (pending_) e = std::move(pending_), pending_.reset();
      else e = s.next();
      if (!e) break;
      int64_t n = static_cast<int64_t>(e->input_ids.size());
      if (n > budget_) {
        if (drop_overlong_) continue;
        e->input_ids.resize(budget_);
        e->labels.resize(budget_);
        n = budget_;
      }
      if (used + n > budget_ || (single_ && !take.empty())) {
        pending_ = std::move(e);
        break;
      }
      used += n;
      take.push_back(std::move(*e));
    }
    if (take.empty()) return std::nullopt;
    std::vector<int64_t> ids, labels, pos;
    std::vector<int32_t> cu = {0}, seq;
    qrun::Batch b;
    for (const auto& e : take) {
      for (size_t t = 0; t < e.input_ids.size(); ++t) {
        ids.push_back(e.input_ids[t]);
        labels.push_back(e.labels[t]);
        pos.push_back(static_cast<int64_t>(t));
        seq.push_back(static_cast<int32_t>(cu.size() - 1));
        if (t > 0 && e.labels[t] != qrun::kIgnoreIndex) b.loss_tokens++;
      }
      cu.push_back(static_cast<int32_t>(ids.size()));
      b.seq.max_seqlen = std::max<int64_t>(b.seq.max_seqlen, e.input_ids.size());
      b.sample_ids.push_back(e.id);
    }
    b.input_ids = at::tensor(ids, at::kLong);
    b.labels = at::tensor(labels, at::kLong);
    b.position_ids = at::tensor(pos, at::kLong);
    b.seq.cu_seqlens = at::tensor(cu, at::kInt);
    b.seq.cu_seqlens_host.assign(cu.begin(), cu.end());
    b.seq.seq_idx = at::tensor(seq, at::kInt);
    b.real_tokens = static_cast<int64_t>(ids.size());
    if (!stats_file_.empty()) {
      std::FILE* f = std::fopen(stats_file_.c_str(), "a");
      QRUN_CHECK(f != nullptr, "zoo-collator: cannot append to stats_file {}", stats_file_);
      std::fprintf(f, "%zu %lld\n", take.size(), static_cast<long long>(b.real_tokens));
      std::fclose(f);
    }
    return b;
  }

  // The example held back for the next batch: "id|ids|labels" (comma lists), or "{}".
  std::string state() const override {
    if (!pending_) return "{}";
    auto list = [](const std::vector<int32_t>& v) {
      std::string s;
      for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
      return s;
    };
    return std::to_string(pending_->id) + "|" + list(pending_->input_ids) + "|" + list(pending_->labels);
  }
  void restore(const std::string& state) override {
    pending_.reset();
    if (state == "{}" || state.empty()) return;
    auto parse = [](const std::string& s) {
      std::vector<int32_t> v;
      size_t start = 0;
      while (start < s.size()) {
        size_t end = s.find(',', start);
        if (end == std::string::npos) end = s.size();
        v.push_back(std::stoi(s.substr(start, end - start)));
        start = end + 1;
      }
      return v;
    };
    size_t a = state.find('|'), b = state.find('|', a + 1);
    QRUN_CHECK(a != std::string::npos && b != std::string::npos, "zoo-collator: bad state '{}'", state);
    qrun::Example e;
    e.id = std::stoll(state.substr(0, a));
    e.input_ids = parse(state.substr(a + 1, b - a - 1));
    e.labels = parse(state.substr(b + 1));
    pending_ = std::move(e);
  }

 private:
  int64_t budget_;
  bool single_, drop_overlong_;
  std::string stats_file_;
  std::optional<qrun::Example> pending_;
};

class ZooProfiler : public qrun::Profiler {
 public:
  explicit ZooProfiler(const qrun::Config& c) : percentiles_(c.get_float_list("percentiles")) {}
  void on_run_start(const std::string&) override { times_.clear(); }
  void on_step_begin(int64_t) override {}
  void on_step_end(const qrun::StepRecord& r) override { times_.push_back(r.seconds); }
  void on_run_end() override {
    if (times_.empty()) return;
    std::sort(times_.begin(), times_.end());
    for (double p : percentiles_) {
      size_t i = std::min(times_.size() - 1, static_cast<size_t>(p / 100.0 * times_.size()));
      qrun::log_info("zoo-profiler: p{} step time {:.4f}s", p, times_[i]);
    }
  }

 private:
  std::vector<double> percentiles_;
  std::vector<double> times_;
};

// A tiny real model for trainer tests: logits = tanh(E[ids]) W^T, loss shifted inside samples.
class ZooBigram : public qrun::Model {
 public:
  explicit ZooBigram(const qrun::Config& c)
      : hidden_(c.get_int("hidden")), oom_at_forward_(c.get_int("oom_at_forward")) {}

  void build(const qrun::ModelKernels&, const qrun::ModelPlacement& p) override {
    auto opt = at::TensorOptions().dtype(p.param_dtype).device(p.device);
    auto gen = at::detail::createCPUGenerator(p.seed);
    embed_ = (at::randn({256, hidden_}, gen) * 0.5).to(opt).set_requires_grad(true);
    head_ = (at::randn({256, hidden_}, gen) * 0.1).to(opt).set_requires_grad(true);
  }

  qrun::ModelOutput forward(const qrun::Batch& b, bool return_logits) override {
    // Test knob: the out-of-memory error the CUDA caching allocator throws, on CPU.
    if (++forward_calls_ == oom_at_forward_)
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate 20.00 GiB "
                       "(zoo-bigram oom_at_forward test knob)");
    at::Tensor ids = b.input_ids.reshape({-1});
    at::Tensor labels = b.labels.reshape({-1});
    at::Tensor seq = b.seq.seq_idx.reshape({-1});
    int64_t t = ids.size(0);
    at::Tensor logits = at::matmul(at::tanh(embed_.index_select(0, ids)), head_.t()).to(at::kFloat);
    // The target of position i is labels[i + 1] of the same sample (batch.h).
    at::Tensor targets = at::full({t}, qrun::kIgnoreIndex, labels.options());
    if (t > 1) {
      at::Tensor same = seq.slice(0, 1).eq(seq.slice(0, 0, t - 1)).logical_and(seq.slice(0, 0, t - 1).ge(0));
      targets.slice(0, 0, t - 1).copy_(at::where(same, labels.slice(0, 1), at::full_like(labels.slice(0, 1), qrun::kIgnoreIndex)));
    }
    qrun::ModelOutput out;
    out.loss_sum = at::cross_entropy_loss(logits, targets, {}, at::Reduction::Sum, qrun::kIgnoreIndex);
    out.loss_tokens = targets.ne(qrun::kIgnoreIndex).sum().item<int64_t>();
    if (return_logits) out.logits = logits;
    return out;
  }

  std::vector<std::pair<std::string, at::Tensor>> named_parameters() override {
    return {{"embed.weight", embed_}, {"head.weight", head_}};
  }

  void save(const std::string& dir, const std::map<std::string, at::Tensor>& values) override {
    torch::serialize::OutputArchive ar;
    for (auto& [n, p] : named_parameters()) ar.write(n, values.empty() ? p.detach() : values.at(n));
    ar.save_to(dir + "/zoo-bigram.pt");
  }

  double train_flops_per_token(const std::vector<int64_t>&) const override {
    return 6.0 * 256 * static_cast<double>(hidden_);
  }

  qrun::ModelSummary summary() const override {
    qrun::ModelSummary s;
    s.family = "zoo-bigram";
    s.num_layers = 1;
    s.hidden_size = hidden_;
    s.vocab_size = 256;
    s.num_parameters = 2 * 256 * hidden_;
    s.description = fmt::format("zoo-bigram, hidden {}", hidden_);
    return s;
  }

 private:
  int64_t hidden_;
  int64_t oom_at_forward_;
  int64_t forward_calls_ = 0;
  at::Tensor embed_, head_;
};

// Provides only `swiglu` (the rest of the operations come from the reference in a run, sdk
// ops.h): silu(gate) * up * swiglu_scale.
class ZooScaledOps final : public qrun::Ops {
 public:
  explicit ZooScaledOps(const qrun::Config& c) : scale_(c.get_float("swiglu_scale")) {}
  void provide(qrun::OpTable& t, const std::string& provider) override {
    const double scale = scale_;
    t.provide<qrun::op::SwiGlu>(
        [scale](const at::Tensor& gate, const at::Tensor& up) { return at::silu(gate) * up * scale; }, provider);
  }

 private:
  double scale_;
};

void register_zoo(qrun::Registrar& r) {
  zoo::register_store_transport(r);
  r.add<qrun::Model>("zoo-bigram", "a tiny byte-level model for trainer tests",
                     qrun::Schema{qrun::Field::integer("hidden", 16).min(1).max(4096).doc("embedding width"),
                                  qrun::Field::integer("oom_at_forward", 0).min(0).doc(
                                      "throw c10::OutOfMemoryError on this forward call "
                                      "(1-based; tests; 0 = never)")},
                     [](const qrun::Config& c) { return std::make_unique<ZooBigram>(c); });
  using qrun::Field;
  r.add<qrun::Tokenizer>("zoo-bytes", "UTF-8 bytes as token ids (tests)", qrun::Schema{},
                         [](const qrun::Config&) { return std::make_unique<ZooBytes>(); });
  r.add<qrun::ChatFormat>("zoo-plain", "'role: content' lines, loss on assistant (tests)",
                          qrun::Schema{},
                          [](const qrun::Config&) { return std::make_unique<ZooPlain>(); });
  r.add<qrun::Dataset>(
      "zoo-dataset", "deterministic synthetic examples (tests)",
      qrun::Schema{
          Field::integer("count").require().min(1).max(1000000).doc("examples per epoch"),
          Field::integer("min_len", 1).min(1).doc("shortest example, tokens"),
          Field::integer("max_len", 64).min(1).doc("longest example, tokens"),
      },
      [](const qrun::Config& c) { return std::make_unique<ZooDataset>(c); });
  r.add<qrun::Collator>(
      "zoo-collator", "greedy packing under a token budget (tests)",
      qrun::Schema{
          Field::integer("tokens_per_batch", 64).min(1).max(1 << 20).doc("token budget"),
          Field::choice("strategy", "greedy", {"greedy", "single"}).doc("greedy packing or one sample per batch"),
          Field::boolean("drop_overlong", false).doc("drop samples over the budget instead of truncating"),
          Field::path("stats_file").doc("if set, one line per batch (samples, tokens) is appended here").optional(),
      },
      [](const qrun::Config& c) { return std::make_unique<ZooCollator>(c); });
  r.add<qrun::Profiler>(
      "zoo-profiler", "step-time percentiles (tests)",
      qrun::Schema{Field::float_list("percentiles", {50.0, 90.0}).min(0).max(100).size(2).doc(
                       "two percentiles to log at the end")},
      [](const qrun::Config& c) { return std::make_unique<ZooProfiler>(c); });
  r.add<qrun::Ops>("zoo-scaled-ops", "SwiGLU only, its output scaled (tests)",
                   qrun::Schema{Field::number("swiglu_scale", 1.0).doc("factor on SwiGLU's output")},
                   [](const qrun::Config& c) { return std::make_unique<ZooScaledOps>(c); });
}

}  // namespace

QRUN_PLUGIN("test-zoo", "1.0.0", register_zoo)
