// plugins/profilers/kineto_tables.cpp - see kineto_tables.h.
#include "kineto_tables.h"

#include <qrun/sdk/error.h>

#include <algorithm>
#include <map>
#include <unordered_map>

namespace qrun_profilers {

SortKey parse_sort_key(const std::string& n) {
  if (n == "self_cpu_time_total") return SortKey::SelfCpu;
  if (n == "cpu_time_total") return SortKey::CpuTotal;
  if (n == "self_cuda_time_total") return SortKey::SelfCuda;
  if (n == "cuda_time_total") return SortKey::CudaTotal;
  QRUN_ASSERT(n == "count", "unknown sort key '{}'", n);
  return SortKey::Calls;
}

std::vector<KeyAverage> key_averages(const std::vector<KeyEvent>& events) {
  // Device time of the GPU work each CPU op launched directly, by the op's correlation id.
  std::unordered_map<uint64_t, double> launched_us;
  std::map<std::string, KeyAverage> rows;
  for (const auto& e : events) {
    if (e.kind != KeyEvent::Kind::GpuKernel && e.kind != KeyEvent::Kind::GpuOther) continue;
    double us = static_cast<double>(e.end_ns - e.start_ns) / 1e3;
    if (e.linked != 0) launched_us[e.linked] += us;
    KeyAverage& r = rows[e.name];
    r.name = e.name;
    r.calls++;
    r.self_cuda_us += us;
    r.cuda_total_us += us;
  }
  // CPU ops: per thread, ordered by start (the longer first on ties) so that a stack of open
  // ops gives each op its parent; self time = duration - the children's durations.
  std::vector<const KeyEvent*> ops;
  for (const auto& e : events)
    if (e.kind == KeyEvent::Kind::CpuOp) ops.push_back(&e);
  std::sort(ops.begin(), ops.end(), [](const KeyEvent* a, const KeyEvent* b) {
    if (a->thread != b->thread) return a->thread < b->thread;
    if (a->start_ns != b->start_ns) return a->start_ns < b->start_ns;
    return a->end_ns > b->end_ns;
  });
  struct Node {
    const KeyEvent* e;
    double child_cpu_us = 0;
    double cuda_total_us = 0;  // own launches + the children's totals
  };
  std::vector<Node> stack;
  auto close = [&](Node n) {
    double dur = static_cast<double>(n.e->end_ns - n.e->start_ns) / 1e3;
    double self_cuda = 0;
    if (auto it = launched_us.find(n.e->correlation); n.e->correlation != 0 && it != launched_us.end())
      self_cuda = it->second;
    n.cuda_total_us += self_cuda;
    KeyAverage& r = rows[n.e->name];
    r.name = n.e->name;
    r.calls++;
    r.cpu_total_us += dur;
    r.self_cpu_us += std::max(0.0, dur - n.child_cpu_us);
    r.self_cuda_us += self_cuda;
    r.cuda_total_us += n.cuda_total_us;
    if (!stack.empty()) {
      stack.back().child_cpu_us += dur;
      stack.back().cuda_total_us += n.cuda_total_us;
    }
  };
  for (const KeyEvent* e : ops) {
    while (!stack.empty() &&
           (stack.back().e->thread != e->thread || stack.back().e->end_ns <= e->start_ns)) {
      Node n = stack.back();
      stack.pop_back();
      close(n);
    }
    stack.push_back(Node{e});
  }
  while (!stack.empty()) {
    Node n = stack.back();
    stack.pop_back();
    close(n);
  }
  std::vector<KeyAverage> out;
  for (auto& [name, r] : rows) out.push_back(r);
  return out;
}

namespace {
double key_of(const KeyAverage& r, SortKey k) {
  switch (k) {
    case SortKey::SelfCpu: return r.self_cpu_us;
    case SortKey::CpuTotal: return r.cpu_total_us;
    case SortKey::SelfCuda: return r.self_cuda_us;
    case SortKey::CudaTotal: return r.cuda_total_us;
    case SortKey::Calls: return static_cast<double>(r.calls);
  }
  return 0;
}

std::string time_text(double us) {
  if (us >= 1e6) return fmt::format("{:.3f}s", us / 1e6);
  if (us >= 1e3) return fmt::format("{:.3f}ms", us / 1e3);
  return fmt::format("{:.3f}us", us);
}
}  // namespace

std::string format_table(std::vector<KeyAverage> rows, SortKey key, int64_t row_limit, bool with_cuda) {
  double self_cpu = 0, self_cuda = 0;
  for (const auto& r : rows) self_cpu += r.self_cpu_us, self_cuda += r.self_cuda_us;
  std::stable_sort(rows.begin(), rows.end(), [key](const KeyAverage& a, const KeyAverage& b) {
    double x = key_of(a, key), y = key_of(b, key);
    if (x != y) return x > y;
    return a.name < b.name;
  });
  if (static_cast<int64_t>(rows.size()) > row_limit) rows.resize(static_cast<size_t>(row_limit));
  size_t width = 4;
  for (const auto& r : rows) width = std::max(width, std::min<size_t>(r.name.size(), 60));
  auto name_cell = [width](const std::string& n) {
    return n.size() <= width ? n : n.substr(0, width - 3) + "...";
  };
  std::string head = fmt::format("{:<{}}  {:>12}  {:>10}  {:>12}  {:>12}", "Name", width, "Self CPU",
                                 "Self CPU %", "CPU total", "CPU time avg");
  if (with_cuda)
    head += fmt::format("  {:>12}  {:>11}  {:>12}  {:>13}", "Self CUDA", "Self CUDA %", "CUDA total",
                        "CUDA time avg");
  head += fmt::format("  {:>10}", "# of Calls");
  std::string rule(head.size(), '-');
  std::string out = rule + "\n" + head + "\n" + rule + "\n";
  for (const auto& r : rows) {
    double n = static_cast<double>(std::max<int64_t>(r.calls, 1));
    out += fmt::format("{:<{}}  {:>12}  {:>9.2f}%  {:>12}  {:>12}", name_cell(r.name), width,
                       time_text(r.self_cpu_us), self_cpu > 0 ? 100.0 * r.self_cpu_us / self_cpu : 0.0,
                       time_text(r.cpu_total_us), time_text(r.cpu_total_us / n));
    if (with_cuda)
      out += fmt::format("  {:>12}  {:>10.2f}%  {:>12}  {:>13}", time_text(r.self_cuda_us),
                         self_cuda > 0 ? 100.0 * r.self_cuda_us / self_cuda : 0.0,
                         time_text(r.cuda_total_us), time_text(r.cuda_total_us / n));
    out += fmt::format("  {:>10}\n", r.calls);
  }
  out += rule + "\n";
  out += fmt::format("Self CPU time total: {}\n", time_text(self_cpu));
  if (with_cuda) out += fmt::format("Self CUDA time total: {}\n", time_text(self_cuda));
  return out;
}

uint64_t busy_ns(std::vector<std::pair<uint64_t, uint64_t>> iv) {
  std::sort(iv.begin(), iv.end());
  uint64_t total = 0, cur_start = 0, cur_end = 0;
  bool open = false;
  for (const auto& [s, e] : iv) {
    if (e <= s) continue;
    if (!open || s > cur_end) {
      if (open) total += cur_end - cur_start;
      cur_start = s, cur_end = e, open = true;
    } else {
      cur_end = std::max(cur_end, e);
    }
  }
  if (open) total += cur_end - cur_start;
  return total;
}

}  // namespace qrun_profilers
