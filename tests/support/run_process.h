// tests/support/run_process.h - runs a command line through the shell and captures its exit code,
// stdout and stderr (for tests of the `qrun` binary: exact messages and exit codes).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace qrun::test {

struct ProcessResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// `env` is a prefix of VAR=value assignments; `cmd` is run by /bin/sh in `cwd` (if non-empty).
inline ProcessResult run_process(const std::string& cmd, const std::string& env = "",
                                 const std::string& cwd = "") {
  static int counter = 0;
  std::string base = (std::filesystem::temp_directory_path() /
                      ("qrun-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++)))
                         .string();
  std::string full = (cwd.empty() ? "" : "cd '" + cwd + "' && ") + env + " " + cmd + " >'" + base +
                     ".out' 2>'" + base + ".err' </dev/null";
  int status = std::system(full.c_str());
  ProcessResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  std::remove((base + ".out").c_str());
  std::remove((base + ".err").c_str());
  return r;
}

// An empty directory `root/name` (removed first if it exists), for one test's files.
inline std::filesystem::path fresh_dir(const std::filesystem::path& root, const std::string& name) {
  std::filesystem::path d = root / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace qrun::test
