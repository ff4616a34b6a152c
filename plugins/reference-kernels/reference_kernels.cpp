// plugins/reference-kernels: the reference backend of every kernel kind.
//
// Why this exists: each fast backend (fla-style chunk kernels, flash attention, causal-conv1d) is
// checked against these by `qrun check <kind>/<name>` and by the model tests. So they are written
// for obviousness, not speed: plain ATen ops (autograd comes for free), everything that matters
// numerically in fp32, and sample boundaries handled in one place (Segments below).
//
// Note [Segments]: every layout is first flattened to a token stream x_flat [Ttot, ...]
// (packed: [T, ...]; padded: [B*S, ...]). SeqInfo::cu_seqlens_host gives N samples; sample n is
// gathered into row n of a zero-padded [N, L, ...] tensor (L = longest sample, rounded up as the
// caller asks), computed there with no state shared between rows, and scattered back. Tokens that
// belong to no sample (padding) come out as zeros. Gather/scatter are index_select / index_copy,
// so gradients flow to exactly the tokens that were read.
//
// Note [Accumulation dtype]: "fp32" below means at least fp32: inputs in bf16/fp16/fp32 compute in
// fp32, fp64 inputs compute in fp64 (acc_dtype). fp64 exists for the fp64 parity tests against
// transformers (tests/model), where rounding noise must vanish, not for training.
//
// Components: attention "sdpa", linear_attention "gdn-reference", conv1d "conv-reference",
// ops "reference".
#include <qrun/sdk/error.h>
#include <qrun/sdk/kernels.h>
#include <qrun/sdk/ops.h>
#include <qrun/sdk/plugin.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace qrun {
namespace {

// See Note [Segments].
struct Segments {
  int64_t total = 0;       // tokens of the flat stream (Ttot)
  int64_t n = 0;           // samples
  int64_t len = 0;         // L: row length of the gathered layout
  at::Tensor gather_idx;   // int64 [N*L]: flat token of (n, p), 0 where invalid
  at::Tensor valid;        // bool [N, L]
  at::Tensor valid_rows;   // int64 [M]: positions in [N*L] that hold a real token
  at::Tensor valid_tokens; // int64 [M]: the flat token of each of those
};

// lead: the number of leading token dims of the tensors (1 packed, 2 padded).
Segments make_segments(const SeqInfo& seq, const at::Tensor& like, int64_t round_to,
                       const char* who) {
  Segments s;
  const auto& cu = seq.cu_seqlens_host;
  QRUN_CHECK(cu.size() >= 1, "{}: SeqInfo.cu_seqlens_host is empty", who);
  s.n = static_cast<int64_t>(cu.size()) - 1;
  int64_t rows = 1, width = 0;
  if (seq.layout == Layout::Packed) {
    QRUN_CHECK(like.dim() >= 1, "{}: packed input needs a token dim", who);
    width = like.size(0);
    s.total = width;
    QRUN_CHECK(cu.front() == 0 && cu.back() <= width,
               "{}: cu_seqlens [0 .. {}] does not fit a packed stream of {} tokens", who, cu.back(),
               width);
  } else {
    QRUN_CHECK(like.dim() >= 2, "{}: padded input needs [B, S, ...]", who);
    rows = like.size(0);
    width = like.size(1);
    s.total = rows * width;
    QRUN_CHECK(s.n == rows, "{}: padded batch has {} rows but cu_seqlens names {} samples", who,
               rows, s.n);
  }
  int64_t max_len = 0;
  for (int64_t i = 0; i < s.n; ++i) {
    int64_t l = cu[i + 1] - cu[i];
    QRUN_CHECK(l >= 0 && l <= width, "{}: sample {} has length {} (row width {})", who, i, l, width);
    max_len = std::max(max_len, l);
  }
  int64_t L = std::max<int64_t>(max_len, 1);
  if (round_to > 1) L = (L + round_to - 1) / round_to * round_to;
  s.len = L;
  std::vector<int64_t> idx(s.n * L, 0), vrows, vtoks;
  std::vector<uint8_t> valid(s.n * L, 0);
  for (int64_t i = 0; i < s.n; ++i) {
    int64_t l = cu[i + 1] - cu[i];
    int64_t base = seq.layout == Layout::Packed ? cu[i] : i * width;
    for (int64_t p = 0; p < l; ++p) {
      idx[i * L + p] = base + p;
      valid[i * L + p] = 1;
      vrows.push_back(i * L + p);
      vtoks.push_back(base + p);
    }
  }
  auto dev = like.device();
  auto i64 = at::TensorOptions().dtype(at::kLong);
  s.gather_idx = at::tensor(idx, i64).to(dev);
  s.valid = at::tensor(std::vector<int64_t>(valid.begin(), valid.end()), i64)
                .to(dev)
                .view({s.n, L})
                .to(at::kBool);
  s.valid_rows = at::tensor(vrows, i64).to(dev);
  s.valid_tokens = at::tensor(vtoks, i64).to(dev);
  return s;
}

// x: [lead..., rest...] with `lead` token dims -> [N, L, rest...], zeros where invalid.
at::Tensor gather(const Segments& s, const at::Tensor& x, int64_t lead) {
  at::Tensor flat = x.flatten(0, lead - 1);
  if (s.total == 0) {
    std::vector<int64_t> shape = {s.n, s.len};
    for (int64_t d = 1; d < flat.dim(); ++d) shape.push_back(flat.size(d));
    return at::zeros(shape, flat.options());
  }
  at::Tensor g = flat.index_select(0, s.gather_idx);
  std::vector<int64_t> shape = {s.n, s.len};
  for (int64_t d = 1; d < flat.dim(); ++d) shape.push_back(flat.size(d));
  g = g.view(shape);
  at::Tensor m = s.valid;
  for (int64_t d = 2; d < g.dim(); ++d) m = m.unsqueeze(-1);
  return at::where(m, g, at::zeros({}, g.options()));
}

// y: [N, L, rest...] -> the token layout of `like` ([lead..., rest...]), zeros for padding.
at::Tensor scatter(const Segments& s, const at::Tensor& y, const at::Tensor& like, int64_t lead) {
  std::vector<int64_t> rest(y.sizes().begin() + 2, y.sizes().end());
  std::vector<int64_t> flat_shape = {s.total};
  flat_shape.insert(flat_shape.end(), rest.begin(), rest.end());
  at::Tensor src = y.flatten(0, 1).index_select(0, s.valid_rows);
  at::Tensor out = at::zeros(flat_shape, y.options()).index_copy(0, s.valid_tokens, src);
  std::vector<int64_t> shape(like.sizes().begin(), like.sizes().begin() + lead);
  shape.insert(shape.end(), rest.begin(), rest.end());
  return out.view(shape);
}

// See Note [Accumulation dtype].
c10::ScalarType acc_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

int64_t lead_dims(const SeqInfo& seq) { return seq.layout == Layout::Packed ? 1 : 2; }

// ---------------------------------------------------------------------------------------------
// attention: sdpa

class SdpaAttention final : public Attention {
 public:
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const SeqInfo& seq, double scale) override {
    const int64_t lead = lead_dims(seq);
    QRUN_CHECK(q.dim() == lead + 2 && k.dim() == lead + 2 && v.dim() == lead + 2,
               "sdpa: q, k, v must be [{}, heads, dim] for a {} batch", lead == 1 ? "T" : "B, S",
               layout_name(seq.layout));
    const int64_t hq = q.size(-2), hkv = k.size(-2);
    QRUN_CHECK(hkv > 0 && hq % hkv == 0, "sdpa: {} query heads are not a multiple of {} kv heads",
               hq, hkv);
    Segments s = make_segments(seq, q, 1, "sdpa");
    // [N, L, H, D] -> [N, H, L, D], fp32.
    const auto acc = acc_dtype(q);
    at::Tensor qs = gather(s, q, lead).transpose(1, 2).to(acc);
    at::Tensor ks = gather(s, k, lead).transpose(1, 2).to(acc);
    at::Tensor vs = gather(s, v, lead).transpose(1, 2).to(acc);
    if (hq != hkv) {
      ks = ks.repeat_interleave(hq / hkv, 1);
      vs = vs.repeat_interleave(hq / hkv, 1);
    }
    at::Tensor scores = at::matmul(qs, ks.transpose(-1, -2)) * scale;  // [N, H, L, L]
    const int64_t L = s.len;
    at::Tensor causal = at::ones({L, L}, q.options().dtype(at::kBool)).tril();
    at::Tensor allowed = causal.unsqueeze(0) & s.valid.unsqueeze(1);  // [N, Lq, Lk]
    // A finite fill keeps rows without any allowed key (padding queries) free of NaN.
    scores = scores.masked_fill(allowed.logical_not().unsqueeze(1), -1e30);
    at::Tensor probs = at::softmax(scores, -1);
    at::Tensor o = at::matmul(probs, vs).transpose(1, 2).to(q.scalar_type());  // [N, L, H, D]
    return scatter(s, o, q, lead);
  }
};

// ---------------------------------------------------------------------------------------------
// linear_attention: gdn-reference (chunked gated delta rule)

class GdnReference final : public LinearAttention {
 public:
  explicit GdnReference(int64_t chunk) : chunk_(chunk) {}

  at::Tensor forward(const GatedDeltaInputs& in, const SeqInfo& seq,
                     const GatedDeltaOptions& opt) override {
    const int64_t lead = lead_dims(seq);
    QRUN_CHECK(in.q.dim() == lead + 2 && in.k.dim() == lead + 2 && in.v.dim() == lead + 2,
               "gdn-reference: q, k, v must be [{}, heads, dim]", lead == 1 ? "T" : "B, S");
    QRUN_CHECK(in.a.dim() == lead + 1 && in.b.dim() == lead + 1,
               "gdn-reference: a and b must be [{}, value heads]", lead == 1 ? "T" : "B, S");
    const int64_t H = in.q.size(-2), K = in.q.size(-1), HV = in.v.size(-2), V = in.v.size(-1);
    QRUN_CHECK(in.k.size(-2) == H && in.k.size(-1) == K, "gdn-reference: k shape differs from q");
    QRUN_CHECK(H > 0 && HV % H == 0, "gdn-reference: {} value heads not a multiple of {} key heads",
               HV, H);
    QRUN_CHECK(in.a.size(-1) == HV && in.b.size(-1) == HV && in.A_log.numel() == HV &&
                   in.dt_bias.numel() == HV,
               "gdn-reference: a, b, A_log, dt_bias must have {} value heads", HV);
    const int64_t C = chunk_;
    Segments s = make_segments(seq, in.q, C, "gdn-reference");
    const int64_t N = s.n, L = s.len, nc = L / C;

    // Prologue, fp32: l2norm, scale, gates.
    const auto acc = acc_dtype(in.q);
    at::Tensor q = gather(s, in.q, lead).to(acc);  // [N, L, H, K]
    at::Tensor k = gather(s, in.k, lead).to(acc);
    at::Tensor v = gather(s, in.v, lead).to(acc);  // [N, L, HV, V]
    at::Tensor a = gather(s, in.a, lead).to(acc);  // [N, L, HV]
    at::Tensor b = gather(s, in.b, lead);
    if (opt.qk_l2norm) {
      q = q * at::rsqrt(q.pow(2).sum(-1, true) + 1e-6);
      k = k * at::rsqrt(k.pow(2).sum(-1, true) + 1e-6);
    }
    const double scale = opt.scale > 0 ? opt.scale : 1.0 / std::sqrt(static_cast<double>(K));
    q = q * scale;
    if (HV != H) {
      q = q.repeat_interleave(HV / H, 2);
      k = k.repeat_interleave(HV / H, 2);
    }
    // Note [Gate math in fp64]: the gates, their chunk cumsum gamma and every exp(gamma_i -
    // gamma_j) are formed in fp64 and rounded to the compute dtype once. Strong gates (g of -25..-50
    // per token) make gamma reach -3,000 within a chunk; differences of such fp32 cumsums, and
    // their gradients (dA_log, ddt_bias: sums whose terms cancel), lose most of their digits in
    // fp32 (measured: dA_log 0.39 off an fp64 evaluation relative to the size of its terms).
    // These tensors are [T, HV] and [T/64, HV, 64, 64]: fp64 costs little here.
    const auto gate_acc = at::kDouble;
    at::Tensor g = -at::exp(in.A_log.to(gate_acc)) *
                   at::softplus(a.to(gate_acc) + in.dt_bias.to(gate_acc));  // [N, L, HV]
    at::Tensor beta = at::sigmoid(b).to(acc);
    // Padded steps: g = 0, beta = 0 (no effect on the state; they come after every real token).
    g = at::where(s.valid.unsqueeze(-1), g, at::zeros({}, g.options()));
    beta = at::where(s.valid.unsqueeze(-1), beta, at::zeros({}, beta.options()));

    // [N, L, HV, D] -> [N, HV, nc, C, D]
    auto chunked = [&](const at::Tensor& x) {
      return x.transpose(1, 2).reshape({N, HV, nc, C, x.size(-1)});
    };
    q = chunked(q);
    k = chunked(k);
    v = chunked(v);
    at::Tensor gc = g.transpose(1, 2).reshape({N, HV, nc, C});
    at::Tensor bc = beta.transpose(1, 2).reshape({N, HV, nc, C, 1});
    at::Tensor k_beta = k * bc, v_beta = v * bc;
    at::Tensor gamma = gc.cumsum(-1);  // inclusive, within each chunk (fp64)
    // D[i, j] = exp(gamma_i - gamma_j) for j <= i, else 0 (tril before exp: no overflow).
    at::Tensor decay = (gamma.unsqueeze(-1) - gamma.unsqueeze(-2)).tril().exp().tril().to(acc);
    at::Tensor gamma_exp = gamma.exp().to(acc);
    at::Tensor strict_lower = at::ones({C, C}, q.options().dtype(at::kBool)).tril(-1);
    at::Tensor Lmat = at::matmul(k_beta, k.transpose(-1, -2)) * decay;
    Lmat = Lmat.masked_fill(strict_lower.logical_not(), 0.0);
    at::Tensor eye = at::eye(C, q.options());
    at::Tensor IL = Lmat + eye;
    // U = (I + L)^-1 V_beta, W = (I + L)^-1 (K_beta * e^gamma).
    at::Tensor U = at::linalg_solve_triangular(IL, v_beta, /*upper=*/false, /*left=*/true,
                                               /*unitriangular=*/true);
    at::Tensor W = at::linalg_solve_triangular(IL, k_beta * gamma_exp.unsqueeze(-1), false, true,
                                               true);
    at::Tensor qk = at::matmul(q, k.transpose(-1, -2)) * decay;  // keeps the diagonal
    at::Tensor q_dec = q * gamma_exp.unsqueeze(-1);
    at::Tensor gamma_last = gamma.select(-1, C - 1);                          // [N, HV, nc]
    at::Tensor k_dec = k * (gamma_last.unsqueeze(-1) - gamma).exp().to(acc).unsqueeze(-1);
    at::Tensor last_exp = gamma_last.exp().to(acc);
    at::Tensor S = at::zeros({N, HV, K, V}, q.options());
    std::vector<at::Tensor> outs;
    outs.reserve(nc);
    for (int64_t c = 0; c < nc; ++c) {
      at::Tensor vnew = U.select(2, c) - at::matmul(W.select(2, c), S);
      outs.push_back(at::matmul(q_dec.select(2, c), S) + at::matmul(qk.select(2, c), vnew));
      S = S * last_exp.select(2, c).unsqueeze(-1).unsqueeze(-1) +
          at::matmul(k_dec.select(2, c).transpose(-1, -2), vnew);
    }
    at::Tensor o = at::stack(outs, 2).reshape({N, HV, L, V}).transpose(1, 2);  // [N, L, HV, V]
    return scatter(s, o.to(in.v.scalar_type()), in.v, lead);
  }

 private:
  int64_t chunk_;
};

// ---------------------------------------------------------------------------------------------
// conv1d: conv-reference

class ConvReference final : public Conv1d {
 public:
  at::Tensor forward(const at::Tensor& x, const at::Tensor& weight, const SeqInfo& seq,
                     Activation act) override {
    const int64_t lead = lead_dims(seq);
    QRUN_CHECK(x.dim() == lead + 1, "conv-reference: x must be [{}, C]", lead == 1 ? "T" : "B, S");
    QRUN_CHECK(weight.dim() == 2 && weight.size(0) == x.size(-1),
               "conv-reference: weight must be [C={}, W], got {}", x.size(-1), weight.sizes());
    const int64_t W = weight.size(1);
    Segments s = make_segments(seq, x, 1, "conv-reference");
    // [N, L, C] -> [N, W-1 + L, C] with zero left context per sample, then the W taps as
    // shifted multiply-adds (exact fp32 on every device: no cuDNN, no TF32).
    const int64_t L = s.len;
    at::Tensor xs = gather(s, x, lead).to(weight.scalar_type());
    xs = at::constant_pad_nd(xs, {0, 0, W - 1, 0});
    at::Tensor y = xs.narrow(1, 0, L) * weight.select(1, 0);
    for (int64_t j = 1; j < W; ++j) y = y + xs.narrow(1, j, L) * weight.select(1, j);
    if (act == Activation::SiLU) y = at::silu(y);
    y = y.to(x.scalar_type());
    return scatter(s, y, x, lead);
  }
};

// ---------------------------------------------------------------------------------------------
// ops: reference

// Every operation of ops.h as plain ATen math (Note [Accumulation dtype]).
at::Tensor ref_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, bool zero_centred) {
  at::Tensor xf = x.to(acc_dtype(x));
  at::Tensor n = xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps);
  at::Tensor w = weight.to(xf.scalar_type());
  if (zero_centred) w = w + 1.0;
  return (n * w).to(x.scalar_type());
}

class ReferenceOps final : public Ops {
 public:
  void provide(OpTable& t, const std::string& provider) override {
    t.provide<op::RmsNorm>(ref_rms_norm, provider);
    t.provide<op::AddRmsNorm>(
        [](const at::Tensor& x, const at::Tensor& residual, const at::Tensor& w, double eps, bool zc) {
          at::Tensor s = x + residual;
          return std::make_pair(ref_rms_norm(s, w, eps, zc), s);
        },
        provider);
    t.provide<op::GatedRmsNorm>(
        [](const at::Tensor& x, const at::Tensor& z, const at::Tensor& weight, double eps) {
          at::Tensor xf = x.to(acc_dtype(x));
          at::Tensor n = (xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps)).to(x.scalar_type());
          at::Tensor y = weight * n;
          y = y * at::silu(z.to(acc_dtype(z)));
          return y.to(x.scalar_type());
        },
        provider);
    t.provide<op::SwiGlu>([](const at::Tensor& gate, const at::Tensor& up) { return at::silu(gate) * up; },
                          provider);
    t.provide<op::SwiGluPacked>(
        [](const at::Tensor& gu) {
          const int64_t I = gu.size(-1) / 2;
          return at::silu(gu.narrow(-1, 0, I)) * gu.narrow(-1, I, I);
        },
        provider);
    // RMSNorm per head, then the rotate-half rotary embedding of the first R = cos.size(-1) dims,
    // in x's dtype (as transformers applies it to the normalised bf16 heads).
    t.provide<op::QkNormRope>(
        [](const at::Tensor& x, const at::Tensor& w, double eps, bool zc, const at::Tensor& cos,
           const at::Tensor& sin) {
          at::Tensor n = ref_rms_norm(x, w, eps, zc);
          const int64_t rot = cos.size(-1), half = rot / 2;
          QRUN_CHECK(rot % 2 == 0 && rot <= x.size(-1),
                     "qk_norm_rope: {} rotary dims for heads of {}", rot, x.size(-1));
          at::Tensor xr = n.narrow(-1, 0, rot);
          at::Tensor rotated = at::cat({-xr.narrow(-1, half, half), xr.narrow(-1, 0, half)}, -1);
          at::Tensor y = xr * cos + rotated * sin;
          if (rot == x.size(-1)) return y;
          return at::cat({y, n.narrow(-1, rot, x.size(-1) - rot)}, -1);
        },
        provider);
    t.provide<op::LinearCrossEntropy>(
        [](const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets) {
          at::Tensor logits = at::linear(hidden, weight).to(acc_dtype(hidden));
          return at::cross_entropy_loss(logits, targets, {}, at::Reduction::Sum, kIgnoreIndex);
        },
        provider);
    t.provide<op::SquareSum>(
        [](const std::vector<at::Tensor>& ts) {
          at::Tensor sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(
                                             ts.empty() ? at::Device(at::kCPU) : ts.front().device()));
          for (const auto& x : ts) sum = sum + x.detach().to(at::kDouble).pow(2).sum();
          return sum;
        },
        provider);
    // AdamW as the formula reads (ops.h), one tensor at a time, in at least fp32; host reads of
    // the step counts and found_inf are fine for a judge.
    t.provide<op::AdamWStep>(
        [](const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
           const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
           const std::vector<at::Tensor>& steps, double lr, double b1, double b2, double wd, double eps,
           const at::Tensor& grad_scale, const at::Tensor& found_inf) {
          at::NoGradGuard no_grad;
          if (found_inf.defined() && found_inf.item<double>() != 0) return;
          for (size_t i = 0; i < params.size(); ++i) {
            const auto acc = acc_dtype(params[i]);
            at::Tensor g = grads[i].to(acc);
            if (grad_scale.defined()) g = g / grad_scale.to(acc);
            const double step = steps[i].item<double>() + 1;
            at::Tensor p = params[i].to(acc) * (1 - lr * wd);
            at::Tensor m = exp_avgs[i].to(acc) * b1 + g * (1 - b1);
            at::Tensor v = exp_avg_sqs[i].to(acc) * b2 + g * g * (1 - b2);
            p = p - (lr / (1 - std::pow(b1, step))) * m / (v.sqrt() / std::sqrt(1 - std::pow(b2, step)) + eps);
            params[i].copy_(p);
            exp_avgs[i].copy_(m);
            exp_avg_sqs[i].copy_(v);
            steps[i].fill_(step);
          }
        },
        provider);
  }
};

void register_all(Registrar& r) {
  r.add<Attention>("sdpa", "reference softmax attention (fp32 math, per-sample masks, GQA)",
                   Schema{}, [](const Config&) { return std::make_unique<SdpaAttention>(); });
  r.add<LinearAttention>(
      "gdn-reference", "reference chunked gated delta rule (fp32, per-sample state reset)",
      Schema{Field::integer("chunk_size", 64).min(1).max(1024).doc(
          "chunk length of the chunked algorithm (64 as in fla)")},
      [](const Config& c) { return std::make_unique<GdnReference>(c.get_int("chunk_size")); });
  r.add<Conv1d>("conv-reference", "reference causal depthwise conv1d (+SiLU), reset per sample",
                Schema{}, [](const Config&) { return std::make_unique<ConvReference>(); });
  r.add<Ops>("reference", "reference norms, gated norm, SwiGLU, q/k norm + RoPE, cross-entropy (fp32 stats) and the AdamW formula",
             Schema{}, [](const Config&) { return std::make_unique<ReferenceOps>(); });
}

}  // namespace
}  // namespace qrun

QRUN_PLUGIN("reference-kernels", "0.1.0", qrun::register_all)
