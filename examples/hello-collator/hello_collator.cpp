// hello_collator.cpp - a complete qrun plugin in one page: a collator that puts a fixed number of
// samples into each packed batch. Build it against an installed qrun (see README.md).
#include <qrun/sdk.h>

#include <ATen/ATen.h>

namespace {

class HelloCollator : public qrun::Collator {
 public:
  explicit HelloCollator(const qrun::Config& cfg) : per_batch_(cfg.get_int("samples_per_batch")) {}

  std::optional<qrun::Batch> next(qrun::ExampleStream& examples) override {
    std::vector<qrun::Example> taken;
    while (static_cast<int64_t>(taken.size()) < per_batch_) {
      auto e = examples.next();
      if (!e) break;
      taken.push_back(std::move(*e));
    }
    if (taken.empty()) return std::nullopt;

    // The batch contract (qrun/sdk/batch.h): one token stream, boundaries as explicit data.
    std::vector<int64_t> ids, labels, pos;
    std::vector<int32_t> cu = {0}, seq_idx;
    qrun::Batch b;
    for (const auto& e : taken) {
      for (size_t t = 0; t < e.input_ids.size(); ++t) {
        ids.push_back(e.input_ids[t]);
        labels.push_back(e.labels[t]);
        pos.push_back(static_cast<int64_t>(t));
        seq_idx.push_back(static_cast<int32_t>(cu.size() - 1));
        // A label is a target unless it is the sample's first token (the shift stays inside it).
        if (t > 0 && e.labels[t] != qrun::kIgnoreIndex) b.loss_tokens++;
      }
      cu.push_back(static_cast<int32_t>(ids.size()));
      b.seq.max_seqlen = std::max<int64_t>(b.seq.max_seqlen, e.input_ids.size());
      b.sample_ids.push_back(e.id);
    }
    auto i64 = [](std::vector<int64_t>& v) { return at::tensor(v, at::kLong); };
    b.layout = qrun::Layout::Packed;
    b.input_ids = i64(ids);
    b.labels = i64(labels);
    b.position_ids = i64(pos);
    b.seq.layout = qrun::Layout::Packed;
    b.seq.cu_seqlens = at::tensor(cu, at::kInt);
    b.seq.cu_seqlens_host.assign(cu.begin(), cu.end());
    b.seq.seq_idx = at::tensor(seq_idx, at::kInt);
    b.real_tokens = static_cast<int64_t>(ids.size());
    return b;
  }

 private:
  int64_t per_batch_;
};

void register_components(qrun::Registrar& r) {
  r.add<qrun::Collator>(
      "hello-collator", "packs a fixed number of samples into each batch (an SDK example)",
      qrun::Schema{qrun::Field::integer("samples_per_batch", 4).min(1).max(4096).doc(
          "samples in each packed batch")},
      [](const qrun::Config& c) { return std::make_unique<HelloCollator>(c); });
}

}  // namespace

QRUN_PLUGIN("hello-collator", "0.1.0", register_components)
