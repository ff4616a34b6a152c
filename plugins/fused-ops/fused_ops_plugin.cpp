// plugins/fused-ops: the `fused` ops backend (sdk ops.h). Every operation of the reference, each
// as one CUDA kernel forward and one or two backward (kernels/fused_ops/fused_ops.h), the fused
// linear cross-entropy, and the optimizer's AdamW step and the gradient norm's square sum over all
// parameters in one launch each:
//     kernels: { ops: fused }                                   # every operation fused
//     kernels: { ops: {plugin: fused, exclude: [swiglu]} }      # swiglu from the reference
//
// Note [Fused linear cross-entropy]
// The loss over [N, H] hidden states and a [V, H] head never holds [N, V] logits: the rows go in
// chunks of `loss_chunk_tokens` (0: as many as make 1 GiB of logits; 4,324 rows at V = 248,320 in
// bf16), and for each chunk
//   logits = h_c W^T                      (cuBLAS, the hidden states' dtype, fp32 accumulation)
//   loss_c, dlogits = CE rows in place     (one kernel: logsumexp, the target, softmax - onehot)
//   dh_c = dlogits W,  dW += dlogits^T h_c (cuBLAS; the first chunk writes dW, the rest add to it)
// so the gradients are made in the forward pass, as Liger's fused linear cross-entropy does, and
// the peak extra memory is one chunk of logits. Targets outside [0, V) are ignored like -100 (the
// reference's cross_entropy stops with a device assert instead); the datasets check token ids. The logits are rounded to the hidden states'
// dtype before the softmax, as transformers' and the reference's bf16 head does. The backward
// multiplies both gradients by the loss's incoming gradient, a device tensor (1 / loss tokens in
// a run): no host synchronisation. Without gradients (evaluation) only the loss is computed.
//
// Memory and streams follow the SDK's Note [Kernel backend contract]. CUDA only; fp32, bf16 or
// fp16 activations (norm weights fp32 or the activations' dtype).
#include <qrun/sdk/error.h>
#include <qrun/sdk/log.h>
#include <qrun/sdk/ops.h>
#include <qrun/sdk/plugin.h>

#include <fused_ops.h>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <set>

namespace qrun {
namespace {

constexpr const char* kName = "fused";
namespace fo = qrun::fops;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

fo::DType dt(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return fo::DType::F32;
    case at::kBFloat16: return fo::DType::BF16;
    case at::kHalf: return fo::DType::F16;
    default: QRUN_CHECK(false, "{} ops take fp32, bf16 or fp16 tensors, not {}", kName, c10::toString(t.scalar_type()));
  }
  return fo::DType::F32;
}

void check_cuda(const at::Tensor& t, const char* op) {
  QRUN_CHECK(t.is_cuda(), "{} op {} runs on CUDA only; got a tensor on {} (the reference ops run everywhere)",
             kName, op, t.device().str());
}

CUstream_st* stream() { return at::cuda::getCurrentCUDAStream(); }

// A norm weight as the kernels take it: fp32 or the activations' dtype, contiguous.
at::Tensor norm_weight(const at::Tensor& w, const at::Tensor& x) {
  QRUN_CHECK(w.numel() == x.size(-1) && w.device() == x.device(),
             "{}: a norm weight of {} elements on {} for rows of {} on {}", kName, w.numel(), w.device().str(),
             x.size(-1), x.device().str());
  at::Tensor v = (w.scalar_type() == at::kFloat || w.scalar_type() == x.scalar_type()) ? w : w.to(at::kFloat);
  return v.contiguous();
}

// Rows of x [..., inner, D] as the kernels address them: the dims before -2 collapse to one
// stride (made so by a copy only if they do not), the row's own D elements contiguous.
struct RowView {
  at::Tensor t;  // x itself or a contiguous copy
  fo::Rows rows;
  int64_t outer = 1, inner = 1, cols = 0;
};
RowView row_view(const at::Tensor& x) {
  RowView v;
  v.t = x;
  auto collapsible = [](const at::Tensor& t) {
    if (t.stride(-1) != 1) return false;
    for (int64_t d = 0; d < t.dim() - 3; ++d)  // the outer dims, all but the last three
      if (t.stride(d) != t.size(d + 1) * t.stride(d + 1)) return false;
    return true;
  };
  if (!collapsible(x)) v.t = x.contiguous();
  v.cols = x.size(-1);
  v.inner = x.dim() >= 2 ? x.size(-2) : 1;
  v.outer = x.numel() / std::max<int64_t>(v.cols * v.inner, 1);
  v.rows.ptr = v.t.data_ptr();
  v.rows.ld_inner = x.dim() >= 2 ? v.t.stride(-2) : v.cols;
  v.rows.ld_outer = x.dim() >= 3 ? v.t.stride(-3) : v.rows.ld_inner * v.inner;
  return v;
}
fo::MutRows mut_rows(const at::Tensor& contiguous, int64_t inner, int64_t cols) {
  return fo::MutRows{contiguous.data_ptr(), inner * cols, cols};
}
fo::Rows rows_of(const at::Tensor& contiguous, int64_t inner, int64_t cols) {
  return fo::Rows{contiguous.data_ptr(), inner * cols, cols};
}

// ---------------------------------------------------------------------------------------------
// RMSNorm (+ RoPE), and the residual add + RMSNorm

fo::NormArgs norm_args(const RowView& v, const at::Tensor& w, double eps, bool zc) {
  fo::NormArgs a;
  a.outer = v.outer, a.inner = v.inner, a.cols = v.cols;
  a.dtype = dt(v.t);
  a.x = v.rows;
  a.w = w.data_ptr();
  a.w_dtype = dt(w);
  a.zero_centred = zc;
  a.eps = static_cast<float>(eps);
  return a;
}

struct NormFn : public torch::autograd::Function<NormFn> {
  // cos/sin undefined: no rope.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps,
                            bool zc, const at::Tensor& cos, const at::Tensor& sin) {
    c10::cuda::CUDAGuard guard(x.device());
    RowView v = row_view(x);
    at::Tensor w = norm_weight(weight, x);
    fo::NormArgs a = norm_args(v, w, eps, zc);
    at::Tensor cs, sn;
    if (cos.numel() > 0) {
      cs = cos.to(x.scalar_type()).reshape({-1, cos.size(-1)}).contiguous();
      sn = sin.to(x.scalar_type()).reshape({-1, sin.size(-1)}).contiguous();
      QRUN_CHECK(cs.size(0) == v.outer, "{} qk_norm_rope: cos/sin have {} rows for {} tokens", kName, cs.size(0), v.outer);
      a.rot = static_cast<int>(cs.size(1));
      a.cos = cs.data_ptr(), a.sin = sn.data_ptr(), a.ld_rope = cs.size(1);
    }
    at::Tensor y = at::empty(x.sizes(), x.options());
    at::Tensor rstd = at::empty({v.outer * v.inner}, x.options().dtype(at::kFloat));
    fo::norm_forward(a, mut_rows(y, v.inner, v.cols), fo::MutRows{}, rstd.data_ptr<float>(), stream());
    ctx->save_for_backward({v.t, w, rstd, cs, sn});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["zc"] = zc;
    ctx->saved_data["wdtype"] = static_cast<int64_t>(weight.scalar_type());
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &w = s[1], &rstd = s[2], &cs = s[3], &sn = s[4];
    c10::cuda::CUDAGuard guard(x.device());
    RowView v = row_view(x);
    fo::NormArgs a = norm_args(v, w, ctx->saved_data["eps"].toDouble(), ctx->saved_data["zc"].toBool());
    if (cs.defined()) a.rot = static_cast<int>(cs.size(1)), a.cos = cs.data_ptr(), a.sin = sn.data_ptr(), a.ld_rope = cs.size(1);
    at::Tensor dy = grad[0].to(x.scalar_type()).contiguous();
    at::Tensor dx = at::empty(x.sizes(), x.options());
    at::Tensor dw = at::empty_like(w);
    at::Tensor ws = at::empty({static_cast<int64_t>(fo::norm_backward_workspace_bytes(a))}, x.options().dtype(at::kByte));
    fo::norm_backward(a, rstd.data_ptr<float>(), rows_of(dy, v.inner, v.cols), fo::Rows{},
                      mut_rows(dx, v.inner, v.cols), dw.data_ptr(), ws.data_ptr(), stream());
    const auto wdt = static_cast<c10::ScalarType>(ctx->saved_data["wdtype"].toInt());
    return {dx, dw.to(wdt), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct AddNormFn : public torch::autograd::Function<AddNormFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& residual,
                               const at::Tensor& weight, double eps, bool zc) {
    c10::cuda::CUDAGuard guard(x.device());
    QRUN_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type(),
               "{} add_rms_norm: residual {} {} differs from x {} {}", kName, residual.sizes(),
               c10::toString(residual.scalar_type()), x.sizes(), c10::toString(x.scalar_type()));
    RowView v = row_view(x.contiguous()), r = row_view(residual.contiguous());
    at::Tensor w = norm_weight(weight, x);
    fo::NormArgs a = norm_args(v, w, eps, zc);
    a.residual = r.rows;
    at::Tensor y = at::empty(x.sizes(), x.options()), sum = at::empty(x.sizes(), x.options());
    at::Tensor rstd = at::empty({v.outer * v.inner}, x.options().dtype(at::kFloat));
    fo::norm_forward(a, mut_rows(y, v.inner, v.cols), mut_rows(sum, v.inner, v.cols), rstd.data_ptr<float>(), stream());
    ctx->save_for_backward({sum, w, rstd});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["zc"] = zc;
    ctx->saved_data["wdtype"] = static_cast<int64_t>(weight.scalar_type());
    return {y, sum};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &sum = s[0], &w = s[1], &rstd = s[2];
    c10::cuda::CUDAGuard guard(sum.device());
    RowView v = row_view(sum);
    fo::NormArgs a = norm_args(v, w, ctx->saved_data["eps"].toDouble(), ctx->saved_data["zc"].toBool());
    at::Tensor dy = grad[0].defined() ? grad[0].to(sum.scalar_type()).contiguous() : at::zeros_like(sum);
    at::Tensor ds = grad[1].defined() ? grad[1].to(sum.scalar_type()).contiguous() : at::Tensor();
    at::Tensor dx = at::empty(sum.sizes(), sum.options());
    at::Tensor dw = at::empty_like(w);
    at::Tensor ws = at::empty({static_cast<int64_t>(fo::norm_backward_workspace_bytes(a))}, sum.options().dtype(at::kByte));
    fo::norm_backward(a, rstd.data_ptr<float>(), rows_of(dy, v.inner, v.cols),
                      ds.defined() ? rows_of(ds, v.inner, v.cols) : fo::Rows{}, mut_rows(dx, v.inner, v.cols),
                      dw.data_ptr(), ws.data_ptr(), stream());
    const auto wdt = static_cast<c10::ScalarType>(ctx->saved_data["wdtype"].toInt());
    return {dx, dx, dw.to(wdt), at::Tensor(), at::Tensor()};
  }
};

// ---------------------------------------------------------------------------------------------
// Gated RMSNorm

struct GatedNormFn : public torch::autograd::Function<GatedNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& z_in,
                            const at::Tensor& weight, double eps) {
    c10::cuda::CUDAGuard guard(x_in.device());
    QRUN_CHECK(z_in.sizes() == x_in.sizes(), "{} gated_rms_norm: z {} differs from x {}", kName, z_in.sizes(), x_in.sizes());
    at::Tensor x = x_in.contiguous(), z = z_in.to(x.scalar_type()).contiguous();
    at::Tensor w = norm_weight(weight, x);
    fo::GatedNormArgs a;
    a.cols = x.size(-1);
    a.rows = x.numel() / std::max<int64_t>(a.cols, 1);
    a.dtype = dt(x);
    a.x = rows_of(x, 1, a.cols), a.z = rows_of(z, 1, a.cols);
    a.w = w.data_ptr(), a.w_dtype = dt(w), a.eps = static_cast<float>(eps);
    at::Tensor y = at::empty(x.sizes(), x.options());
    at::Tensor rstd = at::empty({a.rows}, x.options().dtype(at::kFloat));
    fo::gated_norm_forward(a, mut_rows(y, 1, a.cols), rstd.data_ptr<float>(), stream());
    ctx->save_for_backward({x, z, w, rstd});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["wdtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["zdtype"] = static_cast<int64_t>(z_in.scalar_type());
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &z = s[1], &w = s[2], &rstd = s[3];
    c10::cuda::CUDAGuard guard(x.device());
    fo::GatedNormArgs a;
    a.cols = x.size(-1);
    a.rows = x.numel() / std::max<int64_t>(a.cols, 1);
    a.dtype = dt(x);
    a.x = rows_of(x, 1, a.cols), a.z = rows_of(z, 1, a.cols);
    a.w = w.data_ptr(), a.w_dtype = dt(w), a.eps = static_cast<float>(ctx->saved_data["eps"].toDouble());
    at::Tensor dy = grad[0].to(x.scalar_type()).contiguous();
    at::Tensor dx = at::empty(x.sizes(), x.options()), dz = at::empty(x.sizes(), x.options());
    at::Tensor dw = at::empty_like(w);
    at::Tensor ws = at::empty({static_cast<int64_t>(fo::gated_norm_backward_workspace_bytes(a))}, x.options().dtype(at::kByte));
    fo::gated_norm_backward(a, rstd.data_ptr<float>(), rows_of(dy, 1, a.cols), mut_rows(dx, 1, a.cols),
                            mut_rows(dz, 1, a.cols), dw.data_ptr(), ws.data_ptr(), stream());
    const auto wdt = static_cast<c10::ScalarType>(ctx->saved_data["wdtype"].toInt());
    const auto zdt = static_cast<c10::ScalarType>(ctx->saved_data["zdtype"].toInt());
    return {dx, dz.to(zdt), dw.to(wdt), at::Tensor()};
  }
};

// ---------------------------------------------------------------------------------------------
// SwiGLU: over two tensors, or the two halves of one (packed)

fo::SwiGluArgs swiglu_args(const at::Tensor& g, const at::Tensor& u, int64_t cols) {
  fo::SwiGluArgs a;
  a.cols = cols;
  a.rows = g.numel() / std::max<int64_t>(g.size(-1), 1);
  a.dtype = dt(g);
  a.g = fo::Rows{g.data_ptr(), g.size(-1), 0};
  a.u = fo::Rows{u.data_ptr(), u.size(-1), 0};
  return a;
}

struct SwiGluFn : public torch::autograd::Function<SwiGluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    c10::cuda::CUDAGuard guard(gate.device());
    QRUN_CHECK(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type(),
               "{} swiglu: gate {} and up {} differ", kName, gate.sizes(), up.sizes());
    at::Tensor g = gate.contiguous(), u = up.contiguous();
    const int64_t I = g.size(-1);
    at::Tensor y = at::empty(g.sizes(), g.options());
    fo::swiglu_forward(swiglu_args(g, u, I), fo::MutRows{y.data_ptr(), I, 0}, stream());
    ctx->save_for_backward({g, u});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &g = s[0], &u = s[1];
    c10::cuda::CUDAGuard guard(g.device());
    const int64_t I = g.size(-1);
    at::Tensor dy = grad[0].to(g.scalar_type()).contiguous();
    at::Tensor dg = at::empty_like(g), du = at::empty_like(u);
    fo::swiglu_backward(swiglu_args(g, u, I), fo::Rows{dy.data_ptr(), I, 0}, fo::MutRows{dg.data_ptr(), I, 0},
                        fo::MutRows{du.data_ptr(), I, 0}, stream());
    return {dg, du};
  }
};

struct SwiGluPackedFn : public torch::autograd::Function<SwiGluPackedFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up) {
    c10::cuda::CUDAGuard guard(gate_up.device());
    QRUN_CHECK(gate_up.size(-1) % 2 == 0, "{} swiglu_packed: last dim {} is odd", kName, gate_up.size(-1));
    at::Tensor gu = gate_up.contiguous();
    const int64_t I = gu.size(-1) / 2;
    std::vector<int64_t> shape(gu.sizes().begin(), gu.sizes().end());
    shape.back() = I;
    at::Tensor y = at::empty(shape, gu.options());
    fo::SwiGluArgs a = swiglu_args(gu, gu, I);
    a.u.ptr = static_cast<const char*>(gu.data_ptr()) + I * gu.element_size();
    fo::swiglu_forward(a, fo::MutRows{y.data_ptr(), I, 0}, stream());
    ctx->save_for_backward({gu});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const at::Tensor gu = ctx->get_saved_variables()[0];
    c10::cuda::CUDAGuard guard(gu.device());
    const int64_t I = gu.size(-1) / 2;
    at::Tensor dy = grad[0].to(gu.scalar_type()).contiguous();
    at::Tensor dgu = at::empty_like(gu);
    fo::SwiGluArgs a = swiglu_args(gu, gu, I);
    a.u.ptr = static_cast<const char*>(gu.data_ptr()) + I * gu.element_size();
    char* d = static_cast<char*>(dgu.data_ptr());
    fo::swiglu_backward(a, fo::Rows{dy.data_ptr(), I, 0}, fo::MutRows{d, 2 * I, 0},
                        fo::MutRows{d + I * dgu.element_size(), 2 * I, 0}, stream());
    return {dgu};
  }
};

// ---------------------------------------------------------------------------------------------
// Fused linear cross-entropy (Note [Fused linear cross-entropy])

int64_t chunk_rows(int64_t configured, int64_t V, int64_t elem) {
  if (configured > 0) return configured;
  return std::max<int64_t>(1, (int64_t{1} << 30) / std::max<int64_t>(V * elem, 1));
}

struct LinearCeFn : public torch::autograd::Function<LinearCeFn> {
  // need_dh / need_dW: whether the caller records gradients for hidden / weight (grad mode is
  // always off inside forward, so the op's lambda decides before apply()).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden_in, const at::Tensor& weight_in,
                            const at::Tensor& targets_in, int64_t chunk_cfg, bool need_dh, bool need_dW) {
    c10::cuda::CUDAGuard guard(hidden_in.device());
    QRUN_CHECK(hidden_in.dim() == 2 && weight_in.dim() == 2 && hidden_in.size(1) == weight_in.size(1),
               "{} linear_cross_entropy_sum: hidden [N, H] and weight [V, H], got {} and {}", kName,
               hidden_in.sizes(), weight_in.sizes());
    QRUN_CHECK(weight_in.scalar_type() == hidden_in.scalar_type(),
               "{} linear_cross_entropy_sum: weight {} and hidden {} must share a dtype", kName,
               c10::toString(weight_in.scalar_type()), c10::toString(hidden_in.scalar_type()));
    const at::Tensor h = hidden_in.contiguous(), W = weight_in.contiguous();
    QRUN_CHECK(targets_in.numel() == hidden_in.size(0) && targets_in.device() == hidden_in.device(),
               "{} linear_cross_entropy_sum: targets {} on {} for {} rows on {}", kName, targets_in.sizes(),
               targets_in.device().str(), hidden_in.size(0), hidden_in.device().str());
    const at::Tensor targets = targets_in.to(at::kLong).contiguous();
    const int64_t N = h.size(0), V = W.size(0);
    const bool grads = need_dh || need_dW;
    at::Tensor losses = at::empty({N}, h.options().dtype(at::kFloat));
    at::Tensor dh, dW;
    if (need_dh) dh = at::empty_like(h);
    if (need_dW) dW = at::empty_like(W);
    const int64_t rows = chunk_rows(chunk_cfg, V, h.element_size());
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
      const int64_t n = std::min(rows, N - r0);
      at::Tensor hc = h.narrow(0, r0, n);
      at::Tensor logits = at::mm(hc, W.t());  // [n, V]
      fo::cross_entropy_rows(logits.data_ptr(), n, V, V, dt(h), targets.data_ptr<int64_t>() + r0,
                             losses.data_ptr<float>() + r0, stream());
      if (!grads) continue;
      if (need_dh) {
        at::Tensor dhc = dh.narrow(0, r0, n);
        at::mm_out(dhc, logits, W);
      }
      if (!need_dW) continue;
      if (r0 == 0) at::mm_out(dW, logits.t(), hc);
      else dW.addmm_(logits.t(), hc);
    }
    if (N == 0 && need_dW) dW.zero_();
    ctx->save_for_backward({dh, dW});
    return losses.sum();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto s = ctx->get_saved_variables();
    at::Tensor g = grad[0].to(at::kFloat);  // 0-dim, on the device: no host read
    at::Tensor dh = s[0].defined() ? s[0] * g : at::Tensor();
    // In place: dW is as large as the head. A second backward through the same graph
    // (retain_graph) therefore fails loudly on the saved tensor's version, never scales twice.
    at::Tensor dW = s[1].defined() ? s[1].mul_(g) : at::Tensor();
    return {dh, dW, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// ---------------------------------------------------------------------------------------------
// AdamW and the square sum over lists of tensors, each in one launch (fused_ops.h, Note [AdamW
// tiles] in fused_ops.cu). The descriptor table (pointers, sizes, tile offsets: a few KB) goes to
// the device through a pinned buffer on the current stream; the caching host allocator keeps the
// buffer until that copy is done, and the device copy is freed in stream order after the launch.
template <class D>
at::Tensor upload(const std::vector<D>& table, const at::Device& dev) {
  const int64_t bytes = static_cast<int64_t>(table.size() * sizeof(D));
  at::Tensor host = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  std::memcpy(host.data_ptr(), table.data(), static_cast<size_t>(bytes));
  return host.to(dev, /*non_blocking=*/true);
}

at::Tensor square_sum(const std::vector<at::Tensor>& X) {
  const char* op = op::SquareSum::kName;
  QRUN_CHECK(!X.empty(), "{} {}: no tensors", kName, op);
  check_cuda(X[0], op);
  const at::Device dev = X[0].device();
  std::vector<fo::SumTensor> table(X.size());
  int64_t tiles = 0;
  for (size_t i = 0; i < X.size(); ++i) {
    QRUN_CHECK(X[i].device() == dev && X[i].scalar_type() == X[0].scalar_type() && X[i].is_contiguous(),
               "{} {}: tensor {} is {} {}{}; the first is {} {} (one device and dtype, contiguous)", kName, op, i,
               c10::toString(X[i].scalar_type()), X[i].device().str(), X[i].is_contiguous() ? "" : ", not contiguous",
               c10::toString(X[0].scalar_type()), dev.str());
    table[i] = fo::SumTensor{X[i].data_ptr(), X[i].numel(), tiles};
    tiles += fo::list_tiles(X[i].numel());
  }
  const c10::cuda::CUDAGuard guard(dev);
  at::Tensor on_dev = upload(table, dev);
  at::Tensor ws = at::empty({static_cast<int64_t>(fo::square_sum_workspace_bytes())}, X[0].options().dtype(at::kByte));
  at::Tensor out = at::empty({}, X[0].options().dtype(at::kDouble));
  fo::square_sum(dt(X[0]), static_cast<const fo::SumTensor*>(on_dev.data_ptr()), static_cast<int>(table.size()), tiles,
                 out.data_ptr<double>(), ws.data_ptr(), stream());
  return out;
}

void adamw_step(const std::vector<at::Tensor>& P, const std::vector<at::Tensor>& G,
                const std::vector<at::Tensor>& M, const std::vector<at::Tensor>& V,
                const std::vector<at::Tensor>& S, double lr, double b1, double b2, double wd, double eps,
                const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  const char* op = op::AdamWStep::kName;
  QRUN_CHECK(G.size() == P.size() && M.size() == P.size() && V.size() == P.size() && S.size() == P.size(),
             "{} {}: lists of {} params, {} grads, {} exp_avgs, {} exp_avg_sqs, {} steps", kName, op, P.size(),
             G.size(), M.size(), V.size(), S.size());
  if (P.empty()) return;
  check_cuda(P[0], op);
  const at::Device dev = P[0].device();
  const auto type = P[0].scalar_type();
  auto scalar = [&](const at::Tensor& t, const char* what) -> const float* {
    if (!t.defined()) return nullptr;
    QRUN_CHECK(t.device() == dev && t.scalar_type() == at::kFloat && t.numel() == 1,
               "{} {}: {} must be one fp32 element on {}, got {} {} elements on {}", kName, op, what, dev.str(),
               c10::toString(t.scalar_type()), t.numel(), t.device().str());
    return t.data_ptr<float>();
  };
  std::vector<fo::AdamWTensor> table(P.size());
  int64_t tiles = 0;
  for (size_t i = 0; i < P.size(); ++i) {
    for (const at::Tensor* t : {&P[i], &G[i], &M[i], &V[i]})
      QRUN_CHECK(t->device() == dev && t->scalar_type() == type && t->is_contiguous() && t->numel() == P[i].numel(),
                 "{} {}: tensor {} must have its param's device ({}), dtype ({}), size ({}) and be contiguous; "
                 "got {} {} of {} elements{}", kName, op, i, dev.str(), c10::toString(type), P[i].numel(),
                 t->device().str(), c10::toString(t->scalar_type()), t->numel(),
                 t->is_contiguous() ? "" : ", not contiguous");
    scalar(S[i], "a step count");
    fo::AdamWTensor& d = table[i];
    d.p = P[i].data_ptr();
    d.g = G[i].data_ptr();
    d.m = M[i].data_ptr();
    d.v = V[i].data_ptr();
    d.step = S[i].data_ptr<float>();
    d.n = P[i].numel();
    d.first_tile = tiles;
    tiles += fo::list_tiles(d.n);
  }
  fo::AdamWArgs a;
  a.dtype = dt(P[0]);
  a.lr = static_cast<float>(lr);
  a.beta1 = static_cast<float>(b1);
  a.beta2 = static_cast<float>(b2);
  a.weight_decay = static_cast<float>(wd);
  a.eps = static_cast<float>(eps);
  a.grad_scale = scalar(grad_scale, "grad_scale");
  a.found_inf = scalar(found_inf, "found_inf");
  const c10::cuda::CUDAGuard guard(dev);
  at::Tensor on_dev = upload(table, dev);
  fo::adamw_step(a, static_cast<const fo::AdamWTensor*>(on_dev.data_ptr()), static_cast<int>(table.size()), tiles,
                 stream());
}

class FusedOps final : public Ops {
 public:
  explicit FusedOps(const Config& c)
      : chunk_(c.get_int("loss_chunk_tokens")),
        exclude_(c.get_string_list("exclude").begin(), c.get_string_list("exclude").end()) {
    static const std::set<std::string> known = {op::RmsNorm::kName,      op::AddRmsNorm::kName,
                                                op::GatedRmsNorm::kName, op::SwiGlu::kName,
                                                op::SwiGluPacked::kName, op::QkNormRope::kName,
                                                op::LinearCrossEntropy::kName, op::AdamWStep::kName,
                                                op::SquareSum::kName};
    for (const auto& e : exclude_)
      QRUN_CHECK(known.count(e) > 0, "{}: exclude names '{}', not an operation of the fused ops; they are: {}",
                 c.location("exclude"), e, fmt::join(known, ", "));
  }

  std::string unsupported(const KernelUse& u) const override {
    if (u.device != c10::DeviceType::CUDA)
      return "this backend runs on CUDA only, not on " + c10::DeviceTypeName(u.device, true) +
             " (the reference ops run everywhere)";
    if (u.dtype != at::kBFloat16 && u.dtype != at::kHalf && u.dtype != at::kFloat)
      return std::string("it takes fp32, bf16 or fp16 activations, not ") + c10::toString(u.dtype);
    if (u.channels > 16384) return "hidden size " + std::to_string(u.channels) + " is above the 16,384 its norms take";
    return {};
  }

  void provide(OpTable& t, const std::string& provider) override {
    auto want = [&](const char* name) { return exclude_.count(name) == 0; };
    if (want(op::RmsNorm::kName))
      t.provide<op::RmsNorm>(
          [](const at::Tensor& x, const at::Tensor& w, double eps, bool zc) {
            check_cuda(x, op::RmsNorm::kName);
            // No rope: empty (defined) tables; autograd's Function::apply asks every tensor input
            // for its device.
            at::Tensor none = at::empty({0}, x.options());
            return NormFn::apply(x, w, eps, zc, none, none);
          },
          provider);
    if (want(op::AddRmsNorm::kName))
      t.provide<op::AddRmsNorm>(
          [](const at::Tensor& x, const at::Tensor& r, const at::Tensor& w, double eps, bool zc) {
            check_cuda(x, op::AddRmsNorm::kName);
            auto out = AddNormFn::apply(x, r, w, eps, zc);
            return std::make_pair(out[0], out[1]);
          },
          provider);
    if (want(op::GatedRmsNorm::kName))
      t.provide<op::GatedRmsNorm>(
          [](const at::Tensor& x, const at::Tensor& z, const at::Tensor& w, double eps) {
            check_cuda(x, op::GatedRmsNorm::kName);
            return GatedNormFn::apply(x, z, w, eps);
          },
          provider);
    if (want(op::SwiGlu::kName))
      t.provide<op::SwiGlu>(
          [](const at::Tensor& g, const at::Tensor& u) {
            check_cuda(g, op::SwiGlu::kName);
            return SwiGluFn::apply(g, u);
          },
          provider);
    if (want(op::SwiGluPacked::kName))
      t.provide<op::SwiGluPacked>(
          [](const at::Tensor& gu) {
            check_cuda(gu, op::SwiGluPacked::kName);
            return SwiGluPackedFn::apply(gu);
          },
          provider);
    if (want(op::QkNormRope::kName))
      t.provide<op::QkNormRope>(
          [](const at::Tensor& x, const at::Tensor& w, double eps, bool zc, const at::Tensor& cos,
             const at::Tensor& sin) {
            check_cuda(x, op::QkNormRope::kName);
            QRUN_CHECK(cos.size(-1) % 2 == 0 && cos.size(-1) <= x.size(-1) && sin.sizes() == cos.sizes(),
                       "{} qk_norm_rope: {} rotary dims (cos {}, sin {}) for heads of {}", kName, cos.size(-1),
                       cos.sizes(), sin.sizes(), x.size(-1));
            return NormFn::apply(x, w, eps, zc, cos, sin);
          },
          provider);
    if (want(op::LinearCrossEntropy::kName)) {
      const int64_t chunk = chunk_;
      t.provide<op::LinearCrossEntropy>(
          [chunk](const at::Tensor& h, const at::Tensor& w, const at::Tensor& targets) {
            check_cuda(h, op::LinearCrossEntropy::kName);
            const bool grad = at::GradMode::is_enabled();
            return LinearCeFn::apply(h, w, targets, chunk, grad && h.requires_grad(), grad && w.requires_grad());
          },
          provider);
    }
    if (want(op::AdamWStep::kName)) t.provide<op::AdamWStep>(adamw_step, provider);
    if (want(op::SquareSum::kName)) t.provide<op::SquareSum>(square_sum, provider);
  }

 private:
  int64_t chunk_;
  std::set<std::string> exclude_;
};

void register_all(Registrar& r) {
  r.add<Ops>(kName,
             "CUDA norms (with the residual add), gated norm, SwiGLU, q/k norm + RoPE, the fused "
             "linear cross-entropy (no [tokens x vocab] logits), and AdamW and the gradient norm's "
             "square sum over all parameters in one launch each",
             Schema{Field::integer("loss_chunk_tokens", 0)
                        .min(0)
                        .doc("rows of the fused loss per chunk; 0: as many as make 1 GiB of logits"),
                    Field::string_list("exclude", {})
                        .doc("operations left to the reference ops, e.g. [linear_cross_entropy_sum]")},
             [](const Config& c) { return std::make_unique<FusedOps>(c); });
}

}  // namespace
}  // namespace qrun

QRUN_PLUGIN("fused-ops", "0.1.0", qrun::register_all)
