// qrun/sdk/batch.h - the batch contract between collators and the model and its kernels.
//
// Note [Packing boundaries are data]
// The most common silent bug in this field is state leaking across packed samples in the
// linear-attention and conv layers (the layers that carry state along the token axis). So sample
// boundaries are explicit fields of every batch, never inferred from position ids:
//   * cu_seqlens (int32, [num_seqs + 1]) is the single source of truth;
//   * seq_idx (int32, per token) is derived from it (conv reset; -1 marks padding);
//   * position_ids restart at 0 for every sample (RoPE).
// Invariant, tested for every backend: a packed batch gives the same loss and gradients as
// running each sample alone.
//
// Labels are NOT shifted: labels[t] is the label of token t, -100 means "no loss". The model
// shifts inside each sample (the target of position t is labels[t + 1] of the same sample), so
// the first label of every sample is never a target and nothing predicts across a boundary.
//
// Added in SDK 1.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace qrun {

enum class Layout {
  Packed,  // one 1-D token stream of concatenated samples: tensors are [T]
  Padded,  // one sample per row, right-padded: tensors are [B, S]; the honest A/B baseline
};

inline const char* layout_name(Layout l) { return l == Layout::Packed ? "packed" : "padded"; }

constexpr int64_t kIgnoreIndex = -100;

// Boundaries of the sequences in a batch, as the attention / linear-attention / conv kernels
// consume them. Tensors live on the compute device; the host-side copies let kernels plan their
// launches without a device-to-host sync.
struct SeqInfo {
  Layout layout = Layout::Packed;
  // Packed: int32 [N + 1] offsets of each sample in the token stream.
  // Padded: int32 [B + 1] running sum of the rows' real lengths (the unpadded offsets).
  at::Tensor cu_seqlens;
  std::vector<int64_t> cu_seqlens_host;  // the same offsets, on the host
  int64_t max_seqlen = 0;
  // int32, same shape as input_ids: the sample a token belongs to; -1 for padding tokens.
  at::Tensor seq_idx;
  // Padded only: bool [B, S], true for real tokens. Undefined for packed batches.
  at::Tensor attention_mask;

  int64_t num_seqs() const {
    return cu_seqlens_host.empty() ? 0 : static_cast<int64_t>(cu_seqlens_host.size()) - 1;
  }
  int64_t seq_len(int64_t i) const { return cu_seqlens_host[i + 1] - cu_seqlens_host[i]; }
};

struct Batch {
  Layout layout = Layout::Packed;
  at::Tensor input_ids;     // int64; [T] packed, [B, S] padded
  at::Tensor labels;        // int64, same shape; -100 = no loss (not shifted, see the Note)
  at::Tensor position_ids;  // int64, same shape; 0-based within each sample, 0 on padding
  SeqInfo seq;              // boundaries (cu_seqlens, seq_idx, mask)

  // Counts, computed by the collator (exact, on the host).
  int64_t real_tokens = 0;     // tokens of samples
  int64_t padding_tokens = 0;  // tokens added to fill rows (padded layout) or the budget
  int64_t loss_tokens = 0;     // tokens that are a target after the in-sample shift

  std::vector<int64_t> sample_ids;  // dataset ids of the samples, in order (for error reports)

  int64_t num_seqs() const { return seq.num_seqs(); }

  // A copy with every tensor moved to `device` (non-blocking where possible).
  Batch to(const at::Device& device) const {
    Batch b = *this;
    auto mv = [&](at::Tensor& t) {
      if (t.defined()) t = t.to(device, /*non_blocking=*/true);
    };
    mv(b.input_ids);
    mv(b.labels);
    mv(b.position_ids);
    mv(b.seq.cu_seqlens);
    mv(b.seq.seq_idx);
    mv(b.seq.attention_mask);
    return b;
  }
};

}  // namespace qrun
