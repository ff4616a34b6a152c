// qrun/sdk/ops.h - the `ops` kind: the named element-wise and row-wise operations a model calls
// (norms, the gated norm, SwiGLU, the query/key norm with RoPE, the loss), each from whichever
// backend provides it.
//
// Note [Ops per operation]
// An operation is a type in namespace qrun::op: a name (kName), a call signature (Fn, a
// std::function) and a signature tag (kSig). A backend adds the operations it implements to an
// OpTable in Ops::provide(). The host builds the table a model receives from the kind's reference
// backend (`reference`, reference-kernels plugin) first and the recipe's backend over it: a fused
// backend may provide only some operations (only the loss, only the norms), the rest stay the
// reference's, and the run's log, the resolved recipe and `qrun plugins explain` say which
// backend each operation comes from.
//
// Adding an operation adds a type below and its reference implementation. No interface changes,
// so no ABI bump and no plugin rebuilt: a plugin built before the operation existed does not
// provide it. The table compares each entry's kSig with the caller's, so a plugin built against
// an older declaration of the same name is refused with a message instead of being called with
// other arguments.
//
// Unless an operation says otherwise: tensors are token-major with any number of leading dims,
// the operation's own dims last; the result has x's dtype; statistics (norm moments, softmax
// sums) are at least fp32. Every operation is differentiable in every floating input.
//
// Added in SDK 3 (replacing SDK 1's fixed Ops methods).
#pragma once

#include <qrun/sdk/component.h>
#include <qrun/sdk/error.h>
#include <qrun/sdk/kernels.h>

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace qrun {
namespace op {

// RMSNorm over the last dim: n = x * rsqrt(mean(x^2) + eps) in fp32; y = n * (1 + w) when
// zero_centred (Qwen3.5's layer norms), else n * w; the product in fp32, then cast to x's dtype.
struct RmsNorm {
  static constexpr const char* kName = "rms_norm";
  static constexpr const char* kSig = "Tensor(Tensor x, Tensor weight, float eps, bool zero_centred)";
  using Fn = std::function<at::Tensor(const at::Tensor& x, const at::Tensor& weight, double eps,
                                      bool zero_centred)>;
};

// The residual add and the RMSNorm after it: s = x + residual (rounded to x's dtype, as the
// unfused add stores it), y = RmsNorm(s). Returns {y, s}; s is the residual stream the layer
// carries on.
struct AddRmsNorm {
  static constexpr const char* kName = "add_rms_norm";
  static constexpr const char* kSig =
      "(Tensor y, Tensor s)(Tensor x, Tensor residual, Tensor weight, float eps, bool zero_centred)";
  using Fn = std::function<std::pair<at::Tensor, at::Tensor>(
      const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps,
      bool zero_centred)>;
};

// The gated RMSNorm of a Gated DeltaNet layer, over the last dim (one head): n = rmsnorm(x) cast
// to x's dtype; y = (w * n) * silu(z) with w and silu(z) in fp32; cast to x's dtype.
struct GatedRmsNorm {
  static constexpr const char* kName = "gated_rms_norm";
  static constexpr const char* kSig = "Tensor(Tensor x, Tensor z, Tensor weight, float eps)";
  using Fn = std::function<at::Tensor(const at::Tensor& x, const at::Tensor& z,
                                      const at::Tensor& weight, double eps)>;
};

// silu(gate) * up.
struct SwiGlu {
  static constexpr const char* kName = "swiglu";
  static constexpr const char* kSig = "Tensor(Tensor gate, Tensor up)";
  using Fn = std::function<at::Tensor(const at::Tensor& gate, const at::Tensor& up)>;
};

// SwiGLU over one GEMM's output: gate_up [.., 2I] holds gate in [0, I) and up in [I, 2I) of its
// last dim; returns silu(gate) * up [.., I].
struct SwiGluPacked {
  static constexpr const char* kName = "swiglu_packed";
  static constexpr const char* kSig = "Tensor(Tensor gate_up)";
  using Fn = std::function<at::Tensor(const at::Tensor& gate_up)>;
};

// The query/key path of an attention layer before the kernel: RmsNorm over each head (x
// [.., heads, D], weight [D]), then rotary embedding of the first R dims of every head in the
// rotate-half (NeoX) form with cos/sin [.., 1, R] broadcast over heads (R even, dims R.. pass
// through). x may be a strided view (the query half of a query/gate projection).
struct QkNormRope {
  static constexpr const char* kName = "qk_norm_rope";
  static constexpr const char* kSig =
      "Tensor(Tensor x, Tensor weight, float eps, bool zero_centred, Tensor cos, Tensor sin)";
  using Fn = std::function<at::Tensor(const at::Tensor& x, const at::Tensor& weight, double eps,
                                      bool zero_centred, const at::Tensor& cos,
                                      const at::Tensor& sin)>;
};

// Sum over rows of cross_entropy(hidden @ weight^T, targets) in fp32, rows with target -100
// ignored. hidden [N, H], weight [V, H], targets int64 [N]. A fused backend never materialises
// the [N, V] logits. Returns a 0-dim fp32 tensor.
struct LinearCrossEntropy {
  static constexpr const char* kName = "linear_cross_entropy_sum";
  static constexpr const char* kSig = "Tensor(Tensor hidden, Tensor weight, Tensor targets)";
  using Fn = std::function<at::Tensor(const at::Tensor& hidden, const at::Tensor& weight,
                                      const at::Tensor& targets)>;
};

// The optimizer step the host runs after the backward (not called by models): AdamW over lists
// of tensors, in place. Per i, params[i], grads[i], exp_avgs[i], exp_avg_sqs[i] contiguous, of
// one size and one dtype (every i the same dtype); steps[i] a 0-dim fp32 count on their device.
// grad_scale, found_inf: optional 0-dim fp32 tensors on that device, read by the kernel (no host
// read). Where found_inf is nonzero nothing changes. Otherwise, in at least fp32, with
// t = steps[i] + 1 and g = grads[i] / grad_scale (1 when undefined):
//   p = p (1 - lr wd);  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p = p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps);  steps[i] = t
// (LibTorch's AdamW). The host uses a backend's step when the recipe's ops backend provides one,
// else LibTorch's fused multi-tensor kernel; the reference's is the formula, for `qrun check`.
struct AdamWStep {
  static constexpr const char* kName = "adamw_step";
  static constexpr const char* kSig =
      "()(Tensor[] params, Tensor[] grads, Tensor[] exp_avgs, Tensor[] exp_avg_sqs, Tensor[] steps, "
      "float lr, float beta1, float beta2, float weight_decay, float eps, Tensor grad_scale, Tensor found_inf)";
  using Fn = std::function<void(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                                const std::vector<at::Tensor>& exp_avgs,
                                const std::vector<at::Tensor>& exp_avg_sqs,
                                const std::vector<at::Tensor>& steps, double lr, double beta1,
                                double beta2, double weight_decay, double eps,
                                const at::Tensor& grad_scale, const at::Tensor& found_inf)>;
};

// The gradient norm's sum before clipping (not called by models): the sum of the squares of
// every element of every tensor (one dtype, any sizes, contiguous), accumulated in fp64; a 0-dim
// fp64 tensor on their device, computed without a host read.
struct SquareSum {
  static constexpr const char* kName = "square_sum";
  static constexpr const char* kSig = "Tensor(Tensor[] tensors)";
  using Fn = std::function<at::Tensor(const std::vector<at::Tensor>& tensors)>;
};

}  // namespace op

// The operations a model may call, each with the backend that provides it (Note [Ops per
// operation]). Filled on the host's main thread before the model is built; read-only after.
class OpTable {
 public:
  // Adds (or replaces) an operation. `provider`: the backend's name, for reports.
  template <class Op>
  void provide(typename Op::Fn fn, std::string provider) {
    QRUN_ASSERT(fn != nullptr, "op {} provided by {} is empty", Op::kName, provider);
    Entry e;
    e.sig = Op::kSig;
    e.provider = std::move(provider);
    e.fn = std::make_shared<typename Op::Fn>(std::move(fn));
    entries_[Op::kName] = std::move(e);
  }

  template <class Op>
  bool has() const {
    auto it = entries_.find(Op::kName);
    return it != entries_.end() && it->second.sig == Op::kSig;
  }

  // The operation; a UserError when no backend provides it (or only with another signature).
  template <class Op>
  const typename Op::Fn& get() const {
    auto it = entries_.find(Op::kName);
    QRUN_CHECK(it != entries_.end(),
               "no ops backend provides '{}' (kernels.ops names a backend that lacks it and the "
               "reference ops are not installed)", Op::kName);
    QRUN_CHECK(it->second.sig == Op::kSig,
               "ops backend '{}' provides '{}' with another signature ({}; this qrun expects {}): "
               "rebuild the plugin against this SDK", it->second.provider, Op::kName, it->second.sig,
               Op::kSig);
    return *static_cast<const typename Op::Fn*>(it->second.fn.get());
  }

  // (operation, provider) for every operation, by name.
  std::vector<std::pair<std::string, std::string>> providers() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& [name, e] : entries_) out.emplace_back(name, e.provider);
    return out;
  }

 private:
  struct Entry {
    std::string sig, provider;
    std::shared_ptr<const void> fn;  // a typename Op::Fn
  };
  std::map<std::string, Entry> entries_;
};

// A backend of operations (Note [Ops per operation]).
class Ops : public KernelBackend {
 public:
  static constexpr const char* kKind = "ops";
  // Adds the operations this backend implements, each with `provider` (the recipe's name for the
  // backend) as its provider. Called once per run, before the model is built.
  virtual void provide(OpTable& table, const std::string& provider) = 0;
};

}  // namespace qrun
