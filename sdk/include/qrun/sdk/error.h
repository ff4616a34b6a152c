// qrun/sdk/error.h - the one way qrun code fails.
//
// Two kinds of failure, told apart at the throw site (like c10's TORCH_CHECK vs
// TORCH_INTERNAL_ASSERT):
//   * UserError     - bad input: a recipe, a data row, a checkpoint, a plugin. `main` prints the
//                     message and exits with code 2. The message says what was received, what is
//                     allowed, and the fix when known.
//   * InternalError - a bug in qrun or a plugin. `main` prints it and exits with code 1.
// Errors carry a context stack: code that catches and rethrows adds a line ("while loading
// checkpoint /x") so the user sees where the problem happened, outermost last.
//
// Library code never calls exit(); it throws. Header-only; available since SDK 1.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace qrun {

enum class ErrorKind { User, Internal };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message)
      : std::runtime_error(message), kind_(kind), message_(std::move(message)) {}

  ErrorKind kind() const noexcept { return kind_; }
  bool is_user_error() const noexcept { return kind_ == ErrorKind::User; }
  // The message without context lines.
  const std::string& message() const noexcept { return message_; }
  const std::vector<std::string>& context() const noexcept { return context_; }

  // Adds a context line ("while ..."), innermost first. Returns *this for rethrow chains.
  Error& add_context(std::string line) {
    context_.push_back(std::move(line));
    full_.clear();
    return *this;
  }

  // The message followed by the context lines, one per line.
  const char* what() const noexcept override {
    if (full_.empty()) {
      full_ = message_;
      for (const auto& c : context_) full_ += "\n  " + c;
    }
    return full_.c_str();
  }

 private:
  ErrorKind kind_;
  std::string message_;
  std::vector<std::string> context_;
  mutable std::string full_;
};

class UserError : public Error {
 public:
  explicit UserError(std::string message) : Error(ErrorKind::User, std::move(message)) {}
};

class InternalError : public Error {
 public:
  explicit InternalError(std::string message) : Error(ErrorKind::Internal, std::move(message)) {}
};

template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw UserError(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace qrun

// QRUN_CHECK(cond, "fmt", args...): a user mistake when false (exit code 2).
#define QRUN_CHECK(cond, ...)                                  \
  do {                                                         \
    if (!(cond)) throw ::qrun::UserError(fmt::format(__VA_ARGS__)); \
  } while (0)

// QRUN_ASSERT(cond, "fmt", args...): an internal invariant; false means a bug (exit code 1).
#define QRUN_ASSERT(cond, ...)                                                            \
  do {                                                                                    \
    if (!(cond))                                                                          \
      throw ::qrun::InternalError(fmt::format("internal error at {}:{}: {}", __FILE__, __LINE__, \
                                              fmt::format(__VA_ARGS__)));                 \
  } while (0)
