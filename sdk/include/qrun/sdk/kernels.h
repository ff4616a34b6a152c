// qrun/sdk/kernels.h - the layer-level kernel kinds a model calls: attention, linear_attention
// and conv1d (the fourth, ops, is in ops.h), and what a backend says it can run.
//
// A model never hard-codes a backend: it receives one component of each kind (named in the
// recipe's `kernels:` section) and calls them. All are differentiable: the tensors they return
// carry autograd history (a fused backend wraps its kernels in a torch::autograd::Function).
//
// Layouts are token-major. With SeqInfo::layout == Packed the token axis is one stream of
// concatenated samples ([T, ...]); with Padded it is [B, S, ...] with right padding. Every
// backend must honour the boundaries of SeqInfo: no attention, no recurrent state and no conv tap
// crosses a sample boundary (batch.h, Note [Packing boundaries are data]).
//
// Note [Kernel backend contract] (streams, memory, autograd), for every kind here and in ops.h:
//   * Stream: launch on the current stream of the inputs' device
//     (at::cuda::getCurrentCUDAStream(), under a c10::cuda::CUDAGuard for that device) and
//     never synchronise the host with the device inside a call: no .item(), no reading a device
//     tensor on the host, no cudaDeviceSynchronize. Sample boundaries are on the host already
//     (SeqInfo::cu_seqlens_host) for planning launches.
//   * Memory: outputs, saved tensors and scratch come from LibTorch's caching allocator
//     (at::empty and friends, on the inputs' device), never cudaMalloc: the allocator's pool is
//     what the run's peak-memory report and its out-of-memory hints see. Scratch may be released
//     at the end of the call; nothing may be cached across calls that holds a batch's memory
//     (a small plan keyed by the batch's boundaries is fine).
//   * Autograd: under at::NoGradGuard (evaluation) a forward saves nothing for backward. In
//     training, save what the backward needs in the autograd context (tensors, or a workspace
//     tensor); a backward may run long after its forward and in another order than the forwards
//     (activation checkpointing reruns a layer's forward inside the backward pass), so a call
//     must not depend on another call's state. Inputs must not be modified in place.
//   * Threads: calls come from one host thread at a time (the trainer's); backward from the
//     autograd engine's thread for that device.
//
// Note [What a backend can run]: before any weight is loaded, the host asks the model which
// kernel uses it will make (Model::kernel_uses: the device, the activations' dtype, the batch
// layout and each kind's shape facts) and asks each backend whether it can run them
// (unsupported(): an empty string means yes; otherwise one sentence of what it cannot do, e.g.
// "head_dim 320 is above the 256 the flash kernels take"). `qrun validate` and the start of a
// run stop with the recipe location of kernels.<kind>, the backend, the use and the backends that
// can run it; there is never a silent fallback. Added in SDK 3.
//
// `qrun check <kind>/<name>` runs a backend against the reference of its kind over a grid of
// shapes, packed and padded, forward and backward. Added in SDK 1.
#pragma once

#include <qrun/sdk/batch.h>
#include <qrun/sdk/component.h>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <utility>

namespace qrun {

// One way a model will call a backend of `kind` (Note [What a backend can run]). The shape facts
// by kind: attention: heads (query), kv_heads, head_dim; linear_attention: heads (key), kv_heads
// (value heads), head_dim (key dim), value_dim; conv1d: channels, width; ops: head_dim (the
// per-head norms' size), channels (the hidden size), value_dim (the vocabulary). 0: not used.
struct KernelUse {
  std::string kind;
  c10::DeviceType device = c10::DeviceType::CPU;
  c10::ScalarType dtype = c10::ScalarType::Float;  // activations
  Layout layout = Layout::Packed;
  int64_t heads = 0, kv_heads = 0, head_dim = 0, value_dim = 0, channels = 0, width = 0;
  std::string what;  // the model's words for the use, e.g. "the full-attention layers"

  // "cuda, BFloat16, packed: 24 query / 4 kv heads, head_dim 256 (the full-attention layers)"
  std::string describe() const {
    std::string shape;
    auto add = [&](const std::string& s) { shape += (shape.empty() ? "" : ", ") + s; };
    if (kind == "attention") {
      add(std::to_string(heads) + " query / " + std::to_string(kv_heads) + " kv heads");
      add("head_dim " + std::to_string(head_dim));
    } else if (kind == "linear_attention") {
      add(std::to_string(heads) + " key / " + std::to_string(kv_heads) + " value heads");
      add("key dim " + std::to_string(head_dim) + ", value dim " + std::to_string(value_dim));
    } else if (kind == "conv1d") {
      add(std::to_string(channels) + " channels, width " + std::to_string(width));
    } else {
      if (channels) add("hidden " + std::to_string(channels));
      if (head_dim) add("head_dim " + std::to_string(head_dim));
      if (value_dim) add("vocabulary " + std::to_string(value_dim));
    }
    std::string s = std::string(c10::DeviceTypeName(device, /*lower_case=*/true)) + ", " +
                    c10::toString(dtype) + ", " + layout_name(layout);
    if (!shape.empty()) s += ": " + shape;
    if (!what.empty()) s += " (" + what + ")";
    return s;
  }
};

// What every kernel kind shares: the answer to "can you run this?".
class KernelBackend : public Component {
 public:
  // Empty when the backend can run `use`; else one sentence saying what it cannot do.
  virtual std::string unsupported(const KernelUse& use) const {
    (void)use;
    return {};
  }
  // The error `qrun check` holds the backend to in bf16 ({forward, gradients}; norm-wise, beyond
  // the bf16 storage of the result). A backend that states more than 2e-3 says why in its
  // source (e.g. a shipped kernel that rounds an intermediate to bf16).
  virtual std::pair<double, double> bf16_tolerance() const { return {2e-3, 2e-3}; }
};

// Causal softmax attention within sample boundaries, with grouped-query heads.
class Attention : public KernelBackend {
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
class LinearAttention : public KernelBackend {
 public:
  static constexpr const char* kKind = "linear_attention";
  // Returns o: [.., HV, V] in v's dtype. The recurrent state starts at zero for every sample.
  virtual at::Tensor forward(const GatedDeltaInputs& in, const SeqInfo& seq,
                             const GatedDeltaOptions& opt) = 0;
};

enum class Activation { None, SiLU };

// Causal depthwise convolution along the token axis, zero left context at every sample start.
class Conv1d : public KernelBackend {
 public:
  static constexpr const char* kKind = "conv1d";
  // x: [T, C] or [B, S, C]; weight: [C, W] (W taps, the last one multiplies the current token).
  // Returns act(conv(x)) with x's shape and dtype (computed in the weight's dtype).
  virtual at::Tensor forward(const at::Tensor& x, const at::Tensor& weight, const SeqInfo& seq,
                             Activation act) = 0;
};

}  // namespace qrun
