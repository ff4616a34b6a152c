// collators.cpp - see collators.h.
#include "collators.h"

#include <qrun/sdk/log.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/TensorOptions.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <numeric>

namespace qrun::chatdata {
namespace {

int64_t round_up(int64_t x, int64_t m) { return m <= 1 ? x : (x + m - 1) / m * m; }

at::Tensor empty_long(at::IntArrayRef s) { return at::empty(s, c10::TensorOptions().dtype(at::kLong)); }
at::Tensor empty_int(at::IntArrayRef s) { return at::empty(s, c10::TensorOptions().dtype(at::kInt)); }

Field budget_field() {
  return Field::integer("tokens_per_batch", 8192).min(1).doc("token budget of one micro-batch");
}
Field multiple_field(int64_t def) {
  return Field::integer("pad_to_multiple", def).min(1).doc("round the padded length up to this");
}
Field pad_id_field() { return Field::integer("pad_id", 0).min(0).doc("token id written on padding"); }
Field overlong_field() {
  return Field::choice("overlong", "truncate", {"truncate", "drop"})
      .doc("a sample longer than the budget: keep its first tokens, or drop it (counted)");
}

}  // namespace

int64_t count_loss_tokens(const Example& e) {
  int64_t n = 0;
  for (size_t t = 1; t < e.labels.size(); t++) n += e.labels[t] != kIgnoreIndex;
  return n;
}

Schema padded_collator_schema() {
  return Schema{budget_field().doc("token budget: rows x padded length <= this"),
                multiple_field(8), pad_id_field(), overlong_field()};
}

Schema packed_collator_schema() {
  return Schema{
      budget_field().doc("token budget: the sum of the packed samples' lengths <= this"),
      Field::choice("strategy", "greedy", {"greedy", "best-fit"})
          .doc("greedy: in order; best-fit: best-fit-decreasing within `window` examples"),
      Field::integer("window", 256).min(1).doc("best-fit: examples considered together"),
      overlong_field(),
      multiple_field(1).doc("round the packed length up to this with a padding tail"),
      pad_id_field(),
  };
}

CollatorOptions collator_options(const Config& c, bool packed) {
  CollatorOptions o;
  o.tokens_per_batch = c.get_int("tokens_per_batch");
  o.pad_to_multiple = c.get_int("pad_to_multiple");
  o.pad_id = c.get_int("pad_id");
  o.overlong_drop = c.get_string("overlong") == "drop";
  if (packed) {
    o.best_fit = c.get_string("strategy") == "best-fit";
    o.window = c.get_int("window");
  }
  if (!packed)
    QRUN_CHECK(o.pad_to_multiple <= o.tokens_per_batch,
               "{}: pad_to_multiple ({}) is larger than tokens_per_batch ({})", c.path(),
               o.pad_to_multiple, o.tokens_per_batch);
  return o;
}

// ---------------------------------------------------------------- batch builders

Batch make_packed_batch(const std::vector<const Example*>& xs, int64_t pad_to_multiple,
                        int64_t pad_id) {
  Batch b;
  b.layout = Layout::Packed;
  b.seq.layout = Layout::Packed;
  int64_t real = 0, maxlen = 0;
  for (auto* x : xs) {
    real += static_cast<int64_t>(x->input_ids.size());
    maxlen = std::max<int64_t>(maxlen, static_cast<int64_t>(x->input_ids.size()));
  }
  int64_t total = round_up(real, pad_to_multiple);
  b.input_ids = empty_long({total});
  b.labels = empty_long({total});
  b.position_ids = empty_long({total});
  b.seq.seq_idx = empty_int({total});
  b.seq.cu_seqlens = empty_int({static_cast<int64_t>(xs.size()) + 1});
  auto* ids = b.input_ids.data_ptr<int64_t>();
  auto* lab = b.labels.data_ptr<int64_t>();
  auto* pos = b.position_ids.data_ptr<int64_t>();
  auto* sid = b.seq.seq_idx.data_ptr<int32_t>();
  auto* cu = b.seq.cu_seqlens.data_ptr<int32_t>();
  int64_t off = 0;
  cu[0] = 0;
  b.seq.cu_seqlens_host.push_back(0);
  for (size_t i = 0; i < xs.size(); i++) {
    const Example& x = *xs[i];
    int64_t n = static_cast<int64_t>(x.input_ids.size());
    for (int64_t t = 0; t < n; t++) {
      ids[off + t] = x.input_ids[t];
      lab[off + t] = x.labels[t];
      pos[off + t] = t;
      sid[off + t] = static_cast<int32_t>(i);
    }
    off += n;
    cu[i + 1] = static_cast<int32_t>(off);
    b.seq.cu_seqlens_host.push_back(off);
    b.loss_tokens += count_loss_tokens(x);
    b.sample_ids.push_back(x.id);
  }
  for (int64_t t = off; t < total; t++) {
    ids[t] = pad_id;
    lab[t] = kIgnoreIndex;
    pos[t] = 0;
    sid[t] = -1;
  }
  b.seq.max_seqlen = maxlen;
  b.real_tokens = real;
  b.padding_tokens = total - real;
  return b;
}

Batch make_padded_batch(const std::vector<const Example*>& xs, int64_t pad_to_multiple,
                        int64_t pad_id) {
  Batch b;
  b.layout = Layout::Padded;
  b.seq.layout = Layout::Padded;
  int64_t B = static_cast<int64_t>(xs.size()), maxlen = 0, real = 0;
  for (auto* x : xs) {
    maxlen = std::max<int64_t>(maxlen, static_cast<int64_t>(x->input_ids.size()));
    real += static_cast<int64_t>(x->input_ids.size());
  }
  int64_t S = round_up(maxlen, pad_to_multiple);
  b.input_ids = empty_long({B, S});
  b.labels = empty_long({B, S});
  b.position_ids = empty_long({B, S});
  b.seq.seq_idx = empty_int({B, S});
  b.seq.attention_mask = at::empty({B, S}, c10::TensorOptions().dtype(at::kBool));
  b.seq.cu_seqlens = empty_int({B + 1});
  auto* ids = b.input_ids.data_ptr<int64_t>();
  auto* lab = b.labels.data_ptr<int64_t>();
  auto* pos = b.position_ids.data_ptr<int64_t>();
  auto* sid = b.seq.seq_idx.data_ptr<int32_t>();
  auto* mask = b.seq.attention_mask.data_ptr<bool>();
  auto* cu = b.seq.cu_seqlens.data_ptr<int32_t>();
  cu[0] = 0;
  b.seq.cu_seqlens_host.push_back(0);
  int64_t off = 0;
  for (int64_t i = 0; i < B; i++) {
    const Example& x = *xs[i];
    int64_t n = static_cast<int64_t>(x.input_ids.size());
    for (int64_t t = 0; t < S; t++) {
      int64_t k = i * S + t;
      bool r = t < n;
      ids[k] = r ? x.input_ids[t] : pad_id;
      lab[k] = r ? x.labels[t] : kIgnoreIndex;
      pos[k] = r ? t : 0;
      sid[k] = r ? static_cast<int32_t>(i) : -1;
      mask[k] = r;
    }
    off += n;
    cu[i + 1] = static_cast<int32_t>(off);
    b.seq.cu_seqlens_host.push_back(off);
    b.loss_tokens += count_loss_tokens(x);
    b.sample_ids.push_back(x.id);
  }
  b.seq.max_seqlen = maxlen;
  b.real_tokens = real;
  b.padding_tokens = B * S - real;
  return b;
}

// ---------------------------------------------------------------- shared state

bool CollatorBase::pull(ExampleStream& s, int64_t max_len) {
  for (;;) {
    auto e = s.next();
    if (!e) return false;
    int64_t n = static_cast<int64_t>(e->input_ids.size());
    QRUN_ASSERT(e->labels.size() == e->input_ids.size(),
                "example {} has {} ids but {} labels", e->id, n, e->labels.size());
    if (n == 0) {
      dropped_++;
      log_warn("collator: example {} is empty; dropped", e->id);
      continue;
    }
    if (n > max_len) {
      if (opt_.overlong_drop) {
        dropped_++;
        if (dropped_ <= 20)
          log_warn("collator: example {} has {} tokens, more than the budget {}; dropped "
                   "(overlong: drop)",
                   e->id, n, max_len);
        continue;
      }
      truncated_++;
      if (truncated_ <= 20)
        log_warn("collator: example {} has {} tokens, more than the budget {}; truncated "
                 "(overlong: truncate)",
                 e->id, n, max_len);
      e->input_ids.resize(max_len);
      e->labels.resize(max_len);
    }
    buf_.push_back(Buffered{std::move(*e), arrived_++});
    return true;
  }
}

// The state is saved after every step, so buffered examples are stored compactly: ids as base64
// of little-endian int32; labels as a base64 bitmask when every label is -100 or the token itself
// (chat formats produce exactly that), else as base64 int32 too.
namespace {
const char* kB64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string b64(const uint8_t* p, size_t n) {
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = uint32_t(p[i]) << 16 | (i + 1 < n ? uint32_t(p[i + 1]) << 8 : 0) |
                 (i + 2 < n ? uint32_t(p[i + 2]) : 0);
    out += kB64[v >> 18 & 63];
    out += kB64[v >> 12 & 63];
    out += i + 1 < n ? kB64[v >> 6 & 63] : '=';
    out += i + 2 < n ? kB64[v & 63] : '=';
  }
  return out;
}

std::vector<uint8_t> unb64(const std::string& s) {
  static const auto table = [] {
    std::array<int, 256> t{};
    t.fill(-1);
    for (int i = 0; i < 64; i++) t[static_cast<unsigned char>(kB64[i])] = i;
    return t;
  }();
  QRUN_CHECK(s.size() % 4 == 0, "invalid collator state: bad base64 length");
  std::vector<uint8_t> out;
  out.reserve(s.size() / 4 * 3);
  for (size_t i = 0; i < s.size(); i += 4) {
    uint32_t v = 0;
    int pad = 0;
    for (int k = 0; k < 4; k++) {
      char c = s[i + k];
      int d = c == '=' ? (pad++, 0) : table[static_cast<unsigned char>(c)];
      QRUN_CHECK(d >= 0, "invalid collator state: bad base64 character");
      v = v << 6 | static_cast<uint32_t>(d);
    }
    out.push_back(static_cast<uint8_t>(v >> 16));
    if (pad < 2) out.push_back(static_cast<uint8_t>(v >> 8));
    if (pad < 1) out.push_back(static_cast<uint8_t>(v));
  }
  return out;
}

std::string pack_i32(const std::vector<int32_t>& v) {
  std::vector<uint8_t> bytes(v.size() * 4);
  for (size_t i = 0; i < v.size(); i++)
    for (int k = 0; k < 4; k++) bytes[i * 4 + k] = static_cast<uint8_t>(static_cast<uint32_t>(v[i]) >> (8 * k));
  return b64(bytes.data(), bytes.size());
}

std::vector<int32_t> unpack_i32(const std::string& s) {
  auto bytes = unb64(s);
  QRUN_CHECK(bytes.size() % 4 == 0, "invalid collator state: int32 array of {} bytes", bytes.size());
  std::vector<int32_t> v(bytes.size() / 4);
  for (size_t i = 0; i < v.size(); i++) {
    uint32_t x = 0;
    for (int k = 0; k < 4; k++) x |= uint32_t(bytes[i * 4 + k]) << (8 * k);
    v[i] = static_cast<int32_t>(x);
  }
  return v;
}
}  // namespace

// Each buffered example is encoded once (most of a best-fit window survives many steps), so a
// state() call costs a concatenation.
const std::string& CollatorBase::encoded(const Buffered& b) {
  if (!b.enc.empty()) return b.enc;
  const Example& e = b.ex;
  bool maskable = true;
  for (size_t t = 0; t < e.labels.size() && maskable; t++)
    maskable = e.labels[t] == kIgnoreIndex || e.labels[t] == e.input_ids[t];
  nlohmann::json it{{"id", e.id}, {"arrival", b.arrival}, {"ids", pack_i32(e.input_ids)}};
  if (maskable) {
    std::vector<uint8_t> bits((e.labels.size() + 7) / 8, 0);
    for (size_t t = 0; t < e.labels.size(); t++)
      if (e.labels[t] != kIgnoreIndex) bits[t / 8] |= static_cast<uint8_t>(1u << (t % 8));
    it["mask"] = b64(bits.data(), bits.size());
  } else {
    it["labels"] = pack_i32(e.labels);
  }
  b.enc = it.dump();
  return b.enc;
}

std::string CollatorBase::state() const {
  size_t n = 96;
  for (const auto& b : buf_) n += encoded(b).size() + 1;
  std::string out;
  out.reserve(n);
  out += fmt::format("{{\"arrived\":{},\"dropped\":{},\"truncated\":{},\"v\":1,\"buffer\":[", arrived_,
                     dropped_, truncated_);
  for (size_t i = 0; i < buf_.size(); i++) {
    if (i) out += ',';
    out += buf_[i].enc;
  }
  out += "]}";
  return out;
}

void CollatorBase::restore(const std::string& state) {
  buf_.clear();
  arrived_ = dropped_ = truncated_ = 0;
  if (state.empty() || state == "{}") return;
  try {
    auto j = nlohmann::json::parse(state);
    QRUN_CHECK(j.value("v", 0) == 1, "unknown collator state format");
    for (const auto& it : j.at("buffer")) {
      Buffered b;
      b.ex.id = it.at("id").get<int64_t>();
      b.arrival = it.at("arrival").get<int64_t>();
      b.ex.input_ids = unpack_i32(it.at("ids").get<std::string>());
      if (it.contains("mask")) {
        auto bits = unb64(it.at("mask").get<std::string>());
        QRUN_CHECK(bits.size() == (b.ex.input_ids.size() + 7) / 8, "buffered example {} is corrupt", b.ex.id);
        b.ex.labels.resize(b.ex.input_ids.size());
        for (size_t t = 0; t < b.ex.labels.size(); t++)
          b.ex.labels[t] = (bits[t / 8] >> (t % 8)) & 1 ? b.ex.input_ids[t] : static_cast<int32_t>(kIgnoreIndex);
      } else {
        b.ex.labels = unpack_i32(it.at("labels").get<std::string>());
      }
      QRUN_CHECK(b.ex.input_ids.size() == b.ex.labels.size(), "buffered example {} is corrupt",
                 b.ex.id);
      buf_.push_back(std::move(b));
    }
    arrived_ = j.at("arrived").get<int64_t>();
    dropped_ = j.at("dropped").get<int64_t>();
    truncated_ = j.at("truncated").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    fail("invalid collator state: {}", e.what());
  } catch (Error& e) {
    e.add_context("while restoring the collator state from a checkpoint");
    throw;
  }
}

// ---------------------------------------------------------------- padded

std::optional<Batch> PaddedCollator::next(ExampleStream& s) {
  const int64_t T = opt_.tokens_per_batch, m = opt_.pad_to_multiple;
  const int64_t max_len = m > 1 ? T / m * m : T;  // one sample alone must fit B=1
  std::vector<const Example*> rows;
  int64_t take = 0, S = 0;
  for (;;) {
    if (static_cast<size_t>(take) == buf_.size() && !pull(s, max_len)) break;
    const Example& x = buf_[take].ex;
    int64_t s2 = std::max(S, round_up(static_cast<int64_t>(x.input_ids.size()), m));
    if (take > 0 && (take + 1) * s2 > T) break;
    S = s2;
    take++;
  }
  if (take == 0) return std::nullopt;
  for (int64_t i = 0; i < take; i++) rows.push_back(&buf_[i].ex);
  Batch b = make_padded_batch(rows, m, opt_.pad_id);
  buf_.erase(buf_.begin(), buf_.begin() + take);
  return b;
}

// ---------------------------------------------------------------- packed

std::optional<Batch> PackedCollator::next(ExampleStream& s) {
  const int64_t T = opt_.tokens_per_batch;
  std::vector<size_t> chosen;
  if (!opt_.best_fit) {
    int64_t used = 0;
    for (size_t k = 0;; k++) {
      if (k == buf_.size() && !pull(s, T)) break;
      int64_t n = static_cast<int64_t>(buf_[k].ex.input_ids.size());
      if (used + n > T) break;
      used += n;
      chosen.push_back(k);
    }
  } else {
    while (static_cast<int64_t>(buf_.size()) < opt_.window && pull(s, T)) {
    }
    if (buf_.empty()) return std::nullopt;
    std::vector<size_t> order(buf_.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return buf_[a].ex.input_ids.size() > buf_[b].ex.input_ids.size();
    });
    // The buffer is in arrival order, so buf_[0] is the oldest.
    int64_t used = 0;
    if (arrived_ - buf_[0].arrival > 4 * opt_.window) {
      chosen.push_back(0);
      used = static_cast<int64_t>(buf_[0].ex.input_ids.size());
    }
    for (size_t k : order) {
      if (!chosen.empty() && chosen[0] == 0 && k == 0) continue;
      int64_t n = static_cast<int64_t>(buf_[k].ex.input_ids.size());
      if (used + n <= T) {
        used += n;
        chosen.push_back(k);
      }
    }
    std::sort(chosen.begin(), chosen.end());
  }
  if (chosen.empty()) return std::nullopt;
  std::vector<const Example*> xs;
  for (size_t k : chosen) xs.push_back(&buf_[k].ex);
  Batch b = make_packed_batch(xs, opt_.pad_to_multiple, opt_.pad_id);
  for (auto it = chosen.rbegin(); it != chosen.rend(); ++it) buf_.erase(buf_.begin() + *it);
  return b;
}

}  // namespace qrun::chatdata
