// plugins/flash-attention: the `flash-varlen` attention backend.
//
// What it runs: the variable-length FlashAttention-2 kernels that LibTorch ships
// (at::_flash_attention_forward / at::_flash_attention_backward, sm_80+ code, head dims up to
// 256), causal, with the batch's cu_seqlens: no [L, L] scores are materialised and grouped K/V
// heads are read as they are (the kernels map query head h to kv head h / (Hq / Hkv)), never
// repeated in memory. Interchangeable with `sdpa` by one recipe line:
//     kernels: { attention: flash-varlen }
// Why not written here: the rule - LibTorch already has the kernel; FlashAttention-3 is
// not in the wheel, and the wheel's cuDNN variable-length attention has a known backward crash.
//
// Note [Flash layouts]
// Packed [T, H, D]: the samples are cu_seqlens_host; tokens after its last offset (a collator's
// budget padding) belong to no sample: the kernels run on the covered prefix and those tokens get
// o = 0 and no gradient (as sdpa gives them). Padded [B, S, H, D] with right padding: the B rows
// run as B sequences of S tokens each (cu = 0, S, 2S, ...); attention is causal, so a real token
// never attends to the padding after it, and padding outputs are then set to 0 by selection.
//
// Numerics: bf16 or fp16 in, fp32 softmax statistics and accumulation, one rounding of the output
// (the kernels' own). fp32 activations are refused with a message (a silent bf16 rounding would
// pass an fp32 run off as fp32). The backward's dq accumulation uses atomics: gradients are not
// bitwise deterministic from run to run (about 1 bf16 ulp).
#include <qrun/sdk/error.h>
#include <qrun/sdk/kernels.h>
#include <qrun/sdk/plugin.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>
#include <optional>
#include <vector>

namespace qrun {
namespace {

constexpr const char* kName = "flash-varlen";
constexpr int64_t kMaxHeadDim = 256;

std::string why_not(c10::DeviceType device, c10::ScalarType dtype, int64_t q_heads, int64_t kv_heads,
                    int64_t head_dim) {
  if (device != c10::DeviceType::CUDA)
    return "this backend runs on CUDA only (LibTorch's flash-attention kernels), not on " +
           c10::DeviceTypeName(device, true) + " (sdpa runs everywhere)";
  if (dtype != at::kBFloat16 && dtype != at::kHalf)
    return std::string("the flash kernels take bf16 or fp16 activations, not ") + c10::toString(dtype) +
           " (set precision.compute: bf16, or use sdpa)";
  if (head_dim > kMaxHeadDim || (head_dim > 0 && head_dim % 8 != 0))
    return "head_dim " + std::to_string(head_dim) + " is not a multiple of 8 up to 256, what the flash kernels take";
  if (q_heads > 0 && kv_heads > 0 && q_heads % kv_heads != 0)
    return std::to_string(q_heads) + " query heads are not a multiple of " + std::to_string(kv_heads) + " kv heads";
  return {};
}

// The padded layout's row offsets [0, S, ..., B*S] on the device, built once per (B, S, device).
at::Tensor row_offsets(int64_t B, int64_t S, const at::Device& dev) {
  static std::mutex mu;
  static std::optional<std::tuple<int64_t, int64_t, at::Device>> key;
  static at::Tensor& cached = *new at::Tensor();  // never destroyed: outlives CUDA's teardown
  std::lock_guard<std::mutex> lock(mu);
  if (!key || *key != std::make_tuple(B, S, dev)) {
    at::Tensor host = at::arange(0, (B + 1) * S, S, at::TensorOptions().dtype(at::kInt)).pin_memory();
    cached = host.to(dev, /*non_blocking=*/true);
    key = std::make_tuple(B, S, dev);
  }
  return cached;
}

struct FlashFn : public torch::autograd::Function<FlashFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& cu, int64_t max_len, double scale) {
    auto [o, lse, rng, unused, dbg] = at::_flash_attention_forward(q, k, v, cu, cu, max_len, max_len, 0.0,
                                                                   /*is_causal=*/true,
                                                                   /*return_debug_mask=*/false, scale);
    (void)dbg;
    ctx->save_for_backward({q, k, v, o, lse, cu, rng, unused});
    ctx->saved_data["max_len"] = max_len;
    ctx->saved_data["scale"] = scale;
    return o;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto s = ctx->get_saved_variables();
    const int64_t max_len = ctx->saved_data["max_len"].toInt();
    const double scale = ctx->saved_data["scale"].toDouble();
    auto [dq, dk, dv] = at::_flash_attention_backward(grad[0].contiguous(), s[0], s[1], s[2], s[3], s[4], s[5],
                                                      s[5], max_len, max_len, 0.0, /*is_causal=*/true, s[6],
                                                      s[7], scale);
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class FlashVarlen final : public Attention {
 public:
  std::string unsupported(const KernelUse& u) const override {
    return why_not(u.device, u.dtype, u.heads, u.kv_heads, u.head_dim);
  }
  // Measured on an H100 (qrun check, 27B shapes included): forward <= 6.3e-4, gradients 1.1e-3 to
  // 2.1e-3 beyond bf16 storage. The shipped FA2 backward rounds the probabilities and dS to bf16
  // for its tensor-core products and, with grouped K/V heads, rounds each query head's dk/dv to
  // bf16 before summing the group: the worst gradient is always dk. The kernel is LibTorch's, not
  // ours to change; the bound is stated for it.
  std::pair<double, double> bf16_tolerance() const override { return {2e-3, 4e-3}; }

  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const SeqInfo& seq,
                     double scale) override {
    const bool packed = seq.layout == Layout::Packed;
    const int64_t lead = packed ? 1 : 2;
    QRUN_CHECK(q.dim() == lead + 2 && k.dim() == lead + 2 && v.dim() == lead + 2,
               "{}: q, k, v must be [{}, heads, dim] for a {} batch", kName, packed ? "T" : "B, S",
               layout_name(seq.layout));
    const std::string why = why_not(q.device().type(), q.scalar_type(), q.size(-2), k.size(-2), q.size(-1));
    QRUN_CHECK(why.empty(), "{} cannot run this call: {}", kName, why);
    QRUN_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
               "{}: q, k and v must share a dtype", kName);
    // The kernels read each head's D elements contiguously.
    at::Tensor qc = q.stride(-1) == 1 ? q : q.contiguous();
    at::Tensor kc = k.stride(-1) == 1 ? k : k.contiguous();
    at::Tensor vc = v.stride(-1) == 1 ? v : v.contiguous();
    if (packed) {
      const int64_t T = q.size(0);
      const int64_t covered = seq.cu_seqlens_host.empty() ? 0 : seq.cu_seqlens_host.back();
      QRUN_CHECK(covered <= T, "{}: cu_seqlens covers {} tokens of a {}-token batch", kName, covered, T);
      if (covered == 0) return at::zeros_like(q);
      QRUN_CHECK(seq.cu_seqlens.defined() && seq.cu_seqlens.scalar_type() == at::kInt,
                 "{}: SeqInfo.cu_seqlens must be an int32 device tensor", kName);
      at::Tensor cu = seq.cu_seqlens.device() == q.device() ? seq.cu_seqlens : seq.cu_seqlens.to(q.device());
      auto part = [&](const at::Tensor& x) { return covered < T ? x.narrow(0, 0, covered) : x; };
      // The kernels launch query blocks for max_seqlen: never trust a smaller value.
      int64_t longest = 1;
      for (int64_t i = 0; i < seq.num_seqs(); ++i) longest = std::max(longest, seq.seq_len(i));
      at::Tensor o = FlashFn::apply(part(qc), part(kc), part(vc), cu, longest, scale);
      if (covered < T) o = at::constant_pad_nd(o, {0, 0, 0, 0, 0, T - covered});
      return o;
    }
    const int64_t B = q.size(0), S = q.size(1);
    if (B == 0 || S == 0) return at::zeros_like(q);
    auto flat = [&](const at::Tensor& x) { return x.reshape({B * S, x.size(2), x.size(3)}); };
    at::Tensor o = FlashFn::apply(flat(qc), flat(kc), flat(vc), row_offsets(B, S, q.device()), S, scale)
                       .view(q.sizes());
    QRUN_CHECK(seq.attention_mask.defined(), "{}: a padded batch needs SeqInfo.attention_mask", kName);
    at::Tensor mask = seq.attention_mask.to(q.device()).view({B, S, 1, 1});
    return at::where(mask, o, at::zeros({}, o.options()));
  }
};

void register_all(Registrar& r) {
  r.add<Attention>(kName,
                   "LibTorch's variable-length FlashAttention-2 kernels (CUDA, bf16/fp16, causal, "
                   "GQA without repeated K/V, head_dim up to 256)",
                   Schema{}, [](const Config&) { return std::make_unique<FlashVarlen>(); });
}

}  // namespace
}  // namespace qrun

QRUN_PLUGIN("flash-attention", "0.1.0", qrun::register_all)
