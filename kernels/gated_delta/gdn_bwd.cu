// Backward kernels of the chunked gated delta rule:
//   (the reverse sequential gdn_dh_kernel is in gdn_seq.cu)
//   gdn_bwd_chunk_kernel  per (chunk, value head): dq/dk per value head (fp32 scratch), dv, dbeta,
//                         dgamma -> dg (chunk-local reverse cumsum), fused gate/beta grads.
//   gdn_group_reduce_kernel  per (token, key head): sum dq/dk over the value-head group, l2norm bwd.
//   gdn_param_reduce_kernel  per value head: dA_log, ddt_bias from per-chunk partials.
#include "gdn_common.cuh"
#include "gdn_kernels.cuh"

namespace qrun::gdn::detail {

constexpr int kBwdThreads = 512;
constexpr int kUnion = 2 * DK * LDV + 4 * C * LDV;  // >= C*LDK + 2*C*LDC
static_assert(kUnion >= C * LDK + 2 * C * LDC, "union too small");

__global__ void __launch_bounds__(kBwdThreads, 1) gdn_bwd_chunk_kernel(KParams p) {
  extern __shared__ float sm[];
  float* Ks = sm;                // [C][LDK]
  float* Qs = Ks + C * LDK;
  float* Ts = Qs + C * LDK;      // [C][LDC]
  float* KKs = Ts + C * LDC;
  float* Pgs = KKs + C * LDC;
  float* dTs = Pgs + C * LDC;
  float* U = dTs + C * LDC;      // union
  // V-loop view of the union
  float* S0s = U;                // [DK][LDV]
  float* dSCs = S0s + DK * LDV;  // [DK][LDV]
  float* dOs = dSCs + DK * LDV;  // [C][LDV]
  float* Dls = dOs + C * LDV;
  float* DDs = Dls + C * LDV;
  float* Vs = DDs + C * LDV;
  // post-loop view
  float* dWs = U;                // [C][LDK]
  float* M1s = dWs + C * LDK;    // [C][LDC]
  float* Gs = M1s + C * LDC;     // [C][LDC]
  float* gam = U + kUnion;
  float* bet = gam + C;
  float* dbp = bet + C;          // [4][C] dbeta partial (V loop)
  float* rp = dbp + 4 * C;       // [4][C] row partial scratch
  float* dgam = rp + 4 * C;      // [C]
  float* dbt = dgam + C;         // [C]
  float* rks = dbt + C;          // [C]
  float* red = rks + C;          // [C] + 8
  float* rp2 = red + C + 8;      // [4][C]

  const int64_t bid = blockIdx.x;
  const int hv = (int)(bid % p.HV);
  const int64_t c = bid / p.HV;
  const int h = hv / p.G;
  const int n = p.ctab[2 * c];
  const int64_t bos = p.cu[n], eos = p.cu[n + 1];
  const int64_t t0 = bos + (int64_t)p.ctab[2 * c + 1] * C;
  const int L = (int)((eos - t0) < C ? (eos - t0) : C);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  const int wr = warp & 3, wc = warp >> 2;
  const int64_t KV = (int64_t)DK * DV;

  load_qk<kBwdThreads>(Ks, p, true, h, t0, L);
  load_qk<kBwdThreads>(Qs, p, false, h, t0, L);
  load_tile_f32<C, C, kBwdThreads>(Ts, LDC, p.Tm + (c * p.HV + hv) * (int64_t)(C * C), C, C);
  if (tid < C) {
    const int r = tid < L ? tid : L - 1;
    gam[tid] = p.gam[(t0 + r) * p.HV + hv];
    bet[tid] = tid < L ? p.bet[(t0 + r) * p.HV + hv] : 0.f;
    dbp[tid] = 0.f;
    dbp[C + tid] = 0.f;
    dbp[2 * C + tid] = 0.f;
    dbp[3 * C + tid] = 0.f;
  }
  __syncthreads();
  {  // KK = K K^T
    float acc[2][4];
    zero_acc(acc);
    warp_mma<2, DK>(acc, [&](int m, int k) { return Ks[(16 * wr + m) * LDK + k]; },
                    [&](int k, int nn) { return Ks[(16 * wc + nn) * LDK + k]; });
    for_frag(acc, [&](int r, int j, float& x) { KKs[(16 * wr + r) * LDC + 16 * wc + j] = x; });
  }
  const float gl = gam[L - 1];

  float aQ[4][4], aKs[4][4], aW[4][4], aPD[2][4], aT[2][4];
  zero_acc(aQ); zero_acc(aKs); zero_acc(aW); zero_acc(aPD); zero_acc(aT);
  float frob = 0.f;
  const float* hg = p.hs + (c * p.HV + hv) * KV;
  const float* dhg = p.dhs + (c * p.HV + hv) * KV;
  for (int vs = 0; vs < NVS; ++vs) {
    const int v0 = vs * BV;
    __syncthreads();
    const __nv_bfloat16* dob = bf16_at(p.dO, t0 * p.do_st + (int64_t)hv * p.do_sh + v0);
    const __nv_bfloat16* vb = bf16_at(p.v, t0 * p.v_st + (int64_t)hv * p.v_sh + v0);
    const float* dlb = p.Dl + (t0 * p.HV + hv) * DV + v0;
    const float* ddb = p.dDl + (t0 * p.HV + hv) * DV + v0;
    const int64_t dst = (int64_t)p.HV * DV;
    if (p.vec_do && p.vec_v) {  // all loads of the slice in flight before the first store
      static_assert(DK * BV / 4 == 2 * kBwdThreads && C * BV / 4 == kBwdThreads, "slice/threads");
      float4 s0[2], ds[2], dl, dd;
      uint4 ob, vv;
      const float4 zf = make_float4(0.f, 0.f, 0.f, 0.f);
      const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int v = tid + i * kBwdThreads, r = v >> 3, c4 = (v & 7) * 4;
        s0[i] = __ldg(reinterpret_cast<const float4*>(hg + (int64_t)r * DV + v0 + c4));
        ds[i] = __ldg(reinterpret_cast<const float4*>(dhg + (int64_t)r * DV + v0 + c4));
      }
      const int rr = tid >> 3, c4 = (tid & 7) * 4;  // [64 x 32] fp32 slices: one float4 each
      dl = rr < L ? __ldg(reinterpret_cast<const float4*>(dlb + rr * dst + c4)) : zf;
      dd = rr < L ? __ldg(reinterpret_cast<const float4*>(ddb + rr * dst + c4)) : zf;
      const int rb = (tid & 255) >> 2, c8 = (tid & 3) * 8;  // [64 x 32] bf16 slices: threads < 256
      ob = (tid < 256 && rb < L) ? __ldg(reinterpret_cast<const uint4*>(dob + rb * p.do_st + c8)) : z4;
      vv = (tid >= 256 && rb < L) ? __ldg(reinterpret_cast<const uint4*>(vb + rb * p.v_st + c8)) : z4;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int v = tid + i * kBwdThreads, r = v >> 3, cc = (v & 7) * 4;
        float* a = S0s + r * LDV + cc;
        float* b2 = dSCs + r * LDV + cc;
        a[0] = s0[i].x; a[1] = s0[i].y; a[2] = s0[i].z; a[3] = s0[i].w;
        b2[0] = ds[i].x; b2[1] = ds[i].y; b2[2] = ds[i].z; b2[3] = ds[i].w;
      }
      {
        float* a = Dls + rr * LDV + c4;
        float* b2 = DDs + rr * LDV + c4;
        a[0] = dl.x; a[1] = dl.y; a[2] = dl.z; a[3] = dl.w;
        b2[0] = dd.x; b2[1] = dd.y; b2[2] = dd.z; b2[3] = dd.w;
      }
      {
        const uint4 xv = tid < 256 ? ob : vv;
        const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&xv);
        float* d = (tid < 256 ? dOs : Vs) + rb * LDV + c8;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 f = __bfloat1622float2(h2[j]);
          d[2 * j] = f.x;
          d[2 * j + 1] = f.y;
        }
      }
    } else {
      load_tile_f32<DK, BV, kBwdThreads>(S0s, LDV, hg + v0, DV, DK);
      load_tile_f32<DK, BV, kBwdThreads>(dSCs, LDV, dhg + v0, DV, DK);
      load_tile_bf16<BV, kBwdThreads>(dOs, LDV, dob, p.do_st, L, nullptr, 0, p.vec_do);
      load_tile_bf16<BV, kBwdThreads>(Vs, LDV, vb, p.v_st, L, nullptr, 0, p.vec_v);
      load_tile_f32<C, BV, kBwdThreads>(Dls, LDV, dlb, dst, L);
      load_tile_f32<C, BV, kBwdThreads>(DDs, LDV, ddb, dst, L);
    }
    __syncthreads();
    for (int i = tid; i < DK * BV; i += blockDim.x) {
      const int r = i / BV, cc = i % BV;
      frob += S0s[r * LDV + cc] * dSCs[r * LDV + cc];
    }
    // dQ += dO S0^T ; dKs += Delta dSC^T ; dW += dDelta S0^T   (16 x 64 tiles)
    warp_mma<4, BV, true>(aQ, [&](int m, int k) { return dOs[(16 * wr + m) * LDV + k]; },
                          [&](int k, int nn) { return S0s[(32 * wc + nn) * LDV + k]; });
    warp_mma<4, BV>(aKs, [&](int m, int k) { return Dls[(16 * wr + m) * LDV + k]; },
                    [&](int k, int nn) { return dSCs[(32 * wc + nn) * LDV + k]; });
    warp_mma<4, BV>(aW, [&](int m, int k) { return DDs[(16 * wr + m) * LDV + k]; },
                    [&](int k, int nn) { return S0s[(32 * wc + nn) * LDV + k]; });
    // PD += dO Delta^T ; dT += dDelta V^T   (16 x 32 tiles)
    warp_mma<2, BV, true>(aPD, [&](int m, int k) { return dOs[(16 * wr + m) * LDV + k]; },
                          [&](int k, int nn) { return Dls[(16 * wc + nn) * LDV + k]; });
    warp_mma<2, BV, false, true>(aT, [&](int m, int k) { return DDs[(16 * wr + m) * LDV + k]; },
                                 [&](int k, int nn) { return Vs[(16 * wc + nn) * LDV + k]; });
    {  // dV = diag(beta) T^T dDelta (16 x 16 tiles) ; dbeta += rowsum(T^T dDelta .* V)
      float acc[1][4];
      zero_acc(acc);
      warp_mma<1, C>(acc, [&](int m, int k) { return Ts[k * LDC + 16 * wr + m]; },
                     [&](int k, int nn) { return DDs[k * LDV + 8 * wc + nn]; });
      float r0, r1;
      frag_rowdot(acc, [&](int r, int j) { return Vs[(16 * wr + r) * LDV + 8 * wc + j]; }, r0, r1);
      if (tq == 0) {
        dbp[wc * C + 16 * wr + gq] += r0;
        dbp[wc * C + 16 * wr + gq + 8] += r1;
      }
      for_frag(acc, [&](int r, int j, float& x) {
        r += 16 * wr;
        j += 8 * wc;
        if (r < L) st_any(p.dv, p.gdt, (t0 + r) * p.dv_st + (int64_t)hv * p.dv_sh + v0 + j, bet[r] * x);
      });
    }
  }
  // block-reduce frob (deterministic)
  {
#pragma unroll
    for (int o = 16; o; o >>= 1) frob += __shfl_xor_sync(0xffffffffu, frob, o);
    if (lane == 0) red[warp] = frob;
  }
  // scale the V-loop accumulators
  for_frag(aQ, [&](int r, int j, float& x) {
    r += 16 * wr;
    x = r < L ? p.scale * expf(gam[r]) * x : 0.f;
  });
  for_frag(aKs, [&](int r, int j, float& x) {
    r += 16 * wr;
    x = r < L ? expf(gl - gam[r]) * x : 0.f;
  });
  __syncthreads();  // union free now
  for_frag(aPD, [&](int r, int j, float& x) {
    r += 16 * wr;
    j += 16 * wc;
    Pgs[r * LDC + j] = (r >= j && r < L) ? p.scale * x * expf(gam[r] - gam[j]) : 0.f;
  });
  for_frag(aT, [&](int r, int j, float& x) {
    r += 16 * wr;
    j += 16 * wc;
    dTs[r * LDC + j] = bet[j] * x;
  });
  for_frag(aW, [&](int r, int j, float& x) { dWs[(16 * wr + r) * LDK + 32 * wc + j] = -x; });
  {  // QK = Q K^T (into Gs, free until the Ghat phase)
    float acc[2][4];
    zero_acc(acc);
    warp_mma<2, DK>(acc, [&](int m, int k) { return Qs[(16 * wr + m) * LDK + k]; },
                    [&](int k, int nn) { return Ks[(16 * wc + nn) * LDK + k]; });
    for_frag(acc, [&](int r, int j, float& x) { Gs[(16 * wr + r) * LDC + 16 * wc + j] = x; });
  }
  // dgamma, direct part, formed without catastrophic cancellation:
  //   q_r . dq_state_r  +  sum_{j<r} E_rj - sum_{i>r} E_ir  (E = Pg .* QK, the diagonal cancels
  //   exactly and is left out)  - k_r . dk_state_r (r < last)  + last row: e^{gl}<S0,dSC> +
  //   sum_{r<last} k_r . dk_state_r.
  {
    float rq0, rq1, rs0, rs1;
    frag_rowdot(aQ, [&](int r, int j) { return Qs[(16 * wr + r) * LDK + 32 * wc + j]; }, rq0, rq1);
    frag_rowdot(aKs, [&](int r, int j) { return Ks[(16 * wr + r) * LDK + 32 * wc + j]; }, rs0, rs1);
    if (tq == 0) {
      const int r = 16 * wr + gq;
      rp[wc * C + r] = rq0;
      rp[wc * C + r + 8] = rq1;
      rp2[wc * C + r] = rs0;
      rp2[wc * C + r + 8] = rs1;
    }
  }
  __syncthreads();
  {  // 8 threads per row (8 adjacent lanes), fixed-order reduction
    const int r = tid >> 3, part = tid & 7;
    float e = 0.f;
    for (int j = part; j < r; j += 8) e += Pgs[r * LDC + j] * Gs[r * LDC + j];
    for (int i = r + 1 + part; i < C; i += 8) e -= Pgs[i * LDC + r] * Gs[i * LDC + r];
    e += __shfl_xor_sync(0xffffffffu, e, 1);
    e += __shfl_xor_sync(0xffffffffu, e, 2);
    e += __shfl_xor_sync(0xffffffffu, e, 4);
    if (part == 0) {
      dgam[r] = (rp[r] + rp[C + r] + rp[2 * C + r] + rp[3 * C + r]) + e;
      rks[r] = (rp2[r] + rp2[C + r] + rp2[2 * C + r] + rp2[3 * C + r]);
    }
  }
  // dQ += Pg K (final for this value head)
  warp_mma<4, C>(aQ, [&](int m, int k) { return Pgs[(16 * wr + m) * LDC + k]; },
                 [&](int k, int nn) { return Ks[k * LDK + 32 * wc + nn]; });
  for_frag(aQ, [&](int r, int j, float& x) {
    r += 16 * wr;
    j += 32 * wc;
    if (r < L) p.dqh[((t0 + r) * p.HV + hv) * DK + j] = x;
  });
  // dK_direct = dK_state + Pg^T Q
  warp_mma<4, C>(aKs, [&](int m, int k) { return Pgs[k * LDC + 16 * wr + m]; },
                 [&](int k, int nn) { return Qs[k * LDK + 32 * wc + nn]; });
  // dT += dW (diag(beta e^gam) K)^T, masked to strictly lower valid
  {
    float acc[2][4];
    zero_acc(acc);
    warp_mma<2, DK>(acc, [&](int m, int k) { return dWs[(16 * wr + m) * LDK + k]; },
                    [&](int k, int nn) {
                      const int j = 16 * wc + nn;
                      return bet[j] * expf(gam[j]) * Ks[j * LDK + k];
                    });
    for_frag(acc, [&](int r, int j, float& x) {
      r += 16 * wr;
      j += 16 * wc;
      const float v = dTs[r * LDC + j] + x;
      dTs[r * LDC + j] = (r > j && r < L) ? v : 0.f;
    });
  }
  {  // TtdW = T^T dW: dK += diag(beta e^gam) TtdW ; row dot with K
    float acc[4][4];
    zero_acc(acc);
    warp_mma<4, C>(acc, [&](int m, int k) { return Ts[k * LDC + 16 * wr + m]; },
                   [&](int k, int nn) { return dWs[k * LDK + 32 * wc + nn]; });
    float w0, w1;
    frag_rowdot(acc, [&](int r, int j) { return Ks[(16 * wr + r) * LDK + 32 * wc + j]; }, w0, w1);
    __syncthreads();  // rp reuse
    if (tq == 0) {
      const int r = 16 * wr + gq;
      rp[wc * C + r] = w0;
      rp[wc * C + r + 8] = w1;
    }
#pragma unroll
    for (int nn = 0; nn < 4; ++nn)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = 16 * wr + gq + ((e >> 1) << 3);
        aKs[nn][e] += bet[r] * expf(gam[r]) * acc[nn][e];
      }
  }
  __syncthreads();
  if (tid < C) {
    const int r = tid;
    const float w = (rp[r] + rp[C + r] + rp[2 * C + r] + rp[3 * C + r]);
    const float eg = expf(gam[r]);
    dbt[r] = (dbp[r] + dbp[C + r] + dbp[2 * C + r] + dbp[3 * C + r]) + eg * w;
    dgam[r] += bet[r] * eg * w;
  }
  // M1 = dT T^T
  {
    float acc[2][4];
    zero_acc(acc);
    warp_mma<2, C>(acc, [&](int m, int k) { return dTs[(16 * wr + m) * LDC + k]; },
                   [&](int k, int nn) { return Ts[(16 * wc + nn) * LDC + k]; });
    for_frag(acc, [&](int r, int j, float& x) { M1s[(16 * wr + r) * LDC + 16 * wc + j] = x; });
  }
  __syncthreads();
  {  // Ghat = -(T^T M1) .* Gamma, strictly lower valid
    float acc[2][4];
    zero_acc(acc);
    warp_mma<2, C>(acc, [&](int m, int k) { return Ts[k * LDC + 16 * wr + m]; },
                   [&](int k, int nn) { return M1s[k * LDC + 16 * wc + nn]; });
    for_frag(acc, [&](int r, int j, float& x) {
      r += 16 * wr;
      j += 16 * wc;
      Gs[r * LDC + j] = (r > j && r < L) ? -x * expf(gam[r] - gam[j]) : 0.f;
    });
  }
  __syncthreads();
  // row/col sums: dbeta_r += sum_j G_rj KK_rj ; dgam_r += sum_j E_rj - sum_j E_jr, E = G beta_r KK
  {  // 8 threads per row (8 adjacent lanes), fixed-order reduction
    const int r = tid >> 3, part = tid & 7;
    float sb = 0.f, sc = 0.f;
    for (int j = part; j < r; j += 8) sb += Gs[r * LDC + j] * KKs[r * LDC + j];
    for (int j = r + 1 + part; j < C; j += 8) sc += Gs[j * LDC + r] * bet[j] * KKs[j * LDC + r];
    sb += __shfl_xor_sync(0xffffffffu, sb, 1);
    sb += __shfl_xor_sync(0xffffffffu, sb, 2);
    sb += __shfl_xor_sync(0xffffffffu, sb, 4);
    sc += __shfl_xor_sync(0xffffffffu, sc, 1);
    sc += __shfl_xor_sync(0xffffffffu, sc, 2);
    sc += __shfl_xor_sync(0xffffffffu, sc, 4);
    if (part == 0) {
      dbt[r] += sb;
      dgam[r] += bet[r] * sb - sc;
    }
  }
  // Gsym = diag(beta) G + G^T diag(beta)  -> M1s
  for (int i = tid; i < C * C; i += blockDim.x) {
    const int r = i >> 6, j = i & 63;
    M1s[r * LDC + j] = bet[r] * Gs[r * LDC + j] + bet[j] * Gs[j * LDC + r];
  }
  __syncthreads();
  warp_mma<4, C>(aKs, [&](int m, int k) { return M1s[(16 * wr + m) * LDC + k]; },
                 [&](int k, int nn) { return Ks[k * LDK + 32 * wc + nn]; });
  for_frag(aKs, [&](int r, int j, float& x) {
    r += 16 * wr;
    j += 32 * wc;
    if (r < L) p.dkh[((t0 + r) * p.HV + hv) * DK + j] = x;
  });
  __syncthreads();
  if (tid == 0) {
    float fr = 0.f;
    for (int w = 0; w < kBwdThreads / 32; ++w) fr += red[w];
    float sk = 0.f;
    for (int r = 0; r < L - 1; ++r) {
      sk += rks[r];
      dgam[r] -= rks[r];
    }
    dgam[L - 1] += expf(gl) * fr + sk;
    // reverse cumsum within the chunk -> dg; gate / beta grads
    float acc = 0.f;
    for (int r = L - 1; r >= 0; --r) {
      acc += dgam[r];
      dgam[r] = acc;
    }
  }
  __syncthreads();
  if (tid < L) {
    const int r = tid;
    const int64_t t = t0 + r, i = t * p.HV + hv;
    const float dg = dgam[r];
    if (p.gate_fused) {
      const float x = ld_any(p.a, p.a_dt, t * p.a_st + hv) + p.dt_bias[hv];
      const float spg = x > 20.f ? 1.f : 1.f / (1.f + expf(-x));
      const float ea = expf(p.A_log[hv]);
      const float sp = x > 20.f ? x : log1pf(expf(x));
      const float da = -dg * ea * spg;
      p.dg[i] = da;
      rp[r] = dg * (-ea * sp);  // dA_log contribution
      rp[C + r] = da;           // ddt_bias contribution
    } else {
      p.dg[i] = dg;
    }
    const float b = bet[r];
    p.dbeta[i] = p.beta_sigmoid ? dbt[r] * b * (1.f - b) : dbt[r];
  }
  if (p.gate_fused) {
    __syncthreads();
    if (tid == 0) {
      float sa = 0.f, sd = 0.f;
      for (int r = 0; r < L; ++r) { sa += rp[r]; sd += rp[C + r]; }
      p.part[(c * p.HV + hv) * 2] = sa;
      p.part[(c * p.HV + hv) * 2 + 1] = sd;
    }
  }
}

// One warp per (token, key head): sum dq/dk over the value-head group, l2norm backward.
__global__ void gdn_group_reduce_kernel(KParams p) {
  const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= 2 * p.T * p.H) return;
  const bool isk = w >= p.T * p.H;
  const int64_t r = isk ? w - p.T * p.H : w;
  const int64_t t = r / p.H;
  const int h = (int)(r % p.H);
  const float* src = isk ? p.dkh : p.dqh;
  float dy[4], y[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int c = lane + 32 * e;
    float s = 0.f;
    for (int j = 0; j < p.G; ++j) s += src[(t * p.HV + (int64_t)h * p.G + j) * DK + c];
    dy[e] = s;
  }
  if (p.l2norm) {
    const void* x = isk ? p.k : p.q;
    const int64_t base = t * (isk ? p.k_st : p.q_st) + (int64_t)h * (isk ? p.k_sh : p.q_sh);
    const float rs = (isk ? p.rk : p.rq)[r];
    float dot = 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      y[e] = ld_bf16(x, base + lane + 32 * e) * rs;
      dot += dy[e] * y[e];
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
#pragma unroll
    for (int e = 0; e < 4; ++e) dy[e] = rs * (dy[e] - dot * y[e]);
  }
  void* dst = isk ? p.dk : p.dq;
  const int64_t ob = t * (isk ? p.dk_st : p.dq_st) + (int64_t)h * (isk ? p.dk_sh : p.dq_sh);
#pragma unroll
  for (int e = 0; e < 4; ++e) st_any(dst, p.gdt, ob + lane + 32 * e, dy[e]);
}

// One block per value head: dA_log, ddt_bias = sums of per-chunk partials (fixed order).
__global__ void gdn_param_reduce_kernel(KParams p) {
  __shared__ float sa[256], sd[256];
  const int hv = blockIdx.x;
  float a = 0.f, d = 0.f;
  for (int64_t c = threadIdx.x; c < p.NT; c += blockDim.x) {
    a += p.part[(c * p.HV + hv) * 2];
    d += p.part[(c * p.HV + hv) * 2 + 1];
  }
  sa[threadIdx.x] = a;
  sd[threadIdx.x] = d;
  __syncthreads();
  for (int s = blockDim.x / 2; s; s >>= 1) {
    if ((int)threadIdx.x < s) {
      sa[threadIdx.x] += sa[threadIdx.x + s];
      sd[threadIdx.x] += sd[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (p.dA_log) p.dA_log[hv] = sa[0];
    if (p.ddt) p.ddt[hv] = sd[0];
  }
}

}  // namespace qrun::gdn::detail
