// framework/distributed.cpp - see distributed.h.
#include "distributed.h"

#include <qrun/sdk/error.h>
#include <qrun/sdk/log.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

extern char** environ;

namespace qrun {
namespace {

std::optional<std::string> get(const std::map<std::string, std::string>& v, const char* k) {
  auto it = v.find(k);
  if (it == v.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

int to_int(const std::string& name, const std::string& value, int lo, int hi) {
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(value.c_str(), &end, 10);
  QRUN_CHECK(!value.empty() && *end == '\0' && errno == 0 && x >= lo && x <= hi,
             "launch environment: {}={} is not an integer in [{}, {}]", name, value, lo, hi);
  return static_cast<int>(x);
}

// The local ranks SLURM gives this node: SLURM_NTASKS_PER_NODE, else this node's entry of
// SLURM_TASKS_PER_NODE ("2,8(x3)": node 0 runs 2 tasks, nodes 1-3 run 8; SLURM_NODEID picks).
int slurm_local_world(const std::map<std::string, std::string>& v, int world) {
  if (auto n = get(v, "SLURM_NTASKS_PER_NODE")) return to_int("SLURM_NTASKS_PER_NODE", *n, 1, world);
  if (auto t = get(v, "SLURM_TASKS_PER_NODE")) {
    const int node = get(v, "SLURM_NODEID") ? to_int("SLURM_NODEID", *get(v, "SLURM_NODEID"), 0, 1 << 20) : 0;
    int first = 0;
    size_t pos = 0;
    while (pos < t->size()) {
      const size_t end = std::min(t->find(',', pos), t->size());
      const std::string item = t->substr(pos, end - pos);  // "8" or "8(x3)"
      const int count = to_int("SLURM_TASKS_PER_NODE", item.substr(0, item.find('(')), 1, world);
      int repeat = 1;
      if (item.find("(x") != std::string::npos)
        repeat = to_int("SLURM_TASKS_PER_NODE", item.substr(item.find("(x") + 2, item.find(')') - item.find("(x") - 2), 1, 1 << 20);
      if (node < first + repeat) return count;
      first += repeat;
      pos = end + 1;
    }
  }
  return world;
}

volatile sig_atomic_t g_forward_signal = 0;
extern "C" void on_launcher_signal(int sig) { g_forward_signal = sig; }

}  // namespace

// A TCP port nobody listens on now (the kernel picks it).
int free_tcp_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  QRUN_CHECK(s >= 0, "launcher: cannot open a socket to pick a free port: {}", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  const bool ok = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(s);
  QRUN_CHECK(ok, "launcher: cannot pick a free port: {}", std::strerror(errno));
  return ntohs(a.sin_port);
}

namespace {

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exit code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "unknown status";
}

}  // namespace

std::map<std::string, std::string> environ_map() {
  std::map<std::string, std::string> m;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr) m.emplace(std::string(static_cast<const char*>(*e), eq), std::string(eq + 1));
  }
  return m;
}

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry up to a top-level comma; a bracketed range keeps its first number.
  size_t depth = 0, end = nodelist.size();
  for (size_t i = 0; i < nodelist.size(); ++i) {
    if (nodelist[i] == '[') ++depth;
    if (nodelist[i] == ']') --depth;
    if (nodelist[i] == ',' && depth == 0) {
      end = i;
      break;
    }
  }
  const std::string first = nodelist.substr(0, end);
  const size_t lb = first.find('[');
  if (lb == std::string::npos) return first;
  const size_t rb = first.find(']');
  const std::string inside = first.substr(lb + 1, rb - lb - 1);
  const std::string number = inside.substr(0, inside.find_first_of(",-"));
  return first.substr(0, lb) + number + (rb == std::string::npos ? "" : first.substr(rb + 1));
}

DistributedEnv read_launch_env(const std::map<std::string, std::string>& v) {
  DistributedEnv e;
  const bool torchrun = get(v, "RANK") || get(v, "WORLD_SIZE");
  if (torchrun) {
    auto rank = get(v, "RANK"), world = get(v, "WORLD_SIZE");
    QRUN_CHECK(rank && world,
               "launch environment: {} is set but {} is not; torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, "
               "MASTER_ADDR and MASTER_PORT together (or launch with qrun --nproc-per-node N)",
               rank ? fmt::format("RANK={}", *rank) : fmt::format("WORLD_SIZE={}", *world),
               rank ? "WORLD_SIZE" : "RANK");
    e.world_size = to_int("WORLD_SIZE", *world, 1, 1 << 20);
    e.rank = to_int("RANK", *rank, 0, e.world_size - 1);
    auto local = get(v, "LOCAL_RANK");
    QRUN_CHECK(local || e.world_size == 1,
               "launch environment: RANK={} WORLD_SIZE={} but LOCAL_RANK is not set (it picks this rank's GPU)",
               e.rank, e.world_size);
    e.local_world_size = get(v, "LOCAL_WORLD_SIZE") ? to_int("LOCAL_WORLD_SIZE", *get(v, "LOCAL_WORLD_SIZE"), 1, e.world_size)
                                                    : e.world_size;
    e.local_rank = local ? to_int("LOCAL_RANK", *local, 0, e.local_world_size - 1) : 0;
    if (e.world_size > 1) {
      auto addr = get(v, "MASTER_ADDR"), port = get(v, "MASTER_PORT");
      QRUN_CHECK(addr && port, "launch environment: WORLD_SIZE={} needs MASTER_ADDR and MASTER_PORT (the rank-0 "
                 "host and a free port for the rendezvous)", e.world_size);
      e.master_addr = *addr;
      e.master_port = to_int("MASTER_PORT", *port, 1, 65535);
    }
    e.source = get(v, "QRUN_LAUNCHER") ? *get(v, "QRUN_LAUNCHER") : "torchrun";
    e.agent_store = get(v, "TORCHELASTIC_USE_AGENT_STORE") && *get(v, "TORCHELASTIC_USE_AGENT_STORE") == "True";
    if (auto rc = get(v, "TORCHELASTIC_RESTART_COUNT")) e.restart_count = to_int("TORCHELASTIC_RESTART_COUNT", *rc, 0, 1 << 20);
    return e;
  }
  if (get(v, "SLURM_PROCID") && get(v, "SLURM_NTASKS")) {
    e.world_size = to_int("SLURM_NTASKS", *get(v, "SLURM_NTASKS"), 1, 1 << 20);
    e.rank = to_int("SLURM_PROCID", *get(v, "SLURM_PROCID"), 0, e.world_size - 1);
    e.local_world_size = slurm_local_world(v, e.world_size);
    e.local_rank = get(v, "SLURM_LOCALID") ? to_int("SLURM_LOCALID", *get(v, "SLURM_LOCALID"), 0, e.local_world_size - 1) : 0;
    if (e.world_size > 1) {
      auto nodes = get(v, "SLURM_STEP_NODELIST")  ? get(v, "SLURM_STEP_NODELIST")
                   : get(v, "SLURM_JOB_NODELIST") ? get(v, "SLURM_JOB_NODELIST")
                                                   : get(v, "SLURM_NODELIST");
      QRUN_CHECK(nodes || get(v, "MASTER_ADDR"),
                 "launch environment: SLURM_NTASKS={} but neither SLURM_JOB_NODELIST nor MASTER_ADDR names the "
                 "rank-0 host", e.world_size);
      e.master_addr = get(v, "MASTER_ADDR") ? *get(v, "MASTER_ADDR") : first_slurm_host(*nodes);
      e.master_port = get(v, "MASTER_PORT") ? to_int("MASTER_PORT", *get(v, "MASTER_PORT"), 1, 65535) : 29500;
    }
    e.source = "SLURM";
  }
  return e;
}

int launch_local(int nproc, const std::vector<std::string>& args, double grace_s) {
  QRUN_CHECK(nproc >= 1 && nproc <= 1024, "--nproc-per-node {} is not in [1, 1024]", nproc);
  const auto env = environ_map();
  QRUN_CHECK(!env.count("RANK") && !env.count("WORLD_SIZE"),
             "qrun --nproc-per-node: RANK/WORLD_SIZE are already set (this process was launched by torchrun or "
             "another launcher); run `qrun <recipe>` under that launcher, or unset them");
  const std::string addr = "127.0.0.1";  // the ranks of this launcher are all on this node
  const int port = env.count("MASTER_PORT") ? to_int("MASTER_PORT", env.at("MASTER_PORT"), 1, 65535) : free_tcp_port();
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  QRUN_CHECK(n > 0, "launcher: cannot find this binary (/proc/self/exe): {}", std::strerror(errno));
  self[n] = '\0';
  struct sigaction sa {};
  sa.sa_handler = on_launcher_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  std::vector<pid_t> pids(nproc, -1);
  const pid_t launcher = ::getpid();
  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {  // stop and reap the ranks already started
      const int err = errno;
      for (pid_t p : pids)
        if (p > 0) ::kill(p, SIGKILL), ::waitpid(p, nullptr, 0);
      QRUN_CHECK(false, "launcher: fork of rank {} failed: {}", r, std::strerror(err));
    }
    if (pid == 0) {
      // A rank dies with its launcher (SIGKILL of the launcher, a container stop) rather than
      // holding its GPU unsupervised.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) std::_Exit(1);
      // As torchrun: one OpenMP thread per rank unless the user chose otherwise.
      if (nproc > 1) ::setenv("OMP_NUM_THREADS", "1", /*overwrite=*/0);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("QRUN_LAUNCHER", "qrun --nproc-per-node", 1);
      std::vector<char*> argv;
      argv.push_back(self);
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(self, argv.data());
      std::fprintf(stderr, "qrun launcher: exec %s failed: %s\n", self, std::strerror(errno));
      std::_Exit(1);
    }
    pids[r] = pid;
  }
  log_info("launcher: {} ranks on this node, rendezvous at {}:{}", nproc, addr, port);
  int first_bad = -1, first_code = 0, alive = nproc;
  std::string first_how;
  std::chrono::steady_clock::time_point killed_at{};
  bool killed = false, forwarded = false;
  while (alive > 0) {
    if (g_forward_signal != 0 && !forwarded) {
      for (pid_t p : pids)
        if (p > 0) ::kill(p, g_forward_signal);
      forwarded = true;
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      const int r = static_cast<int>(std::find(pids.begin(), pids.end(), pid) - pids.begin());
      if (r >= nproc) continue;
      pids[r] = -1;
      --alive;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && first_bad < 0 && !killed) {
        first_bad = r;
        first_how = describe_status(status);
        first_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (first_code == 0) first_code = 1;
        for (pid_t p : pids)
          if (p > 0) ::kill(p, SIGTERM);
        killed = true;
        killed_at = std::chrono::steady_clock::now();
      }
      continue;
    }
    if (killed && std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count() > grace_s)
      for (pid_t p : pids)
        if (p > 0) ::kill(p, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (first_bad >= 0) {
    log_error("launcher: rank {} of {} failed first ({}); the other ranks were stopped", first_bad, nproc, first_how);
    return first_code;
  }
  return 0;
}

}  // namespace qrun
