// plugins/causal-conv1d: the `causal-conv1d` conv1d backend - kernels/causal_conv1d (depthwise
// causal conv with the SiLU fused, forward and backward, on the model's token-major [T, C]
// layout, reset at sample boundaries through seq_idx) bound to LibTorch autograd.
// Interchangeable with `conv-reference` by one recipe line:
//     kernels: { conv1d: causal-conv1d }
//
// Layouts: packed [T, C] and padded [B, S, C] both run as one token stream (the padded rows
// flattened), with SeqInfo::seq_idx telling the samples apart (-1: padding, output 0). Every
// collator's batch carries seq_idx; for one without, it is built from cu_seqlens_host and uploaded
// on each call (never read back).
// Dtypes: x fp32, bf16 or fp16 (the output has x's dtype); the weight fp32 or x's dtype, any
// other is taken in fp32. Products and sums in fp32 (the kernels' numerics, causal_conv1d.h).
// Memory and streams as the SDK's Note [Kernel backend contract]: outputs and the backward's
// scratch from the caching allocator, launches on the current stream, nothing saved but the
// inputs (the backward recomputes the pre-activation).
#include <qrun/sdk/error.h>
#include <qrun/sdk/kernels.h>
#include <qrun/sdk/plugin.h>

#include <causal_conv1d.h>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

namespace qrun {
namespace {

constexpr const char* kName = "causal-conv1d";
namespace cc = qrun::conv1d;

std::optional<cc::DType> dtype_of(c10::ScalarType t) {
  if (t == at::kFloat) return cc::DType::F32;
  if (t == at::kBFloat16) return cc::DType::BF16;
  if (t == at::kHalf) return cc::DType::F16;
  return std::nullopt;
}

std::string why_not(c10::DeviceType device, c10::ScalarType dtype, int64_t width) {
  if (device != c10::DeviceType::CUDA)
    return "this backend runs on CUDA only, not on " + c10::DeviceTypeName(device, true) +
           " (conv-reference runs everywhere)";
  if (!dtype_of(dtype)) return std::string("it takes fp32, bf16 or fp16 activations, not ") + c10::toString(dtype);
  if (width > cc::kMaxWidth)
    return "width " + std::to_string(width) + " is above the " + std::to_string(cc::kMaxWidth) + " taps the kernels take";
  return {};
}

cc::Problem problem(const at::Tensor& x, const at::Tensor& w, const at::Tensor& seq_idx, bool silu) {
  cc::Problem p;
  p.T = x.size(0);
  p.C = x.size(1);
  p.W = static_cast<int>(w.size(1));
  p.silu = silu;
  p.x_dtype = *dtype_of(x.scalar_type());
  p.w_dtype = *dtype_of(w.scalar_type());
  p.x = x.data_ptr();
  p.ldx = x.stride(0);
  p.w = w.data_ptr();
  p.seq_idx = seq_idx.data_ptr<int32_t>();
  return p;
}

struct ConvFn : public torch::autograd::Function<ConvFn> {
  // x [T, C] (rows contiguous), w [C, W] contiguous (fp32 or x's dtype), seq_idx int32 [T].
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& seq_idx, bool silu) {
    c10::cuda::CUDAGuard guard(x.device());
    at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
    cc::forward(problem(x, w, seq_idx, silu), y.data_ptr(), y.stride(0), at::cuda::getCurrentCUDAStream());
    ctx->save_for_backward({x, w, seq_idx});
    ctx->saved_data["silu"] = silu;
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &w = s[1], &seq_idx = s[2];
    c10::cuda::CUDAGuard guard(x.device());
    at::Tensor dy = grad[0].scalar_type() == x.scalar_type() ? grad[0] : grad[0].to(x.scalar_type());
    if (dy.stride(-1) != 1 || dy.stride(0) < dy.size(1)) dy = dy.contiguous();
    const cc::Problem p = problem(x, w, seq_idx, ctx->saved_data["silu"].toBool());
    at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
    at::Tensor dw = at::empty_like(w);
    at::Tensor ws = at::empty({static_cast<int64_t>(cc::backward_workspace_bytes(p))}, x.options().dtype(at::kByte));
    cc::backward(p, dy.data_ptr(), dy.stride(0), dx.data_ptr(), dx.stride(0), dw.data_ptr(), ws.data_ptr(),
                 at::cuda::getCurrentCUDAStream());
    return {dx, dw, at::Tensor(), at::Tensor()};
  }
};

class CausalConv1d final : public Conv1d {
 public:
  std::string unsupported(const KernelUse& u) const override { return why_not(u.device, u.dtype, u.width); }

  at::Tensor forward(const at::Tensor& x, const at::Tensor& weight, const SeqInfo& seq, Activation act) override {
    const bool packed = seq.layout == Layout::Packed;
    const int64_t lead = packed ? 1 : 2;
    QRUN_CHECK(x.dim() == lead + 1, "{}: x must be [{}, C]", kName, packed ? "T" : "B, S");
    QRUN_CHECK(weight.dim() == 2 && weight.size(0) == x.size(-1),
               "{}: weight must be [C={}, W], got {}", kName, x.size(-1), weight.sizes());
    const std::string why = why_not(x.device().type(), x.scalar_type(), weight.size(1));
    QRUN_CHECK(why.empty(), "{} cannot run this call: {}", kName, why);
    QRUN_CHECK(weight.device() == x.device(), "{}: weight on {}, x on {}", kName, weight.device().str(),
               x.device().str());
    const int64_t C = x.size(-1), T = x.numel() / std::max<int64_t>(C, 1);
    at::Tensor w = weight;
    if (w.scalar_type() != at::kFloat && w.scalar_type() != x.scalar_type()) w = w.to(at::kFloat);
    w = w.contiguous();
    at::Tensor xf = x.reshape({T, C});
    if (xf.stride(-1) != 1) xf = xf.contiguous();
    at::Tensor sid = seq.seq_idx.defined() ? seq.seq_idx : seq_idx_of(seq, x);
    sid = sid.to(x.device()).to(at::kInt).reshape({T});
    if (!sid.is_contiguous()) sid = sid.contiguous();
    at::Tensor y = ConvFn::apply(xf, w, sid, act == Activation::SiLU);
    return y.view(x.sizes());
  }

 private:
  // seq_idx from the host offsets (packed: the stream; padded: row-major [B, S]), -1 elsewhere.
  static at::Tensor seq_idx_of(const SeqInfo& seq, const at::Tensor& x) {
    const auto& cu = seq.cu_seqlens_host;
    const bool packed = seq.layout == Layout::Packed;
    const int64_t rows = packed ? 1 : x.size(0), width = packed ? x.size(0) : x.size(1);
    at::Tensor h = at::full({rows * width}, -1, at::TensorOptions().dtype(at::kInt)).pin_memory();
    int32_t* p = h.data_ptr<int32_t>();
    for (size_t i = 0; i + 1 < cu.size(); ++i) {
      const int64_t len = cu[i + 1] - cu[i], base = packed ? cu[i] : static_cast<int64_t>(i) * width;
      for (int64_t t = 0; t < len && base + t < rows * width; ++t) p[base + t] = static_cast<int32_t>(i);
    }
    return h.to(x.device(), /*non_blocking=*/true);
  }
};

void register_all(Registrar& r) {
  r.add<Conv1d>(kName,
                "CUDA causal depthwise conv1d + SiLU on token-major [T, C], reset per sample "
                "(seq_idx), widths up to 4",
                Schema{}, [](const Config&) { return std::make_unique<CausalConv1d>(); });
}

}  // namespace
}  // namespace qrun

QRUN_PLUGIN("causal-conv1d", "0.1.0", qrun::register_all)
