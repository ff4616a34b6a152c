// qrun/sdk/kernels.h - the layer-level kernel kinds a model calls: attention, linear_attention,
// conv1d and ops.
//
// A model never hard-codes a backend: it receives one component of each kind (named in the
// recipe's `kernels:` section) and calls them. All four are differentiable: the tensors they return
// carry autograd history (a fused backend wraps its kernels in a torch::autograd::Function).
//
// Layouts are token-major. With SeqInfo::layout == Packed the token axis is one stream of
// concatenated samples ([T, ...]); with Padded it is [B, S, ...] with right padding. Every
// backend must honour the boundaries of SeqInfo: no attention, no recurrent state and no conv tap
// crosses a sample boundary (batch.h, Note [Packing boundaries are data]).
//
// `qrun check <kind>/<name>` runs a backend against the reference of its kind over a grid of
// shapes, packed and padded, forward and backward. Added in SDK 1.
#pragma once

#include <qrun/sdk/batch.h>
#include <qrun/sdk/component.h>

#include <ATen/core/Tensor.h>

namespace qrun {

// Causal softmax attention within sample boundaries, with grouped-query heads.
class Attention : public Component {
 public:
  static constexpr const char* kKind = "attention";
  // q: [T, Hq, D] (packed) or [B, S, Hq, D] (padded); k, v: the same with Hkv heads,
  // Hq % Hkv == 0 (query head h reads kv head h / (Hq / Hkv)). Returns [.., Hq, D] in q's dtype.
  virtual at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const SeqInfo& seq, double scale) = 0;
};

// The inputs of the Gated DeltaNet core, before its cheap element-wise prologue. Backends compute
// (or fuse) g = -exp(A_log) * softplus(a + dt_bias) in fp32 and beta = sigmoid(b).
struct GatedDeltaInputs {
  at::Tensor q;        // [.., H, K]  (after conv + SiLU)
  at::Tensor k;        // [.., H, K]
  at::Tensor v;        // [.., HV, V], HV % H == 0: value head h reads q/k head h / (HV / H)
  at::Tensor a;        // [.., HV]   gate pre-activation (in_proj_a output)
  at::Tensor b;        // [.., HV]   write-strength pre-activation (in_proj_b output)
  at::Tensor A_log;    // [HV] fp32 parameter
  at::Tensor dt_bias;  // [HV] parameter
};

struct GatedDeltaOptions {
  bool qk_l2norm = true;  // q, k <- x * rsqrt(sum(x^2) + 1e-6) per head, inside the op
  double scale = 0.0;     // query scale; 0 means K^-1/2
};

// The chunked gated delta rule (Qwen3.5 / Qwen3-Next linear attention), state reset per sample.
class LinearAttention : public Component {
 public:
  static constexpr const char* kKind = "linear_attention";
  // Returns o: [.., HV, V] in v's dtype. The recurrent state starts at zero for every sample.
  virtual at::Tensor forward(const GatedDeltaInputs& in, const SeqInfo& seq,
                             const GatedDeltaOptions& opt) = 0;
};

enum class Activation { None, SiLU };

// Causal depthwise convolution along the token axis, zero left context at every sample start.
class Conv1d : public Component {
 public:
  static constexpr const char* kKind = "conv1d";
  // x: [T, C] or [B, S, C]; weight: [C, W] (W taps, the last one multiplies the current token).
  // Returns act(conv(x)) with x's shape and dtype (computed in the weight's dtype).
  virtual at::Tensor forward(const at::Tensor& x, const at::Tensor& weight, const SeqInfo& seq,
                             Activation act) = 0;
};

// Normalisations, activations and the loss.
class Ops : public Component {
 public:
  static constexpr const char* kKind = "ops";
  // RMSNorm over the last dim, statistics in fp32. zero_centred: y = n * (1 + w) (Qwen3.5's
  // layer norms); else y = n * w. The product is taken in fp32 before the cast to x's dtype.
  virtual at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps,
                              bool zero_centred) = 0;
  // Gated RMSNorm of GDN: n = rmsnorm(x) cast to x's dtype; y = (w * n) * silu(z in fp32),
  // cast to x's dtype. Over the last dim (one head).
  virtual at::Tensor gated_rms_norm(const at::Tensor& x, const at::Tensor& z,
                                    const at::Tensor& weight, double eps) = 0;
  // silu(gate) * up.
  virtual at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) = 0;
  // Sum over rows of cross_entropy(hidden @ weight^T, targets), in fp32, rows with target -100
  // ignored. hidden: [N, H]; weight: [V, H]; targets: int64 [N]. A fused backend never
  // materialises the [N, V] logits. Returns a 0-dim fp32 tensor.
  virtual at::Tensor linear_cross_entropy_sum(const at::Tensor& hidden, const at::Tensor& weight,
                                              const at::Tensor& targets) = 0;
};

}  // namespace qrun
