// See reference.h.
#include "reference.h"

#include <cmath>

namespace qrun::conv1d {
namespace {

int32_t sid(const RefProblem& p, int64_t t) {
  if (t < 0 || t >= p.T) return -2;
  return p.seq_idx.empty() ? 0 : p.seq_idx[t];
}

// Pre-activation z[t, c]; taps outside t's sample read 0.
double pre(const RefProblem& p, const std::vector<double>& x, const std::vector<double>& w,
           int64_t t, int64_t c) {
  double z = 0;
  for (int j = 0; j < p.W; ++j) {
    const int64_t s = t - (p.W - 1) + j;
    if (sid(p, s) == sid(p, t)) z += w[c * p.W + j] * x[s * p.C + c];
  }
  return z;
}

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

}  // namespace

std::vector<double> reference_forward(const RefProblem& p, const std::vector<double>& x,
                                      const std::vector<double>& w) {
  std::vector<double> y(p.T * p.C, 0.0);
  for (int64_t t = 0; t < p.T; ++t) {
    if (sid(p, t) < 0) continue;  // padding: y = 0
    for (int64_t c = 0; c < p.C; ++c) {
      const double z = pre(p, x, w, t, c);
      y[t * p.C + c] = p.silu ? z * sigmoid(z) : z;
    }
  }
  return y;
}

void reference_backward(const RefProblem& p, const std::vector<double>& x,
                        const std::vector<double>& w, const std::vector<double>& dy,
                        std::vector<double>& dx, std::vector<double>& dw) {
  dx.assign(p.T * p.C, 0.0);
  dw.assign(p.C * p.W, 0.0);
  for (int64_t t = 0; t < p.T; ++t) {
    if (sid(p, t) < 0) continue;
    for (int64_t c = 0; c < p.C; ++c) {
      double dz = dy[t * p.C + c];
      if (p.silu) {
        const double z = pre(p, x, w, t, c), s = sigmoid(z);
        dz *= s * (1.0 + z * (1.0 - s));
      }
      for (int j = 0; j < p.W; ++j) {
        const int64_t s = t - (p.W - 1) + j;
        if (sid(p, s) != sid(p, t)) continue;
        dx[s * p.C + c] += w[c * p.W + j] * dz;
        dw[c * p.W + j] += x[s * p.C + c] * dz;
      }
    }
  }
}

}  // namespace qrun::conv1d
