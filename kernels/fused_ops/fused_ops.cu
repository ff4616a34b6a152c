// Fused norms, SwiGLU and the cross-entropy row kernel (fused_ops.h has the contract).
//
// Note [Row kernels]
// A row is handled by one warp when it has at most 1,024 elements (the per-head norms: 128 and
// 256) and by one block of 256 threads otherwise (the layer norms: 5,120 at 27B). Rows are read
// twice - once for the statistics, once for the result - the second read hitting L1/L2: a row is
// at most 32 KB. Backward kernels accumulate the weight gradient of the rows they handle in
// shared memory (each column owned by one thread of a warp-slot, so the order is fixed), write
// one fp32 partial per slot, and a second kernel sums the partials in slot order: deterministic.
#include "fused_ops.h"

#include "../common/qrun_vec.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace qrun::fops {
namespace {

using vec::from_f;
using vec::sigmoid;
using vec::to_f;
using vec::zero;

constexpr int kBlockThreads = 256;  // threads of a block-per-row kernel, and of a warp-per-row block
constexpr int kWarpRowsMax = 1024;  // largest row a warp handles
constexpr int kMaxCols = 16384;     // largest row a block handles (its dw slot: 64 KB of shared memory)
constexpr int kMaxBlocks = 512;     // grid cap of the row kernels (rows are grid-strided)

size_t esize(DType d) { return d == DType::F32 ? 4 : 2; }

void check_launch(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("fused_ops ") + what + ": " + cudaGetErrorString(e));
}

[[noreturn]] void bad(const std::string& m) { throw std::invalid_argument("fused_ops: " + m); }

template <typename T>
__device__ __forceinline__ const T* row_ptr(const Rows& r, int64_t row, int64_t inner) {
  return static_cast<const T*>(r.ptr) + (row / inner) * r.ld_outer + (row % inner) * r.ld_inner;
}
template <typename T>
__device__ __forceinline__ T* row_ptr(const MutRows& r, int64_t row, int64_t inner) {
  return static_cast<T*>(r.ptr) + (row / inner) * r.ld_outer + (row % inner) * r.ld_inner;
}

// The lane layout of Note [Row kernels]: which row this warp/block starts at, the stride between
// its rows, its lane in the row and the number of lanes per row.
template <bool WARP>
struct RowLanes {
  int64_t first, step;
  int lane, lanes, slot;  // slot: index of this warp/block's dw partial
  __device__ RowLanes() {
    if constexpr (WARP) {
      const int wpb = blockDim.x / 32;
      first = static_cast<int64_t>(blockIdx.x) * wpb + threadIdx.x / 32;
      step = static_cast<int64_t>(gridDim.x) * wpb;
      lane = threadIdx.x % 32;
      lanes = 32;
      slot = blockIdx.x * wpb + threadIdx.x / 32;
    } else {
      first = blockIdx.x;
      step = gridDim.x;
      lane = threadIdx.x;
      lanes = blockDim.x;
      slot = blockIdx.x;
    }
  }
};

template <bool WARP>
__device__ __forceinline__ float row_sum(float v, float* red) {
  if constexpr (WARP) return vec::warp_sum(v);
  else return vec::block_sum(v, red);
}

template <typename TW>
__device__ __forceinline__ float weight_at(const void* w, int64_t c, bool zero_centred) {
  const float v = to_f(static_cast<const TW*>(w)[c]);
  return zero_centred ? 1.f + v : v;
}

// ----------------------------------------------------------------------------------------------
// RMSNorm (+ residual add, + partial rope)

template <typename T, typename TW, int VEC, bool WARP>
__global__ void __launch_bounds__(kBlockThreads)
    norm_fwd_kernel(NormArgs a, MutRows y, MutRows s, float* __restrict__ rstd) {
  __shared__ float red[32];
  const RowLanes<WARP> L;
  const int64_t rows = a.outer * a.inner;
  const int half = a.rot / 2;
  for (int64_t r = L.first; r < rows; r += L.step) {
    const T* x = row_ptr<T>(a.x, r, a.inner);
    const T* res = a.residual.ptr ? row_ptr<T>(a.residual, r, a.inner) : nullptr;
    T* sp = s.ptr ? row_ptr<T>(s, r, a.inner) : nullptr;
    float ss = 0.f;
    for (int64_t c = static_cast<int64_t>(L.lane) * VEC; c < a.cols; c += static_cast<int64_t>(L.lanes) * VEC) {
      float v[VEC];
      vec::load<T, VEC>(x + c, v);
      if (res) {
        float rv[VEC];
        vec::load<T, VEC>(res + c, rv);
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = vec::round_to<T>(v[k] + rv[k]);
        vec::store<T, VEC>(sp + c, v);
      }
#pragma unroll
      for (int k = 0; k < VEC; ++k) ss = fmaf(v[k], v[k], ss);
    }
    const float rs = rsqrtf(row_sum<WARP>(ss, red) / static_cast<float>(a.cols) + a.eps);
    if (L.lane == 0) rstd[r] = rs;
    // The block's own writes of s are visible to its threads after this barrier (block mode);
    // in warp mode after __syncwarp (the rope reads a partner chunk another lane wrote).
    if constexpr (!WARP) __syncthreads();
    else __syncwarp();
    const T* src = res ? static_cast<const T*>(sp) : x;
    T* yr = row_ptr<T>(y, r, a.inner);
    const int64_t o = r / a.inner;
    const T* cs = a.rot ? static_cast<const T*>(a.cos) + o * a.ld_rope : nullptr;
    const T* sn = a.rot ? static_cast<const T*>(a.sin) + o * a.ld_rope : nullptr;
    for (int64_t c = static_cast<int64_t>(L.lane) * VEC; c < a.cols; c += static_cast<int64_t>(L.lanes) * VEC) {
      float v[VEC];
      vec::load<T, VEC>(src + c, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[k] = v[k] * rs * weight_at<TW>(a.w, c + k, a.zero_centred);
      if (c < a.rot) {
        // rotate-half: the partner chunk is half away (half % VEC == 0, checked on the host).
        const int64_t pc = c < half ? c + half : c - half;
        float pv[VEC], co[VEC], si[VEC];
        vec::load<T, VEC>(src + pc, pv);
        vec::load<T, VEC>(cs + c, co);
        vec::load<T, VEC>(sn + c, si);
        const float sign = c < half ? -1.f : 1.f;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float p = pv[k] * rs * weight_at<TW>(a.w, pc + k, a.zero_centred);
          v[k] = v[k] * co[k] + sign * p * si[k];
        }
      }
      vec::store<T, VEC>(yr + c, v);
    }
  }
}

// dy after the rope's adjoint at column chunk c (the gradient of the un-rotated product y~).
template <typename T, int VEC>
__device__ __forceinline__ void rope_adjoint(const T* dy, const T* cs, const T* sn, int64_t c, int half,
                                             float (&g)[VEC]) {
  const int64_t pc = c < half ? c + half : c - half;
  float pg[VEC], co[VEC], sip[VEC];
  vec::load<T, VEC>(dy + pc, pg);
  vec::load<T, VEC>(cs + c, co);
  vec::load<T, VEC>(sn + pc, sip);
  // y[d] = y~[d] c[d] - y~[d+h] s[d];  y[d+h] = y~[d+h] c[d+h] + y~[d] s[d+h]
  // => dy~[d] = dy[d] c[d] + dy[d+h] s[d+h];  dy~[d+h] = dy[d+h] c[d+h] - dy[d] s[d]
  const float sign = c < half ? 1.f : -1.f;
#pragma unroll
  for (int k = 0; k < VEC; ++k) g[k] = g[k] * co[k] + sign * pg[k] * sip[k];
}

template <typename T, typename TW, int VEC, bool WARP>
__global__ void __launch_bounds__(kBlockThreads)
    norm_bwd_kernel(NormArgs a, const float* __restrict__ rstd, Rows dy, Rows ds, MutRows dx,
                    float* __restrict__ ws) {
  __shared__ float red[32];
  extern __shared__ float acc[];  // dw of this warp/block's rows: [slots in block][cols]
  const RowLanes<WARP> L;
  float* my = acc + (WARP ? (threadIdx.x / 32) * a.cols : 0);
  for (int64_t c = static_cast<int64_t>(L.lane) * VEC; c < a.cols; c += static_cast<int64_t>(L.lanes) * VEC)
#pragma unroll
    for (int k = 0; k < VEC; ++k) my[c + k] = 0.f;
  const int64_t rows = a.outer * a.inner;
  const int half = a.rot / 2;
  const float inv_n = 1.f / static_cast<float>(a.cols);
  for (int64_t r = L.first; r < rows; r += L.step) {
    const T* x = row_ptr<T>(a.x, r, a.inner);
    const T* g = row_ptr<T>(dy, r, a.inner);
    const int64_t o = r / a.inner;
    const T* cs = a.rot ? static_cast<const T*>(a.cos) + o * a.ld_rope : nullptr;
    const T* sn = a.rot ? static_cast<const T*>(a.sin) + o * a.ld_rope : nullptr;
    const float rs = rstd[r];
    float dot = 0.f;
    for (int64_t c = static_cast<int64_t>(L.lane) * VEC; c < a.cols; c += static_cast<int64_t>(L.lanes) * VEC) {
      float xv[VEC], gv[VEC];
      vec::load<T, VEC>(x + c, xv);
      vec::load<T, VEC>(g + c, gv);
      if (c < a.rot) rope_adjoint<T, VEC>(g, cs, sn, c, half, gv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) dot = fmaf(gv[k] * weight_at<TW>(a.w, c + k, a.zero_centred), xv[k] * rs, dot);
    }
    const float m = row_sum<WARP>(dot, red) * inv_n;
    const T* e = ds.ptr ? row_ptr<T>(ds, r, a.inner) : nullptr;
    T* out = row_ptr<T>(dx, r, a.inner);
    for (int64_t c = static_cast<int64_t>(L.lane) * VEC; c < a.cols; c += static_cast<int64_t>(L.lanes) * VEC) {
      float xv[VEC], gv[VEC], res[VEC];
      vec::load<T, VEC>(x + c, xv);
      vec::load<T, VEC>(g + c, gv);
      if (c < a.rot) rope_adjoint<T, VEC>(g, cs, sn, c, half, gv);
      if (e) vec::load<T, VEC>(e + c, res);
      else zero(res);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float xh = xv[k] * rs;
        const float dn = gv[k] * weight_at<TW>(a.w, c + k, a.zero_centred);
        res[k] += rs * (dn - xh * m);
        my[c + k] = fmaf(gv[k], xh, my[c + k]);
      }
      vec::store<T, VEC>(out + c, res);
    }
  }
  for (int64_t c = static_cast<int64_t>(L.lane) * VEC; c < a.cols; c += static_cast<int64_t>(L.lanes) * VEC)
#pragma unroll
    for (int k = 0; k < VEC; ++k) ws[static_cast<int64_t>(L.slot) * a.cols + c + k] = my[c + k];
}

// dw[c] = sum over slots of ws[slot][c], in slot order.
template <typename TW>
__global__ void dw_reduce_kernel(const float* __restrict__ ws, int64_t slots, int64_t cols, TW* __restrict__ dw) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0.f;
  for (int64_t k = 0; k < slots; ++k) s += ws[k * cols + c];
  dw[c] = from_f<TW>(s);
}

// ----------------------------------------------------------------------------------------------
// Gated RMSNorm

template <typename T, typename TW, int VEC, bool WARP>
__global__ void __launch_bounds__(kBlockThreads)
    gated_fwd_kernel(GatedNormArgs a, MutRows y, float* __restrict__ rstd) {
  __shared__ float red[32];
  const RowLanes<WARP> L;
  const TW* w = static_cast<const TW*>(a.w);
  for (int64_t r = L.first; r < a.rows; r += L.step) {
    const T* x = row_ptr<T>(a.x, r, 1);
    const T* z = row_ptr<T>(a.z, r, 1);
    float ss = 0.f;
    for (int64_t c = static_cast<int64_t>(L.lane) * VEC; c < a.cols; c += static_cast<int64_t>(L.lanes) * VEC) {
      float v[VEC];
      vec::load<T, VEC>(x + c, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) ss = fmaf(v[k], v[k], ss);
    }
    const float rs = rsqrtf(row_sum<WARP>(ss, red) / static_cast<float>(a.cols) + a.eps);
    if (L.lane == 0) rstd[r] = rs;
    T* yr = row_ptr<T>(y, r, 1);
    for (int64_t c = static_cast<int64_t>(L.lane) * VEC; c < a.cols; c += static_cast<int64_t>(L.lanes) * VEC) {
      float v[VEC], zv[VEC];
      vec::load<T, VEC>(x + c, v);
      vec::load<T, VEC>(z + c, zv);
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        v[k] = to_f(w[c + k]) * vec::round_to<T>(v[k] * rs) * (zv[k] * sigmoid(zv[k]));
      vec::store<T, VEC>(yr + c, v);
    }
  }
}

template <typename T, typename TW, int VEC, bool WARP>
__global__ void __launch_bounds__(kBlockThreads)
    gated_bwd_kernel(GatedNormArgs a, const float* __restrict__ rstd, Rows dy, MutRows dx, MutRows dz,
                     float* __restrict__ ws) {
  __shared__ float red[32];
  extern __shared__ float acc[];
  const RowLanes<WARP> L;
  const TW* w = static_cast<const TW*>(a.w);
  float* my = acc + (WARP ? (threadIdx.x / 32) * a.cols : 0);
  for (int64_t c = static_cast<int64_t>(L.lane) * VEC; c < a.cols; c += static_cast<int64_t>(L.lanes) * VEC)
#pragma unroll
    for (int k = 0; k < VEC; ++k) my[c + k] = 0.f;
  const float inv_n = 1.f / static_cast<float>(a.cols);
  for (int64_t r = L.first; r < a.rows; r += L.step) {
    const T* x = row_ptr<T>(a.x, r, 1);
    const T* z = row_ptr<T>(a.z, r, 1);
    const T* g = row_ptr<T>(dy, r, 1);
    const float rs = rstd[r];
    float dot = 0.f;
    for (int64_t c = static_cast<int64_t>(L.lane) * VEC; c < a.cols; c += static_cast<int64_t>(L.lanes) * VEC) {
      float xv[VEC], zv[VEC], gv[VEC];
      vec::load<T, VEC>(x + c, xv);
      vec::load<T, VEC>(z + c, zv);
      vec::load<T, VEC>(g + c, gv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float dn = gv[k] * (zv[k] * sigmoid(zv[k])) * to_f(w[c + k]);
        dot = fmaf(dn, xv[k] * rs, dot);
      }
    }
    const float m = row_sum<WARP>(dot, red) * inv_n;
    T* ox = row_ptr<T>(dx, r, 1);
    T* oz = row_ptr<T>(dz, r, 1);
    for (int64_t c = static_cast<int64_t>(L.lane) * VEC; c < a.cols; c += static_cast<int64_t>(L.lanes) * VEC) {
      float xv[VEC], zv[VEC], gv[VEC];
      vec::load<T, VEC>(x + c, xv);
      vec::load<T, VEC>(z + c, zv);
      vec::load<T, VEC>(g + c, gv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float xh = xv[k] * rs, nb = vec::round_to<T>(xh), wv = to_f(w[c + k]);
        const float sg = sigmoid(zv[k]), sz = zv[k] * sg;
        const float dn = gv[k] * sz * wv;
        my[c + k] = fmaf(gv[k] * sz, nb, my[c + k]);
        zv[k] = gv[k] * wv * nb * sg * (1.f + zv[k] * (1.f - sg));
        xv[k] = rs * (dn - xh * m);
      }
      vec::store<T, VEC>(ox + c, xv);
      vec::store<T, VEC>(oz + c, zv);
    }
  }
  for (int64_t c = static_cast<int64_t>(L.lane) * VEC; c < a.cols; c += static_cast<int64_t>(L.lanes) * VEC)
#pragma unroll
    for (int k = 0; k < VEC; ++k) ws[static_cast<int64_t>(L.slot) * a.cols + c + k] = my[c + k];
}

// ----------------------------------------------------------------------------------------------
// SwiGLU

template <typename T, int VEC>
__global__ void swiglu_fwd_kernel(SwiGluArgs a, MutRows y) {
  const int64_t per_row = a.cols / VEC;
  const int64_t n = a.rows * per_row;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / per_row, c = (e % per_row) * VEC;
    float g[VEC], u[VEC];
    vec::load<T, VEC>(row_ptr<T>(a.g, r, 1) + c, g);
    vec::load<T, VEC>(row_ptr<T>(a.u, r, 1) + c, u);
#pragma unroll
    for (int k = 0; k < VEC; ++k) g[k] = g[k] * sigmoid(g[k]) * u[k];
    vec::store<T, VEC>(row_ptr<T>(y, r, 1) + c, g);
  }
}

template <typename T, int VEC>
__global__ void swiglu_bwd_kernel(SwiGluArgs a, Rows dy, MutRows dg, MutRows du) {
  const int64_t per_row = a.cols / VEC;
  const int64_t n = a.rows * per_row;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / per_row, c = (e % per_row) * VEC;
    float g[VEC], u[VEC], d[VEC];
    vec::load<T, VEC>(row_ptr<T>(a.g, r, 1) + c, g);
    vec::load<T, VEC>(row_ptr<T>(a.u, r, 1) + c, u);
    vec::load<T, VEC>(row_ptr<T>(dy, r, 1) + c, d);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float s = sigmoid(g[k]);
      const float dgk = d[k] * u[k] * s * (1.f + g[k] * (1.f - s));
      u[k] = d[k] * g[k] * s;  // du
      g[k] = dgk;
    }
    vec::store<T, VEC>(row_ptr<T>(dg, r, 1) + c, g);
    vec::store<T, VEC>(row_ptr<T>(du, r, 1) + c, u);
  }
}

// ----------------------------------------------------------------------------------------------
// Cross-entropy rows

constexpr int kCeThreads = 512;

// Online logsumexp state: running max m and sum s of exp(x - m).
struct Lse {
  float m, s;
};
__device__ __forceinline__ Lse lse_merge(Lse a, Lse b) {
  if (a.m < b.m) {
    const Lse t = a;
    a = b;
    b = t;
  }
  if (b.m == -INFINITY) return a;
  return {a.m, a.s + b.s * expf(b.m - a.m)};
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kCeThreads)
    ce_rows_kernel(T* __restrict__ logits, int64_t V, int64_t ld, const int64_t* __restrict__ targets,
                   float* __restrict__ loss) {
  __shared__ float sm[32], ss[32];
  __shared__ float target_logit;
  const int64_t r = blockIdx.x;
  T* row = logits + r * ld;
  const int64_t t = targets[r];
  const bool ignored = t < 0 || t >= V;
  if (ignored) {
    float z[VEC];
    zero(z);
    for (int64_t c = static_cast<int64_t>(threadIdx.x) * VEC; c < V; c += kCeThreads * VEC) vec::store<T, VEC>(row + c, z);
    if (threadIdx.x == 0) loss[r] = 0.f;
    return;
  }
  if (threadIdx.x == 0) target_logit = to_f(row[t]);
  Lse st{-INFINITY, 0.f};
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * VEC; c < V; c += kCeThreads * VEC) {
    float v[VEC];
    vec::load<T, VEC>(row + c, v);
    float m = v[0];
#pragma unroll
    for (int k = 1; k < VEC; ++k) m = fmaxf(m, v[k]);
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < VEC; ++k) s += expf(v[k] - m);
    st = lse_merge(st, {m, s});
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Lse other{__shfl_xor_sync(0xffffffffu, st.m, o), __shfl_xor_sync(0xffffffffu, st.s, o)};
    st = lse_merge(st, other);
  }
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (l == 0) sm[w] = st.m, ss[w] = st.s;
  __syncthreads();  // also orders target_logit's read before the overwrite below
  st = Lse{-INFINITY, 0.f};
  for (int k = 0; k < kCeThreads / 32; ++k) st = lse_merge(st, {sm[k], ss[k]});
  const float lse = st.m + logf(st.s);
  if (threadIdx.x == 0) loss[r] = lse - target_logit;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * VEC; c < V; c += kCeThreads * VEC) {
    float v[VEC];
    vec::load<T, VEC>(row + c, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = expf(v[k] - lse) - (c + k == t ? 1.f : 0.f);
    vec::store<T, VEC>(row + c, v);
  }
}

// ----------------------------------------------------------------------------------------------
// Dispatch

// f.template operator()<T, TW>() for (activation dtype, weight dtype): TW is fp32 or T.
template <typename F>
void dispatch_tw(DType d, DType wd, F&& f) {
  if (wd != DType::F32 && wd != d) bad("a norm weight must be fp32 or the activations' dtype");
  const bool wf = wd == DType::F32;
  switch (d) {
    case DType::F32: f.template operator()<float, float>(); break;
    case DType::BF16:
      if (wf) f.template operator()<__nv_bfloat16, float>();
      else f.template operator()<__nv_bfloat16, __nv_bfloat16>();
      break;
    case DType::F16:
      if (wf) f.template operator()<__half, float>();
      else f.template operator()<__half, __half>();
      break;
  }
}

template <typename F>
void dispatch_t(DType d, F&& f) {
  switch (d) {
    case DType::F32: f.template operator()<float>(); break;
    case DType::BF16: f.template operator()<__nv_bfloat16>(); break;
    case DType::F16: f.template operator()<__half>(); break;
  }
}

bool rows_aligned(const Rows& r, size_t es, bool two_level) {
  return vec::aligned16(r.ptr, r.ld_outer, es) && (!two_level || (r.ld_inner * es) % 16 == 0);
}
bool rows_aligned(const MutRows& r, size_t es, bool two_level) {
  return rows_aligned(Rows{r.ptr, r.ld_outer, r.ld_inner}, es, two_level);
}

struct RowGrid {
  bool warp;
  int threads;
  unsigned blocks;
  int64_t slots;        // dw partials
  size_t smem_bytes;    // dw accumulators of a block
};
RowGrid row_grid(int64_t rows, int64_t cols) {
  if (cols > kMaxCols) bad("rows of more than " + std::to_string(kMaxCols) + " elements are not supported");
  RowGrid g;
  g.warp = cols <= kWarpRowsMax;
  g.threads = kBlockThreads;
  const int64_t rows_per_block = g.warp ? kBlockThreads / 32 : 1;
  const int64_t need = (rows + rows_per_block - 1) / rows_per_block;
  g.blocks = static_cast<unsigned>(need < kMaxBlocks ? (need > 0 ? need : 1) : kMaxBlocks);
  g.slots = static_cast<int64_t>(g.blocks) * rows_per_block;
  g.smem_bytes = static_cast<size_t>(rows_per_block * cols) * sizeof(float);
  return g;
}

void check_norm(const NormArgs& a) {
  if (a.outer < 0 || a.inner < 1 || a.cols < 1) bad("norm: bad sizes");
  if (a.rot < 0 || a.rot % 2 != 0 || a.rot > a.cols) bad("norm: rot must be even and at most cols");
  if (a.outer == 0) return;  // no rows: no pointers needed
  if (a.rot > 0 && (a.cos == nullptr || a.sin == nullptr)) bad("norm: rope needs cos and sin");
  if (a.x.ptr == nullptr || a.w == nullptr) bad("norm: x and w must be given");
}

// Dynamic shared memory beyond the default 48 KB needs the kernel's opt-in.
template <typename K>
void allow_smem(K kernel, size_t bytes) {
  if (bytes + 256 > 48 * 1024)
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) != cudaSuccess)
      check_launch("shared memory opt-in");
}

bool norm_vec8(const NormArgs& a, std::initializer_list<Rows> rows) {
  const size_t es = esize(a.dtype);
  if (a.cols % 8 != 0 || (a.rot / 2) % 8 != 0) return false;
  if (a.rot > 0 && !vec::aligned16(a.cos, a.ld_rope, es)) return false;
  if (a.rot > 0 && !vec::aligned16(a.sin, a.ld_rope, es)) return false;
  for (const Rows& r : rows)
    if (r.ptr != nullptr && !rows_aligned(r, es, a.inner > 1)) return false;
  return true;
}

}  // namespace

void norm_forward(const NormArgs& a, MutRows y, MutRows s, float* rstd, CUstream_st* stream) {
  check_norm(a);
  if (a.residual.ptr != nullptr && s.ptr == nullptr) bad("norm: a residual add needs the sum's output");
  const int64_t rows = a.outer * a.inner;
  if (rows == 0) return;
  const RowGrid g = row_grid(rows, a.cols);
  const bool v8 = norm_vec8(a, {a.x, a.residual, Rows{y.ptr, y.ld_outer, y.ld_inner}, Rows{s.ptr, s.ld_outer, s.ld_inner}});
  dispatch_tw(a.dtype, a.w_dtype, [&]<typename T, typename TW>() {
    auto go = [&]<int VEC>() {
      if (g.warp) norm_fwd_kernel<T, TW, VEC, true><<<g.blocks, g.threads, 0, stream>>>(a, y, s, rstd);
      else norm_fwd_kernel<T, TW, VEC, false><<<g.blocks, g.threads, 0, stream>>>(a, y, s, rstd);
    };
    if (v8) go.template operator()<8>();
    else go.template operator()<1>();
  });
  check_launch("norm_forward");
}

size_t norm_backward_workspace_bytes(const NormArgs& a) {
  const RowGrid g = row_grid(a.outer * a.inner, a.cols);
  return static_cast<size_t>(g.slots * a.cols) * sizeof(float);
}

void norm_backward(const NormArgs& a, const float* rstd, Rows dy, Rows ds, MutRows dx, void* dw,
                   void* workspace, CUstream_st* stream) {
  check_norm(a);
  if (dw == nullptr || workspace == nullptr) bad("norm_backward: dw and the workspace must be given");
  const int64_t rows = a.outer * a.inner;
  const RowGrid g = row_grid(rows, a.cols);
  const bool v8 = norm_vec8(a, {a.x, dy, ds, Rows{dx.ptr, dx.ld_outer, dx.ld_inner}});
  float* ws = static_cast<float*>(workspace);
  dispatch_tw(a.dtype, a.w_dtype, [&]<typename T, typename TW>() {
    if (rows > 0) {
      auto go = [&]<int VEC>() {
        if (g.warp) {
          norm_bwd_kernel<T, TW, VEC, true><<<g.blocks, g.threads, g.smem_bytes, stream>>>(a, rstd, dy, ds, dx, ws);
        } else {
          allow_smem(norm_bwd_kernel<T, TW, VEC, false>, g.smem_bytes);
          norm_bwd_kernel<T, TW, VEC, false><<<g.blocks, g.threads, g.smem_bytes, stream>>>(a, rstd, dy, ds, dx, ws);
        }
      };
      if (v8) go.template operator()<8>();
      else go.template operator()<1>();
    }
    const int64_t slots = rows > 0 ? g.slots : 0;
    dw_reduce_kernel<TW><<<static_cast<unsigned>((a.cols + 255) / 256), 256, 0, stream>>>(ws, slots, a.cols,
                                                                                         static_cast<TW*>(dw));
  });
  check_launch("norm_backward");
}

void gated_norm_forward(const GatedNormArgs& a, MutRows y, float* rstd, CUstream_st* stream) {
  if (a.rows < 0 || a.cols < 1) bad("gated_norm: bad sizes");
  if (a.rows == 0) return;
  if (a.x.ptr == nullptr || a.z.ptr == nullptr || a.w == nullptr) bad("gated_norm: x, z and w must be given");
  const RowGrid g = row_grid(a.rows, a.cols);
  const size_t es = esize(a.dtype);
  const bool v8 = a.cols % 8 == 0 && rows_aligned(a.x, es, false) && rows_aligned(a.z, es, false) &&
                  rows_aligned(y, es, false);
  dispatch_tw(a.dtype, a.w_dtype, [&]<typename T, typename TW>() {
    auto go = [&]<int VEC>() {
      if (g.warp) gated_fwd_kernel<T, TW, VEC, true><<<g.blocks, g.threads, 0, stream>>>(a, y, rstd);
      else gated_fwd_kernel<T, TW, VEC, false><<<g.blocks, g.threads, 0, stream>>>(a, y, rstd);
    };
    if (v8) go.template operator()<8>();
    else go.template operator()<1>();
  });
  check_launch("gated_norm_forward");
}

size_t gated_norm_backward_workspace_bytes(const GatedNormArgs& a) {
  const RowGrid g = row_grid(a.rows, a.cols);
  return static_cast<size_t>(g.slots * a.cols) * sizeof(float);
}

void gated_norm_backward(const GatedNormArgs& a, const float* rstd, Rows dy, MutRows dx, MutRows dz,
                         void* dw, void* workspace, CUstream_st* stream) {
  if (a.rows < 0 || a.cols < 1 || dw == nullptr || workspace == nullptr) bad("gated_norm_backward: bad arguments");
  const RowGrid g = row_grid(a.rows, a.cols);
  const size_t es = esize(a.dtype);
  const bool v8 = a.cols % 8 == 0 && rows_aligned(a.x, es, false) && rows_aligned(a.z, es, false) &&
                  rows_aligned(dy, es, false) && rows_aligned(dx, es, false) && rows_aligned(dz, es, false);
  float* ws = static_cast<float*>(workspace);
  dispatch_tw(a.dtype, a.w_dtype, [&]<typename T, typename TW>() {
    if (a.rows > 0) {
      auto go = [&]<int VEC>() {
        if (g.warp) {
          gated_bwd_kernel<T, TW, VEC, true><<<g.blocks, g.threads, g.smem_bytes, stream>>>(a, rstd, dy, dx, dz, ws);
        } else {
          allow_smem(gated_bwd_kernel<T, TW, VEC, false>, g.smem_bytes);
          gated_bwd_kernel<T, TW, VEC, false><<<g.blocks, g.threads, g.smem_bytes, stream>>>(a, rstd, dy, dx, dz, ws);
        }
      };
      if (v8) go.template operator()<8>();
      else go.template operator()<1>();
    }
    dw_reduce_kernel<TW><<<static_cast<unsigned>((a.cols + 255) / 256), 256, 0, stream>>>(
        ws, a.rows > 0 ? g.slots : 0, a.cols, static_cast<TW*>(dw));
  });
  check_launch("gated_norm_backward");
}

namespace {
unsigned elementwise_blocks(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 4096 ? (b > 0 ? b : 1) : 4096);
}
}  // namespace

void swiglu_forward(const SwiGluArgs& a, MutRows y, CUstream_st* stream) {
  if (a.rows < 0 || a.cols < 1) bad("swiglu: bad sizes");
  if (a.rows == 0) return;
  if (a.g.ptr == nullptr || a.u.ptr == nullptr) bad("swiglu: gate and up must be given");
  const size_t es = esize(a.dtype);
  const bool v8 = a.cols % 8 == 0 && rows_aligned(a.g, es, false) && rows_aligned(a.u, es, false) &&
                  rows_aligned(y, es, false);
  dispatch_t(a.dtype, [&]<typename T>() {
    if (v8) swiglu_fwd_kernel<T, 8><<<elementwise_blocks(a.rows * a.cols / 8), 256, 0, stream>>>(a, y);
    else swiglu_fwd_kernel<T, 1><<<elementwise_blocks(a.rows * a.cols), 256, 0, stream>>>(a, y);
  });
  check_launch("swiglu_forward");
}

void swiglu_backward(const SwiGluArgs& a, Rows dy, MutRows dg, MutRows du, CUstream_st* stream) {
  if (a.rows < 0 || a.cols < 1) bad("swiglu_backward: bad arguments");
  if (a.rows == 0) return;
  const size_t es = esize(a.dtype);
  const bool v8 = a.cols % 8 == 0 && rows_aligned(a.g, es, false) && rows_aligned(a.u, es, false) &&
                  rows_aligned(dy, es, false) && rows_aligned(dg, es, false) && rows_aligned(du, es, false);
  dispatch_t(a.dtype, [&]<typename T>() {
    if (v8) swiglu_bwd_kernel<T, 8><<<elementwise_blocks(a.rows * a.cols / 8), 256, 0, stream>>>(a, dy, dg, du);
    else swiglu_bwd_kernel<T, 1><<<elementwise_blocks(a.rows * a.cols), 256, 0, stream>>>(a, dy, dg, du);
  });
  check_launch("swiglu_backward");
}

void cross_entropy_rows(void* logits, int64_t rows, int64_t V, int64_t ld, DType dtype,
                        const int64_t* targets, float* loss, CUstream_st* stream) {
  if (rows < 0 || V < 1 || ld < V) bad("cross_entropy_rows: bad sizes");
  if (rows == 0) return;
  if (rows > 0x7fffffff) bad("cross_entropy_rows: too many rows for one launch");
  const bool v8 = V % 8 == 0 && vec::aligned16(logits, ld, esize(dtype));
  dispatch_t(dtype, [&]<typename T>() {
    if (v8) ce_rows_kernel<T, 8><<<static_cast<unsigned>(rows), kCeThreads, 0, stream>>>(static_cast<T*>(logits), V, ld, targets, loss);
    else ce_rows_kernel<T, 1><<<static_cast<unsigned>(rows), kCeThreads, 0, stream>>>(static_cast<T*>(logits), V, ld, targets, loss);
  });
  check_launch("cross_entropy_rows");
}

// ----------------------------------------------------------------------------------------------
// AdamW and the square sum over lists of tensors (Note [AdamW tiles])
//
// Note [AdamW tiles]
// Every tensor is cut into tiles of kAdamTile elements (its last tile may be short); tiles are
// numbered across the tensors in order (AdamWTensor::first_tile) and a grid of a few blocks per
// SM strides over them, each block finding its tile's tensor by binary search over the
// descriptors (a few hundred to a few thousand: L1/L2 hits). The tile is large (16,384 elements,
// 229 KB of AdamW traffic in bf16) so that this dependent-load prologue (the search, the step
// count) stays a few percent of the tile's time: with 4,096-element tiles the kernel moved only
// 1.9 TB/s on the H100. Where the four pointers are 16-byte aligned the tile goes in rounds of
// two 8-element vectors per thread, and its remainder (under one round) element by element; a
// misaligned tensor (a view at an odd offset) goes element by element. The step counts are read
// by the update (t = step + 1) and advanced by a second launch, so that no block sees another's
// increment.

namespace {
constexpr int kAdamThreads = 256;
constexpr int kAdamPerThread = 2;  // 8-element vectors per thread per round
constexpr int64_t kAdamRound = static_cast<int64_t>(kAdamThreads) * kAdamPerThread * 8;
constexpr int64_t kAdamTile = kAdamRound * 8;

struct AdamWTileConst {
  float step_size, bc2_sqrt, decay;  // lr / (1 - b1^t), sqrt(1 - b2^t), 1 - lr wd
};

__device__ __forceinline__ void adamw_update(float& p, float g, float& m, float& v, const AdamWArgs& a,
                                             const AdamWTileConst& c) {
  p *= c.decay;
  m = a.beta1 * m + (1.f - a.beta1) * g;
  v = a.beta2 * v + (1.f - a.beta2) * g * g;
  p -= c.step_size * m / (sqrtf(v) / c.bc2_sqrt + a.eps);
}

// The descriptor holding `tile`: the last one whose first_tile <= tile.
template <typename D>
__device__ __forceinline__ D tile_owner(const D* __restrict__ ts, int count, int64_t tile) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (ts[mid].first_tile <= tile) lo = mid;
    else hi = mid - 1;
  }
  return ts[lo];
}

template <typename T>
__global__ void __launch_bounds__(kAdamThreads)
    adamw_kernel(AdamWArgs a, const AdamWTensor* __restrict__ ts, int count, int64_t total_tiles) {
  if (a.found_inf != nullptr && *a.found_inf != 0.f) return;
  const float scale = a.grad_scale != nullptr ? *a.grad_scale : 1.f;
  for (int64_t tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
    const AdamWTensor t = tile_owner(ts, count, tile);
    const double step = static_cast<double>(*t.step) + 1.0;
    AdamWTileConst c;
    c.step_size = static_cast<float>(static_cast<double>(a.lr) / (1.0 - pow(static_cast<double>(a.beta1), step)));
    c.bc2_sqrt = static_cast<float>(sqrt(1.0 - pow(static_cast<double>(a.beta2), step)));
    c.decay = 1.f - a.lr * a.weight_decay;
    const int64_t off = (tile - t.first_tile) * kAdamTile;
    const int64_t len = t.n - off < kAdamTile ? t.n - off : kAdamTile;
    T* p = static_cast<T*>(t.p) + off;
    const T* g = static_cast<const T*>(t.g) + off;
    T* m = static_cast<T*>(t.m) + off;
    T* v = static_cast<T*>(t.v) + off;
    const bool aligned = ((reinterpret_cast<uintptr_t>(p) | reinterpret_cast<uintptr_t>(g) |
                           reinterpret_cast<uintptr_t>(m) | reinterpret_cast<uintptr_t>(v)) & 15) == 0;
    const int64_t vec_len = aligned ? len / kAdamRound * kAdamRound : 0;
    for (int64_t r = 0; r < vec_len; r += kAdamRound) {
      float pv[kAdamPerThread][8], gv[kAdamPerThread][8], mv[kAdamPerThread][8], vv[kAdamPerThread][8];
#pragma unroll
      for (int k = 0; k < kAdamPerThread; ++k) {
        const int64_t e = r + (static_cast<int64_t>(k) * kAdamThreads + threadIdx.x) * 8;
        vec::load<T, 8>(p + e, pv[k]);
        vec::load<T, 8>(g + e, gv[k]);
        vec::load<T, 8>(m + e, mv[k]);
        vec::load<T, 8>(v + e, vv[k]);
      }
#pragma unroll
      for (int k = 0; k < kAdamPerThread; ++k) {
#pragma unroll
        for (int j = 0; j < 8; ++j) adamw_update(pv[k][j], gv[k][j] / scale, mv[k][j], vv[k][j], a, c);
        const int64_t e = r + (static_cast<int64_t>(k) * kAdamThreads + threadIdx.x) * 8;
        vec::store<T, 8>(p + e, pv[k]);
        vec::store<T, 8>(m + e, mv[k]);
        vec::store<T, 8>(v + e, vv[k]);
      }
    }
    for (int64_t e = vec_len + threadIdx.x; e < len; e += kAdamThreads) {
      float pe = to_f(p[e]), me = to_f(m[e]), ve = to_f(v[e]);
      adamw_update(pe, to_f(g[e]) / scale, me, ve, a, c);
      p[e] = from_f<T>(pe);
      m[e] = from_f<T>(me);
      v[e] = from_f<T>(ve);
    }
  }
}

__global__ void adamw_steps_kernel(const AdamWTensor* __restrict__ ts, int count, const float* found_inf) {
  if (found_inf != nullptr && *found_inf != 0.f) return;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) *ts[i].step += 1.f;
}

// Square sum: each block sums its tiles (fp32 squares of 8 elements, then fp64), block-reduces
// in a fixed order and writes one partial; one block then sums the partials in a fixed order.
constexpr int kSumBlocksMax = 2048;

__device__ __forceinline__ double block_sum_f64(double v) {
  __shared__ double red[kAdamThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (l == 0) red[w] = v;
  __syncthreads();
  v = l < kAdamThreads / 32 ? red[l] : 0.0;
  if (w == 0) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  }
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kAdamThreads)
    square_sum_kernel(const SumTensor* __restrict__ ts, int count, int64_t total_tiles, double* partials) {
  double acc = 0.0;
  for (int64_t tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
    const SumTensor t = tile_owner(ts, count, tile);
    const int64_t off = (tile - t.first_tile) * kAdamTile;
    const int64_t len = t.n - off < kAdamTile ? t.n - off : kAdamTile;
    const T* x = static_cast<const T*>(t.p) + off;
    const int64_t vec_len = (reinterpret_cast<uintptr_t>(x) & 15) == 0 ? len / kAdamRound * kAdamRound : 0;
    for (int64_t r = 0; r < vec_len; r += kAdamRound) {
      float xv[kAdamPerThread][8];
#pragma unroll
      for (int k = 0; k < kAdamPerThread; ++k)
        vec::load<T, 8>(x + r + (static_cast<int64_t>(k) * kAdamThreads + threadIdx.x) * 8, xv[k]);
#pragma unroll
      for (int k = 0; k < kAdamPerThread; ++k) {
        float s8 = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) s8 += xv[k][j] * xv[k][j];
        acc += s8;
      }
    }
    for (int64_t e = vec_len + threadIdx.x; e < len; e += kAdamThreads) {
      const double v = to_f(x[e]);
      acc += v * v;
    }
  }
  acc = block_sum_f64(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void __launch_bounds__(kAdamThreads) sum_partials_kernel(const double* partials, int n, double* out) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < n; i += kAdamThreads) acc += partials[i];
  acc = block_sum_f64(acc);
  if (threadIdx.x == 0) *out = acc;
}

int sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    sms = 132;
  return sms;
}

// A few resident blocks per SM (256 threads each) keep enough bytes in flight; more only adds
// block scheduling.
unsigned list_blocks(int64_t total_tiles) {
  const int64_t cap = std::min<int64_t>(static_cast<int64_t>(sm_count()) * 8, kSumBlocksMax);
  return static_cast<unsigned>(total_tiles < cap ? (total_tiles > 0 ? total_tiles : 1) : cap);
}
}  // namespace

int64_t list_tiles(int64_t n) { return (n + kAdamTile - 1) / kAdamTile; }

size_t square_sum_workspace_bytes() { return kSumBlocksMax * sizeof(double); }

void square_sum(DType dtype, const SumTensor* tensors, int count, int64_t total_tiles, double* out,
                void* workspace, CUstream_st* stream) {
  if (count < 0 || total_tiles < 0) bad("square_sum: bad sizes");
  if (out == nullptr || workspace == nullptr || (count > 0 && tensors == nullptr)) bad("square_sum: missing pointers");
  auto* partials = static_cast<double*>(workspace);
  const unsigned blocks = list_blocks(total_tiles);
  if (count == 0 || total_tiles == 0) {
    sum_partials_kernel<<<1, kAdamThreads, 0, stream>>>(partials, 0, out);
  } else {
    dispatch_t(dtype, [&]<typename T>() {
      square_sum_kernel<T><<<blocks, kAdamThreads, 0, stream>>>(tensors, count, total_tiles, partials);
    });
    sum_partials_kernel<<<1, kAdamThreads, 0, stream>>>(partials, static_cast<int>(blocks), out);
  }
  check_launch("square_sum");
}

void adamw_step(const AdamWArgs& a, const AdamWTensor* tensors, int count, int64_t total_tiles,
                CUstream_st* stream) {
  if (count < 0 || total_tiles < 0) bad("adamw_step: bad sizes");
  if (count == 0) return;
  if (tensors == nullptr) bad("adamw_step: no tensor table");
  if (total_tiles > 0) {
    const unsigned blocks = list_blocks(total_tiles);
    dispatch_t(a.dtype, [&]<typename T>() {
      adamw_kernel<T><<<blocks, kAdamThreads, 0, stream>>>(a, tensors, count, total_tiles);
    });
  }
  adamw_steps_kernel<<<static_cast<unsigned>((count + 255) / 256 < 64 ? (count + 255) / 256 : 64), 256, 0, stream>>>(
      tensors, count, a.found_inf);
  check_launch("adamw_step");
}

}  // namespace qrun::fops
