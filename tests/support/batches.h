// tests/support/batches.h - Batch builders for tests: samples laid out packed (one token stream,
// per-sample positions, cu_seqlens, seq_idx) or padded (right padding), exactly as the collators
// lay them out (sdk/include/qrun/sdk/batch.h). Needs only the SDK and ATen, so tests that must
// build without the host's dependencies (the GPU machine's fallback build) can use it.
#pragma once

#include <qrun/sdk/batch.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

namespace qrun::test {

struct Sample {
  at::Tensor ids;     // int64 [L]
  at::Tensor labels;  // int64 [L]
};

inline Batch packed_batch(const std::vector<Sample>& s) {
  Batch b;
  b.layout = Layout::Packed;
  std::vector<at::Tensor> ids, labels, pos;
  std::vector<int64_t> cu = {0};
  std::vector<int32_t> sid;
  for (size_t i = 0; i < s.size(); ++i) {
    int64_t L = s[i].ids.size(0);
    ids.push_back(s[i].ids);
    labels.push_back(s[i].labels);
    pos.push_back(at::arange(L, at::kLong));
    cu.push_back(cu.back() + L);
    for (int64_t t = 0; t < L; ++t) sid.push_back(static_cast<int32_t>(i));
    b.seq.max_seqlen = std::max(b.seq.max_seqlen, L);
    b.loss_tokens += s[i].labels.narrow(0, 1, std::max<int64_t>(L - 1, 0)).ne(kIgnoreIndex).sum().item<int64_t>();
  }
  b.input_ids = at::cat(ids);
  b.labels = at::cat(labels);
  b.position_ids = at::cat(pos);
  b.seq.layout = Layout::Packed;
  b.seq.cu_seqlens_host = cu;
  b.seq.cu_seqlens = at::tensor(cu, at::kLong).to(at::kInt);
  b.seq.seq_idx = at::tensor(sid, at::TensorOptions().dtype(at::kInt));
  b.real_tokens = cu.back();
  return b;
}

inline Batch padded_batch(const std::vector<Sample>& s) {
  Batch b;
  b.layout = Layout::Padded;
  int64_t B = static_cast<int64_t>(s.size()), S = 1;
  for (const auto& x : s) S = std::max(S, x.ids.size(0));
  b.input_ids = at::zeros({B, S}, at::kLong);
  b.labels = at::full({B, S}, kIgnoreIndex, at::kLong);
  b.position_ids = at::zeros({B, S}, at::kLong);
  b.seq.attention_mask = at::zeros({B, S}, at::kBool);
  b.seq.seq_idx = at::full({B, S}, -1, at::kInt);
  std::vector<int64_t> cu = {0};
  for (int64_t i = 0; i < B; ++i) {
    int64_t L = s[i].ids.size(0);
    b.input_ids[i].narrow(0, 0, L).copy_(s[i].ids);
    b.labels[i].narrow(0, 0, L).copy_(s[i].labels);
    b.position_ids[i].narrow(0, 0, L).copy_(at::arange(L, at::kLong));
    b.seq.attention_mask[i].narrow(0, 0, L).fill_(true);
    b.seq.seq_idx[i].narrow(0, 0, L).fill_(static_cast<int32_t>(i));
    cu.push_back(cu.back() + L);
    b.seq.max_seqlen = std::max(b.seq.max_seqlen, L);
    b.loss_tokens += s[i].labels.narrow(0, 1, std::max<int64_t>(L - 1, 0)).ne(kIgnoreIndex).sum().item<int64_t>();
  }
  b.seq.layout = Layout::Padded;
  b.seq.cu_seqlens_host = cu;
  b.seq.cu_seqlens = at::tensor(cu, at::kLong).to(at::kInt);
  b.real_tokens = cu.back();
  b.padding_tokens = B * S - cu.back();
  return b;
}

}  // namespace qrun::test
