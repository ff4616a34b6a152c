// CPU test of the fp64 reference (runs in CI): its adjoint equals central finite differences of
// its forward for every input element, and a packed batch equals its samples run one by one.
#include "reference.h"

#include <cmath>
#include <cstdio>
#include <random>

using namespace qrun::conv1d;

int main() {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> nd;
  int failures = 0;
  for (int W = 1; W <= 4; ++W)
    for (bool silu : {true, false}) {
      RefProblem p;
      p.C = 3;
      p.W = W;
      p.silu = silu;
      // samples of 1, 2, 5 tokens and two padding tokens between them
      p.seq_idx = {0, -1, 1, 1, 2, 2, 2, 2, 2, -1};
      p.T = static_cast<int64_t>(p.seq_idx.size());
      std::vector<double> x(p.T * p.C), w(p.C * W), dy(p.T * p.C);
      for (auto* v : {&x, &w, &dy})
        for (auto& e : *v) e = nd(rng);
      std::vector<double> dx, dw;
      reference_backward(p, x, w, dy, dx, dw);
      auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
        std::vector<double> y = reference_forward(p, xx, ww);
        double l = 0;
        for (size_t i = 0; i < y.size(); ++i) l += y[i] * dy[i];
        return l;
      };
      const double h = 1e-6;
      double worst = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        auto xp = x, xm = x;
        xp[i] += h, xm[i] -= h;
        worst = std::max(worst, std::abs((loss(xp, w) - loss(xm, w)) / (2 * h) - dx[i]));
      }
      for (size_t i = 0; i < w.size(); ++i) {
        auto wp = w, wm = w;
        wp[i] += h, wm[i] -= h;
        worst = std::max(worst, std::abs((loss(x, wp) - loss(x, wm)) / (2 * h) - dw[i]));
      }
      // Packed == one by one: sample 2 (tokens 4..8) alone.
      RefProblem one = p;
      one.seq_idx = {};
      one.T = 5;
      std::vector<double> xs(x.begin() + 4 * p.C, x.begin() + 9 * p.C);
      std::vector<double> y1 = reference_forward(one, xs, w), yp = reference_forward(p, x, w);
      double packed = 0;
      for (int64_t i = 0; i < 5 * p.C; ++i) packed = std::max(packed, std::abs(y1[i] - yp[4 * p.C + i]));
      // Padding tokens give 0.
      for (int64_t c = 0; c < p.C; ++c) packed = std::max(packed, std::abs(yp[1 * p.C + c]) + std::abs(yp[9 * p.C + c]));
      const bool ok = worst < 1e-7 && packed == 0.0;
      std::printf("W=%d silu=%d: adjoint vs finite differences %.2e, packed vs alone %.1e  %s\n", W, silu,
                  worst, packed, ok ? "ok" : "FAIL");
      failures += !ok;
    }
  std::printf("%s\n", failures == 0 ? "all passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
