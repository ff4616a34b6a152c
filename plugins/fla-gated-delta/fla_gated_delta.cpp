// plugins/fla-gated-delta: the `fla-gated-delta` linear_attention backend - the CUDA chunked gated
// delta rule of kernels/gated_delta/ bound to LibTorch autograd. Interchangeable with
// `gdn-reference` (reference-kernels plugin) by one recipe line:
//     kernels: { linear_attention: fla-gated-delta }
//
// What this file adds to the raw kernels (kernels/gated_delta/gated_delta.h):
//   * autograd: GdnFunction's forward calls gdn_forward, its backward gdn_backward; the gate
//     g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b) and the q/k L2 norm run fused in the
//     kernels (gate_fused, beta_sigmoid, qk_l2norm), so the backward returns d/da, d/db, dA_log and
//     ddt_bias directly, plus dq, dk (w.r.t. the un-normalised q, k) and dv;
//   * memory: outputs, gradients and the kernels' scratch come from LibTorch's caching allocator;
//     every launch goes to at::cuda::getCurrentCUDAStream() under a device guard;
//   * kept prep: when gradients are recorded, the forward's kernel workspace (prep's outputs) is
//     saved for the backward, which then skips its prep (keep_prep; Note [Kept prep] in
//     kernels/gated_delta/gated_delta.cu);
//   * sample boundaries: Note [Chunk tables] and Note [Layouts] below;
//   * dtypes: Note [Dtype policy].
//
// Note [Chunk tables]
// The kernels need cu_seqlens and two chunk tables on the device. They are built from
// SeqInfo::cu_seqlens_host (never by reading the device copy back: no device->host sync), packed
// into ONE int32 buffer [cu (N+1) | chunk_offsets (N+1) | chunk_table (2*chunks) | lengths (N)],
// staged in pinned host memory and copied with non_blocking=true on the current stream. Every
// layer of a model step sees the same SeqInfo, so the last plan is cached (keyed by the boundaries,
// the token count, the layout and the device): 48 GDN layers cost one upload per batch, not 48.
// A cached plan is immutable; autograd keeps the buffer alive for the backward.
//
// Note [Layouts]
// Packed [T, ...]: the samples are cu_seqlens_host; tokens after cu_seqlens_host.back() (a
// collator's budget padding) belong to no sample: the kernels run on the covered prefix and those
// tokens get o = 0 (as gdn-reference gives them) and zero gradients.
// Padded [B, S, ...] with right padding: the kernels run on the B rows as B equal-length sequences
// of S tokens (cu = 0, S, 2S, ...). The recurrence is causal, so the padding after a sample's last
// real token cannot change any real token's output or gradient (padding outputs receive a zero
// cotangent, and nothing before them depends on them); the padding outputs are then set to 0 by
// selection (at::where, never a multiply), as in gdn-reference.
//
// Note [Dtype policy]
// The kernels read bf16 q/k/v and write a bf16 o (fp32 accumulation and state inside). fp32 or
// fp16 q/k/v are REJECTED with a UserError that names bf16 and the alternative (gdn-reference)
// rather than silently rounded to bf16: a fp32 run that silently lost 8 mantissa bits would pass
// for fp32 while being bf16. a and b may be bf16 or fp32 (read as is); A_log and dt_bias are cast to
// fp32 (a tiny [HV] op with its own autograd). Gradients come back in each input's dtype.
// CPU tensors are rejected with a UserError (this backend is CUDA only).
#include <qrun/sdk/error.h>
#include <qrun/sdk/kernels.h>
#include <qrun/sdk/plugin.h>

#include <gated_delta.h>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace qrun {
namespace {

constexpr const char* kName = "fla-gated-delta";

// The device-side boundaries of one batch (Note [Chunk tables]).
struct Plan {
  // key
  std::vector<int64_t> cu_host;  // SeqInfo::cu_seqlens_host as given
  int64_t total = 0;             // tokens of the flat stream
  int64_t row_width = 0;         // padded: S; packed: 0
  Layout layout = Layout::Packed;
  int device = -1;
  // value
  int64_t kernel_tokens = 0;  // tokens the kernels run on
  int64_t num_seqs = 0;       // sequences as the kernels see them
  int64_t num_chunks = 0;
  bool needs_mask = false;     // padded with at least one short row
  at::Tensor buf;              // int32 on the device, layout of Note [Chunk tables]

  const int32_t* cu() const { return buf.data_ptr<int32_t>(); }
  const int32_t* chunk_offsets() const { return cu() + (num_seqs + 1); }
  const int32_t* chunk_table() const { return cu() + 2 * (num_seqs + 1); }
  at::Tensor lengths() const {  // int32 [B], padded only
    return buf.narrow(0, 2 * (num_seqs + 1) + 2 * num_chunks, num_seqs);
  }
};

std::shared_ptr<const Plan> make_plan(const SeqInfo& seq, int64_t total, int64_t rows,
                                      int64_t width, const at::Device& dev) {
  auto p = std::make_shared<Plan>();
  p->cu_host = seq.cu_seqlens_host;
  p->total = total;
  p->layout = seq.layout;
  p->row_width = seq.layout == Layout::Padded ? width : 0;
  p->device = dev.index();
  const auto& cu = seq.cu_seqlens_host;
  QRUN_CHECK(!cu.empty() && cu.front() == 0,
             "{}: SeqInfo.cu_seqlens_host must start at 0 (got {} entries{})", kName, cu.size(),
             cu.empty() ? "" : fmt::format(", first {}", cu.front()));
  const int64_t n = static_cast<int64_t>(cu.size()) - 1;
  for (int64_t i = 0; i < n; ++i)
    QRUN_CHECK(cu[i + 1] >= cu[i], "{}: cu_seqlens_host is decreasing at sample {} ({} -> {})",
               kName, i, cu[i], cu[i + 1]);
  std::vector<int32_t> kcu;  // the kernels' cu_seqlens
  std::vector<int32_t> lens;
  if (seq.layout == Layout::Packed) {
    QRUN_CHECK(cu.back() <= total,
               "{}: cu_seqlens [0 .. {}] does not fit a packed stream of {} tokens", kName,
               cu.back(), total);
    p->kernel_tokens = cu.back();
    kcu.assign(cu.begin(), cu.end());
  } else {
    QRUN_CHECK(n == rows, "{}: padded batch has {} rows but cu_seqlens names {} samples", kName,
               rows, n);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t l = cu[i + 1] - cu[i];
      QRUN_CHECK(l <= width, "{}: sample {} has length {} but the padded rows are {} wide", kName,
                 i, l, width);
      p->needs_mask = p->needs_mask || l < width;
      lens.push_back(static_cast<int32_t>(l));
    }
    p->kernel_tokens = total;
    for (int64_t i = 0; i <= n; ++i) kcu.push_back(static_cast<int32_t>(i * width));
  }
  QRUN_CHECK(p->kernel_tokens <= INT32_MAX,
             "{}: {} tokens in one batch; the kernels' cu_seqlens are int32 (at most {})", kName,
             p->kernel_tokens, INT32_MAX);
  p->num_seqs = static_cast<int64_t>(kcu.size()) - 1;
  qrun::gdn::ChunkTables t = qrun::gdn::gdn_build_chunk_tables(kcu.data(), p->num_seqs);
  p->num_chunks = t.num_chunks;
  const int64_t count = static_cast<int64_t>(kcu.size() + t.chunk_offsets.size() +
                                             t.chunk_table.size() + lens.size());
  at::Tensor host =
      at::empty({count}, at::TensorOptions().dtype(at::kInt).pinned_memory(true));
  int32_t* h = host.data_ptr<int32_t>();
  auto put = [&](const std::vector<int32_t>& v) {
    if (!v.empty()) std::memcpy(h, v.data(), v.size() * sizeof(int32_t));
    h += v.size();
  };
  put(kcu);
  put(t.chunk_offsets);
  put(t.chunk_table);
  put(lens);
  // Pinned + non_blocking: an async copy on the current stream; the caching host allocator keeps
  // the staging block until the copy has run.
  p->buf = host.to(dev, /*non_blocking=*/true);
  return p;
}

int32_t as_i32(int64_t x) { return static_cast<int32_t>(x); }

// A [T, heads, d] tensor as the kernels take it: data pointer, token stride, head stride.
template <class Ptr>
void rows_of(const at::Tensor& t, Ptr& ptr, int64_t& st, int64_t& sh) {
  ptr = t.data_ptr();
  st = t.stride(0);
  sh = t.stride(1);
}

// A byte workspace of at least `bytes` (one byte when none is needed) from the caching allocator.
at::Tensor workspace(const at::Tensor& like, size_t bytes) {
  return at::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, like.options().dtype(at::kByte));
}

qrun::gdn::DType gdn_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? qrun::gdn::DType::BF16 : qrun::gdn::DType::F32;
}

// Kernels' std::runtime_error (bad arguments we did not foresee, or a failed launch) -> a qrun
// InternalError naming the backend: by the time we launch, every user-facing check has passed.
template <class F>
void call_kernels(const char* what, F&& f) {
  try {
    f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw InternalError(fmt::format("{}: {} failed: {}", kName, what, e.what()));
  }
}

// Flat inputs: q, k [T, H, K]; v [T, HV, V]; a, b [T, HV]; A_log, dt_bias fp32 [HV]; each with
// a unit innermost stride (the kernels take the two outer strides).
struct GdnFunction : public torch::autograd::Function<GdnFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                            const at::Tensor& b, const at::Tensor& A_log,
                            const at::Tensor& dt_bias, const at::Tensor& plan_buf,
                            int64_t num_seqs, int64_t num_chunks, bool qk_l2norm, double scale,
                            bool fast_forward, int64_t backward_path, bool keep_prep) {
    ctx->saved_data["backward_path"] = backward_path;
    ctx->saved_data["num_seqs"] = num_seqs;
    ctx->saved_data["num_chunks"] = num_chunks;
    ctx->saved_data["qk_l2norm"] = qk_l2norm;
    ctx->saved_data["scale"] = scale;
    const int64_t T = q.size(0), HV = v.size(1), V = v.size(2);
    at::Tensor o = at::empty({T, HV, V}, v.options());
    at::Tensor kept;  // Note [Kept prep] (gated_delta.cu): the forward's workspace
    if (T > 0) {
      c10::cuda::CUDAGuard guard(q.device());
      qrun::gdn::GdnProblem p = problem(q, k, v, a, b, A_log, dt_bias, plan_buf, num_seqs,
                                        num_chunks, qk_l2norm, scale);
      p.fast_forward = fast_forward;
      qrun::gdn::GdnFwdOut out;
      rows_of(o, out.o, out.o_st, out.o_sh);
      out.keep_for_backward = keep_prep && fast_forward;
      call_kernels("gdn_forward", [&] {
        const size_t ws_bytes = qrun::gdn::gdn_fwd_workspace_bytes(p);
        at::Tensor ws = workspace(q, ws_bytes);
        qrun::gdn::gdn_forward(p, out, ws.data_ptr(), ws_bytes,
                               at::cuda::getCurrentCUDAStream(q.device().index()).stream());
        if (out.keep_for_backward) kept = ws;
      });
    }
    // (saved as a variable, not in saved_data: autograd frees it once the backward has run)
    ctx->save_for_backward({q, k, v, a, b, A_log, dt_bias, plan_buf, kept});
    return o;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &a = saved[3], &b = saved[4],
                     &A_log = saved[5], &dt_bias = saved[6], &plan_buf = saved[7], &kept = saved[8];
    const int64_t num_seqs = ctx->saved_data["num_seqs"].toInt();
    const int64_t num_chunks = ctx->saved_data["num_chunks"].toInt();
    const bool qk_l2norm = ctx->saved_data["qk_l2norm"].toBool();
    const double scale = ctx->saved_data["scale"].toDouble();
    const auto backward_path = static_cast<qrun::gdn::GdnProblem::BwdPath>(ctx->saved_data["backward_path"].toInt());
    at::Tensor dO = grads[0];
    const int64_t T = q.size(0), HV = v.size(1);
    at::Tensor dq = at::empty_like(q, at::MemoryFormat::Contiguous);
    at::Tensor dk = at::empty_like(k, at::MemoryFormat::Contiguous);
    at::Tensor dv = at::empty_like(v, at::MemoryFormat::Contiguous);
    at::Tensor da = at::empty({T, HV}, q.options().dtype(at::kFloat));
    at::Tensor db = at::empty({T, HV}, q.options().dtype(at::kFloat));
    at::Tensor dA_log = at::empty({HV}, q.options().dtype(at::kFloat));
    at::Tensor ddt = at::empty({HV}, q.options().dtype(at::kFloat));
    if (!dO.defined() || T == 0) {
      for (at::Tensor* t : {&dq, &dk, &dv, &da, &db, &dA_log, &ddt}) t->zero_();
    } else {
      c10::cuda::CUDAGuard guard(q.device());
      if (dO.scalar_type() != at::kBFloat16) dO = dO.to(at::kBFloat16);
      if (dO.stride(-1) != 1) dO = dO.contiguous();
      qrun::gdn::GdnProblem p = problem(q, k, v, a, b, A_log, dt_bias, plan_buf, num_seqs,
                                        num_chunks, qk_l2norm, scale);
      p.backward_path = backward_path;
      qrun::gdn::GdnBwdIO io;
      rows_of(dO, io.dO, io.do_st, io.do_sh);
      io.grad_dtype = qrun::gdn::DType::BF16;  // dq, dk, dv are returned in bf16 (the inputs')
      rows_of(dq, io.dq, io.dq_st, io.dq_sh);
      rows_of(dk, io.dk, io.dk_st, io.dk_sh);
      rows_of(dv, io.dv, io.dv_st, io.dv_sh);
      io.dg = da.data_ptr<float>();     // gate_fused: d/da
      io.dbeta = db.data_ptr<float>();  // beta_sigmoid: d/db
      io.dA_log = dA_log.data_ptr<float>();
      io.ddt_bias = ddt.data_ptr<float>();
      if (kept.defined()) io.forward_workspace = kept.data_ptr();
      call_kernels("gdn_backward", [&] {
        const size_t ws_bytes = qrun::gdn::gdn_bwd_workspace_bytes(p, kept.defined());
        at::Tensor ws = workspace(q, ws_bytes);
        qrun::gdn::gdn_backward(p, io, ws.data_ptr(), ws_bytes,
                                at::cuda::getCurrentCUDAStream(q.device().index()).stream());
      });
    }
    return {dq, dk, dv, da.to(a.scalar_type()), db.to(b.scalar_type()), dA_log, ddt,
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }

  static qrun::gdn::GdnProblem problem(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const at::Tensor& a,
                                       const at::Tensor& b, const at::Tensor& A_log,
                                       const at::Tensor& dt_bias, const at::Tensor& plan_buf,
                                       int64_t num_seqs, int64_t num_chunks, bool qk_l2norm,
                                       double scale) {
    qrun::gdn::GdnProblem p;
    p.total_tokens = q.size(0);
    p.num_seqs = num_seqs;
    p.num_chunks = num_chunks;
    p.H = as_i32(q.size(1));
    p.HV = as_i32(v.size(1));
    p.K = as_i32(q.size(2));
    p.V = as_i32(v.size(2));
    const int32_t* buf = plan_buf.data_ptr<int32_t>();
    p.cu_seqlens = buf;
    p.chunk_offsets = buf + (num_seqs + 1);
    p.chunk_table = buf + 2 * (num_seqs + 1);
    rows_of(q, p.q, p.q_st, p.q_sh);
    rows_of(k, p.k, p.k_st, p.k_sh);
    rows_of(v, p.v, p.v_st, p.v_sh);
    p.gate_fused = true;
    p.a = a.data_ptr();
    p.a_dtype = gdn_dtype(a);
    p.a_st = a.stride(0);
    p.A_log = A_log.data_ptr<float>();
    p.dt_bias = dt_bias.data_ptr<float>();
    p.beta = b.data_ptr();
    p.beta_dtype = gdn_dtype(b);
    p.beta_st = b.stride(0);
    p.beta_sigmoid = true;
    p.qk_l2norm = qk_l2norm;
    p.scale = scale > 0 ? static_cast<float>(scale) : -1.f;
    return p;
  }
};

const char* dtype_name(const at::Tensor& t) { return c10::toString(t.scalar_type()); }

class FlaGatedDelta final : public LinearAttention {
 public:
  FlaGatedDelta(bool fast_forward, qrun::gdn::GdnProblem::BwdPath backward_path, bool keep_prep)
      : fast_forward_(fast_forward), backward_path_(backward_path), keep_prep_(keep_prep) {}

  // The checks of forward() that a recipe can fail, answered before any weight is loaded.
  std::string unsupported(const KernelUse& u) const override {
    if (u.device != c10::DeviceType::CUDA)
      return "this backend runs on CUDA only (sm_90 or newer), not on " + c10::DeviceTypeName(u.device, true) +
             " (gdn-reference runs everywhere)";
    if (u.dtype != at::kBFloat16)
      return std::string("its kernels take bfloat16 q, k and v, not ") + c10::toString(u.dtype) +
             " (set precision.compute: bf16)";
    if ((u.head_dim != 0 && u.head_dim != 128) || (u.value_dim != 0 && u.value_dim != 128))
      return fmt::format("its kernels take head dims K = V = 128, not K = {}, V = {}", u.head_dim, u.value_dim);
    if (u.heads > 0 && u.kv_heads % u.heads != 0)
      return fmt::format("{} value heads are not a multiple of {} key heads", u.kv_heads, u.heads);
    return {};
  }

  at::Tensor forward(const GatedDeltaInputs& in, const SeqInfo& seq,
                     const GatedDeltaOptions& opt) override {
    const bool padded = seq.layout == Layout::Padded;
    const int64_t lead = padded ? 2 : 1;
    const char* shape = padded ? "B, S" : "T";
    const std::pair<const char*, const at::Tensor*> all[] = {
        {"q", &in.q}, {"k", &in.k}, {"v", &in.v}, {"a", &in.a},
        {"b", &in.b}, {"A_log", &in.A_log}, {"dt_bias", &in.dt_bias}};
    for (const auto& [n, t] : all) QRUN_CHECK(t->defined(), "{}: input {} is undefined", kName, n);
    // Device first: the most likely mistake (a CPU run with this backend in the recipe).
    for (const auto& [n, t] : all)
      QRUN_CHECK(t->is_cuda(),
                 "{}: {} is a {} tensor; this backend runs on CUDA only. For CPU runs set "
                 "`kernels.linear_attention: gdn-reference` (reference-kernels plugin)",
                 kName, n, t->device().str());
    for (const auto& [n, t] : all)
      QRUN_CHECK(t->device() == in.q.device(), "{}: {} is on {} but q is on {}", kName, n,
                 t->device().str(), in.q.device().str());
    // See Note [Dtype policy].
    for (const auto& [n, t] : {all[0], all[1], all[2]})
      QRUN_CHECK(t->scalar_type() == at::kBFloat16,
                 "{}: {} is {}, but the fused kernels take bfloat16 q, k and v (fp32 accumulation "
                 "inside). Run the model in bfloat16, or set `kernels.linear_attention: "
                 "gdn-reference` for {} runs",
                 kName, n, dtype_name(*t), dtype_name(*t));
    for (const auto& [n, t] : {all[3], all[4]})
      QRUN_CHECK(t->scalar_type() == at::kBFloat16 || t->scalar_type() == at::kFloat,
                 "{}: {} is {}; the kernels read bfloat16 or float32 gate inputs", kName, n,
                 dtype_name(*t));
    for (const auto& [n, t] : {all[5], all[6]})
      QRUN_CHECK(t->is_floating_point(), "{}: {} must be floating point, got {}", kName, n,
                 dtype_name(*t));
    QRUN_CHECK(in.q.dim() == lead + 2 && in.k.dim() == lead + 2 && in.v.dim() == lead + 2,
               "{}: q, k, v must be [{}, heads, dim] for a {} batch, got q {}, k {}, v {}", kName,
               shape, layout_name(seq.layout), in.q.sizes(), in.k.sizes(), in.v.sizes());
    QRUN_CHECK(in.a.dim() == lead + 1 && in.b.dim() == lead + 1,
               "{}: a and b must be [{}, value heads], got a {}, b {}", kName, shape,
               in.a.sizes(), in.b.sizes());
    const int64_t H = in.q.size(-2), K = in.q.size(-1), HV = in.v.size(-2), V = in.v.size(-1);
    QRUN_CHECK(in.k.sizes() == in.q.sizes(), "{}: k {} differs from q {}", kName, in.k.sizes(),
               in.q.sizes());
    for (int64_t d = 0; d < lead; ++d)
      QRUN_CHECK(in.v.size(d) == in.q.size(d) && in.a.size(d) == in.q.size(d) &&
                     in.b.size(d) == in.q.size(d),
                 "{}: q, v, a, b disagree on the token dims: q {}, v {}, a {}, b {}", kName,
                 in.q.sizes(), in.v.sizes(), in.a.sizes(), in.b.sizes());
    QRUN_CHECK(H > 0 && HV % H == 0, "{}: {} value heads are not a multiple of {} key heads",
               kName, HV, H);
    QRUN_CHECK(in.a.size(-1) == HV && in.b.size(-1) == HV && in.A_log.numel() == HV &&
                   in.dt_bias.numel() == HV,
               "{}: a, b, A_log, dt_bias must have {} value heads (got {}, {}, {}, {})", kName, HV,
               in.a.size(-1), in.b.size(-1), in.A_log.numel(), in.dt_bias.numel());
    QRUN_CHECK(K == 128 && V == 128,
               "{}: the kernels support head dims K = V = 128 (every Qwen3.5 / Qwen3-Next GDN "
               "layer), got K = {}, V = {}; use `kernels.linear_attention: gdn-reference` for "
               "other sizes",
               kName, K, V);

    // Flatten the token dims (a view whenever the strides allow it).
    auto flat = [&](const at::Tensor& t) { return padded ? t.flatten(0, 1) : t; };
    auto inner = [](at::Tensor t) { return t.stride(-1) == 1 ? t : t.contiguous(); };
    at::Tensor q = inner(flat(in.q)), k = inner(flat(in.k)), v = inner(flat(in.v));
    at::Tensor a = inner(flat(in.a)), b = inner(flat(in.b));
    at::Tensor A_log = in.A_log.reshape({HV}).to(at::kFloat).contiguous();
    at::Tensor dt_bias = in.dt_bias.reshape({HV}).to(at::kFloat).contiguous();
    const int64_t total = q.size(0);

    c10::cuda::CUDAGuard guard(in.q.device());
    std::shared_ptr<const Plan> plan =
        plan_for(seq, total, padded ? in.q.size(0) : 1, padded ? in.q.size(1) : total,
                 in.q.device());
    const int64_t kt = plan->kernel_tokens;
    if (kt < total) {  // packed with budget padding after the last sample (Note [Layouts])
      q = q.narrow(0, 0, kt);
      k = k.narrow(0, 0, kt);
      v = v.narrow(0, 0, kt);
      a = a.narrow(0, 0, kt);
      b = b.narrow(0, 0, kt);
    }
    // Keep prep only where a backward can follow (Note [Kept prep]): not under no_grad (inference,
    // or the first forward of an activation-checkpointed layer).
    bool grad = false;
    for (const at::Tensor* t : {&q, &k, &v, &a, &b, &A_log, &dt_bias}) grad = grad || t->requires_grad();
    const bool keep = keep_prep_ && at::GradMode::is_enabled() && grad;
    at::Tensor o = GdnFunction::apply(q, k, v, a, b, A_log, dt_bias, plan->buf, plan->num_seqs,
                                      plan->num_chunks, opt.qk_l2norm, opt.scale, fast_forward_,
                                      static_cast<int64_t>(backward_path_), keep);
    if (kt < total) o = at::constant_pad_nd(o, {0, 0, 0, 0, 0, total - kt});
    if (!padded) return o;
    const int64_t B = in.q.size(0), S = in.q.size(1);
    o = o.view({B, S, HV, V});
    if (plan->needs_mask) {
      at::Tensor pos = at::arange(S, plan->buf.options()).view({1, S});
      at::Tensor valid = (pos < plan->lengths().view({B, 1})).view({B, S, 1, 1});
      o = at::where(valid, o, at::zeros({}, o.options()));
    }
    return o;
  }

 private:
  // Note [Chunk tables]: reuse the last plan when the boundaries are the same.
  std::shared_ptr<const Plan> plan_for(const SeqInfo& seq, int64_t total, int64_t rows,
                                       int64_t width, const at::Device& dev) {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t rw = seq.layout == Layout::Padded ? width : 0;
    if (last_ && last_->layout == seq.layout && last_->total == total &&
        last_->row_width == rw && last_->device == dev.index() &&
        last_->cu_host == seq.cu_seqlens_host)
      return last_;
    last_ = make_plan(seq, total, rows, width, dev);
    return last_;
  }

  const bool fast_forward_;
  const qrun::gdn::GdnProblem::BwdPath backward_path_;
  const bool keep_prep_;
  std::mutex mu_;
  std::shared_ptr<const Plan> last_;
};

void register_all(Registrar& r) {
  r.add<LinearAttention>(
      kName,
      "CUDA chunked gated delta rule (sm_90, bf16 q/k/v, fp32 state; fused gate, beta and q/k "
      "L2 norm; varlen)",
      Schema{Field::choice("forward_operands", "fp16", {"fp16", "bf16x2"})
                 .doc("operands of the forward's tensor-core products: fp16 (one plane, range-"
                      "checked per sequence with a bf16x2 fallback; the fast default) or bf16x2 "
                      "(hi/lo bf16 planes, 16 significant bits)"),
             Field::choice("backward_operands", "auto", {"auto", "fp16", "bf16x2"})
                 .doc("operands of the backward's reverse pass (the state gradient): fp16 (scaled "
                      "per product, 11 significant bits), bf16x2, or auto: fp16 on H100/H200 "
                      "(sm_90, where it is faster at every batch shape), elsewhere fp16 when the "
                      "batch has at least as many (sequence, value head, 64-wide V slice) items "
                      "as the GPU has SMs (the other backward products are always bf16x2)"),
             Field::boolean("keep_prep", true)
                 .doc("keep the forward's per-chunk prep (the WY inverse T, the gates, fp16 q/k "
                      "copies) for the backward instead of recomputing it there (with fp16 "
                      "forward operands, when gradients are recorded): about 33 KiB per token at "
                      "48 value heads (277 MB per layer at 8192 tokens) held from each layer's "
                      "forward to its backward, for about 0.17 ms less backward per layer at "
                      "8192 tokens on an H200. With activation_checkpointing the buffer lives "
                      "only through one layer's recompute and backward")},
      [](const Config& c) {
        using Path = qrun::gdn::GdnProblem::BwdPath;
        const std::string bwd = c.get_optional_string("backward_operands").value_or("auto");
        return std::make_unique<FlaGatedDelta>(c.get_optional_string("forward_operands").value_or("fp16") == "fp16",
                                               bwd == "fp16" ? Path::Fp16 : bwd == "bf16x2" ? Path::Bf16x2 : Path::Auto,
                                               c.has("keep_prep") ? c.get_bool("keep_prep") : true);
      });
}

}  // namespace
}  // namespace qrun

QRUN_PLUGIN("fla-gated-delta", "0.1.0", qrun::register_all)
