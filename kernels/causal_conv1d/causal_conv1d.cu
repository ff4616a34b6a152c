// Causal depthwise conv1d (+ SiLU) on a token-major [T, C] activation: forward and backward.
// Layout, math and contract: causal_conv1d.h.
//
// Work split: a block of 128 threads covers 128 * VEC channels of one tile of kTile tokens; each
// thread owns VEC adjacent channels (one 16-byte load per token when VEC = 8 and the rows are
// aligned) and walks its tile token by token with the last W inputs in registers. The seq_idx of
// the tile (plus the W-1 tokens before it, and after it for the backward) is staged in shared
// memory first, so the boundary test of a tap - "same sample as the output token" - is one
// block-uniform comparison. Everything streams once: the kernels are bound by memory bandwidth.
#include "causal_conv1d.h"

#include "../common/qrun_vec.cuh"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace qrun::conv1d {
namespace {

constexpr int kTile = 64;      // tokens per block
constexpr int kThreads = 128;  // threads per block

using vec::from_f;
using vec::sigmoid;
using vec::to_f;
using vec::zero;


// seq_idx of token t, -2 outside [0, T) (never equal to a real sample's or padding's id).
__device__ __forceinline__ int32_t sample_of(const Problem& p, int64_t t) {
  if (t < 0 || t >= p.T) return -2;
  return p.seq_idx ? p.seq_idx[t] : 0;
}

template <typename TX, typename TW, int W, int VEC>
__global__ void __launch_bounds__(kThreads) fwd_kernel(Problem p, TX* __restrict__ y, int64_t ldy) {
  __shared__ int32_t sid[kTile + kMaxWidth - 1];  // tokens t0-(W-1) .. t0+kTile-1
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTile;
  for (int i = threadIdx.x; i < kTile + W - 1; i += kThreads) sid[i] = sample_of(p, t0 - (W - 1) + i);
  __syncthreads();
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * VEC;
  if (c0 >= p.C) return;
  const TX* __restrict__ x = static_cast<const TX*>(p.x) + c0;
  const TW* __restrict__ wp = static_cast<const TW*>(p.w) + c0 * W;
  float w[W][VEC];
#pragma unroll
  for (int v = 0; v < VEC; ++v)
#pragma unroll
    for (int j = 0; j < W; ++j) w[j][v] = to_f(wp[v * W + j]);
  float win[W][VEC];  // inputs of tokens t-(W-1) .. t
#pragma unroll
  for (int j = 0; j < W - 1; ++j) {
    if (sid[j] >= 0) vec::load<TX, VEC>(x + (t0 - (W - 1) + j) * p.ldx, win[j]);
    else zero(win[j]);
  }
  const int n = p.T - t0 < kTile ? static_cast<int>(p.T - t0) : kTile;
  for (int i = 0; i < n; ++i) {
    const int64_t t = t0 + i;
    const int32_t st = sid[i + W - 1];
    float out[VEC];
    if (st >= 0) {
      vec::load<TX, VEC>(x + t * p.ldx, win[W - 1]);
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        float acc = w[W - 1][v] * win[W - 1][v];
#pragma unroll
        for (int j = 0; j < W - 1; ++j)
          if (sid[i + j] == st) acc = fmaf(w[j][v], win[j][v], acc);
        out[v] = p.silu ? acc * sigmoid(acc) : acc;
      }
    } else {
      zero(win[W - 1]);
      zero(out);
    }
    vec::store<TX, VEC>(y + t * ldy + c0, out);
#pragma unroll
    for (int j = 0; j < W - 1; ++j)
#pragma unroll
      for (int v = 0; v < VEC; ++v) win[j][v] = win[j + 1][v];
  }
}

// One pass over tokens t0 .. t0+kTile+W-2: z (recomputed) and dz of each token, dw partials of
// the tile's own tokens, and dx of token s = t-(W-1) once the dz of all its targets are known.
template <typename TX, typename TW, int W, int VEC>
__global__ void __launch_bounds__(kThreads)
    bwd_kernel(Problem p, const TX* __restrict__ dy, int64_t lddy, TX* __restrict__ dx, int64_t lddx,
               float* __restrict__ ws) {
  __shared__ int32_t sid[kTile + 2 * (kMaxWidth - 1)];  // tokens t0-(W-1) .. t0+kTile+W-2
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTile;
  for (int i = threadIdx.x; i < kTile + 2 * (W - 1); i += kThreads)
    sid[i] = sample_of(p, t0 - (W - 1) + i);
  __syncthreads();
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * VEC;
  if (c0 >= p.C) return;
  const TX* __restrict__ x = static_cast<const TX*>(p.x) + c0;
  const TW* __restrict__ wp = static_cast<const TW*>(p.w) + c0 * W;
  float w[W][VEC];
#pragma unroll
  for (int v = 0; v < VEC; ++v)
#pragma unroll
    for (int j = 0; j < W; ++j) w[j][v] = to_f(wp[v * W + j]);
  float xw[W][VEC];   // x of tokens t-(W-1) .. t (0 outside [0, T) and for padding)
  float dzr[W][VEC];  // dz of the same tokens (tokens before t0: not needed, 0)
  float dwp[W][VEC];  // this tile's part of dw
#pragma unroll
  for (int j = 0; j < W; ++j) {
    zero(dzr[j]);
    zero(dwp[j]);
    if (j < W - 1) {
      if (sid[j] >= 0) vec::load<TX, VEC>(x + (t0 - (W - 1) + j) * p.ldx, xw[j]);
      else zero(xw[j]);
    }
  }
  for (int i = 0; i < kTile + W - 1; ++i) {
    const int64_t t = t0 + i;
    if (t - (W - 1) >= p.T) break;  // no token left to emit
    const int32_t st = sid[i + W - 1];
    if (st >= 0) {
      vec::load<TX, VEC>(x + t * p.ldx, xw[W - 1]);
      float g[VEC];
      vec::load<TX, VEC>(dy + t * lddy + c0, g);
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        float d = g[v];
        if (p.silu) {
          float z = w[W - 1][v] * xw[W - 1][v];
#pragma unroll
          for (int j = 0; j < W - 1; ++j)
            if (sid[i + j] == st) z = fmaf(w[j][v], xw[j][v], z);
          const float s = sigmoid(z);
          d = g[v] * s * (1.f + z * (1.f - s));
        }
        dzr[W - 1][v] = d;
      }
      if (i < kTile) {
#pragma unroll
        for (int j = 0; j < W; ++j)
          if (sid[i + j] == st)
#pragma unroll
            for (int v = 0; v < VEC; ++v) dwp[j][v] = fmaf(dzr[W - 1][v], xw[j][v], dwp[j][v]);
      }
    } else {
      zero(xw[W - 1]);
      zero(dzr[W - 1]);
    }
    // dx of s = t - (W-1): its targets are s .. s+W-1 = the tokens of the window.
    if (i >= W - 1) {
      const int64_t s = t - (W - 1);
      const int32_t ss = sid[i];
      float out[VEC];
      zero(out);
      if (ss >= 0) {
#pragma unroll
        for (int k = 0; k < W; ++k)
          if (sid[i + k] == ss)
#pragma unroll
            for (int v = 0; v < VEC; ++v) out[v] = fmaf(w[W - 1 - k][v], dzr[k][v], out[v]);
      }
      vec::store<TX, VEC>(dx + s * lddx + c0, out);
    }
#pragma unroll
    for (int j = 0; j < W - 1; ++j)
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        xw[j][v] = xw[j + 1][v];
        dzr[j][v] = dzr[j + 1][v];
      }
  }
  float* out = ws + (static_cast<int64_t>(blockIdx.y) * p.C + c0) * W;
#pragma unroll
  for (int v = 0; v < VEC; ++v)
#pragma unroll
    for (int j = 0; j < W; ++j) out[v * W + j] = dwp[j][v];
}

// dw[e] = sum over token tiles of ws[tile][e], e in [0, C*W), in tile order.
template <typename TW>
__global__ void dw_reduce_kernel(const float* __restrict__ ws, int64_t tiles, int64_t n, TW* __restrict__ dw) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  float acc = 0.f;
  for (int64_t k = 0; k < tiles; ++k) acc += ws[k * n + e];
  dw[e] = from_f<TW>(acc);
}

void check_launch(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("causal_conv1d ") + what + ": " + cudaGetErrorString(e));
}

size_t dtype_size(DType d) { return d == DType::F32 ? 4 : 2; }

void validate(const Problem& p) {
  auto bad = [](const std::string& m) { throw std::invalid_argument("causal_conv1d: " + m); };
  if (p.T < 0 || p.C <= 0) bad("T must be >= 0 and C > 0");
  if (p.W < 1 || p.W > kMaxWidth) bad("width W must be 1.." + std::to_string(kMaxWidth) + ", got " + std::to_string(p.W));
  if (p.ldx < p.C) bad("ldx < C");
  if (p.T > 0 && (p.x == nullptr || p.w == nullptr)) bad("x and w must be given");
  if ((p.T + kTile - 1) / kTile > 65535) bad("too many tokens for one launch (at most 4,194,240)");
  if (p.w_dtype != DType::F32 && p.w_dtype != p.x_dtype) bad("w must be fp32 or x's dtype");
}

// VEC = 8 when every row start of every tensor is 16-byte aligned.
bool vec8(const Problem& p, std::initializer_list<std::pair<const void*, int64_t>> rows) {
  const size_t es = dtype_size(p.x_dtype);
  if (p.C % 8 != 0) return false;
  for (auto [ptr, ld] : rows)
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0 || (ld * es) % 16 != 0) return false;
  return true;
}

// Calls f.template operator()<TX, TW, W, VEC>() for the problem's types.
template <typename F>
void dispatch(const Problem& p, bool v8, F&& f) {
  auto with_w = [&]<typename TX, typename TW>() {
    auto with_vec = [&]<int W>() {
      if (v8) f.template operator()<TX, TW, W, 8>();
      else f.template operator()<TX, TW, W, 1>();
    };
    switch (p.W) {
      case 1: with_vec.template operator()<1>(); break;
      case 2: with_vec.template operator()<2>(); break;
      case 3: with_vec.template operator()<3>(); break;
      default: with_vec.template operator()<4>(); break;
    }
  };
  const bool wf = p.w_dtype == DType::F32;
  switch (p.x_dtype) {
    case DType::F32: with_w.template operator()<float, float>(); break;
    case DType::BF16:
      if (wf) with_w.template operator()<__nv_bfloat16, float>();
      else with_w.template operator()<__nv_bfloat16, __nv_bfloat16>();
      break;
    case DType::F16:
      if (wf) with_w.template operator()<__half, float>();
      else with_w.template operator()<__half, __half>();
      break;
  }
}

}  // namespace

void forward(const Problem& p, void* y, int64_t ldy, CUstream_st* stream) {
  validate(p);
  if (ldy < p.C) throw std::invalid_argument("causal_conv1d: ldy < C");
  if (p.T == 0) return;
  const bool v8 = vec8(p, {{p.x, p.ldx}, {y, ldy}});
  dispatch(p, v8, [&]<typename TX, typename TW, int W, int VEC>() {
    dim3 grid(static_cast<unsigned>((p.C + kThreads * VEC - 1) / (kThreads * VEC)),
              static_cast<unsigned>((p.T + kTile - 1) / kTile));
    fwd_kernel<TX, TW, W, VEC><<<grid, kThreads, 0, stream>>>(p, static_cast<TX*>(y), ldy);
  });
  check_launch("forward");
}

size_t backward_workspace_bytes(const Problem& p) {
  const int64_t tiles = (p.T + kTile - 1) / kTile;
  return static_cast<size_t>(tiles) * static_cast<size_t>(p.C) * static_cast<size_t>(p.W) * sizeof(float);
}

void backward(const Problem& p, const void* dy, int64_t lddy, void* dx, int64_t lddx, void* dw,
              void* workspace, CUstream_st* stream) {
  validate(p);
  if (lddy < p.C || lddx < p.C) throw std::invalid_argument("causal_conv1d: lddy or lddx < C");
  if (dw == nullptr) throw std::invalid_argument("causal_conv1d: dw must be given");
  const int64_t n = p.C * p.W;
  if (p.T == 0) {
    if (cudaMemsetAsync(dw, 0, static_cast<size_t>(n) * dtype_size(p.w_dtype), stream) != cudaSuccess)
      check_launch("backward (zero dw)");
    return;
  }
  if (dy == nullptr || dx == nullptr || workspace == nullptr)
    throw std::invalid_argument("causal_conv1d: dy, dx and the workspace must be given");
  const bool v8 = vec8(p, {{p.x, p.ldx}, {dy, lddy}, {dx, lddx}});
  const int64_t tiles = (p.T + kTile - 1) / kTile;
  float* ws = static_cast<float*>(workspace);
  dispatch(p, v8, [&]<typename TX, typename TW, int W, int VEC>() {
    dim3 grid(static_cast<unsigned>((p.C + kThreads * VEC - 1) / (kThreads * VEC)),
              static_cast<unsigned>(tiles));
    bwd_kernel<TX, TW, W, VEC><<<grid, kThreads, 0, stream>>>(p, static_cast<const TX*>(dy), lddy,
                                                               static_cast<TX*>(dx), lddx, ws);
    dw_reduce_kernel<TW><<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
        ws, tiles, n, static_cast<TW*>(dw));
  });
  check_launch("backward");
}

}  // namespace qrun::conv1d
