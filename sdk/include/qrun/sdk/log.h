// qrun/sdk/log.h - logging for plugins and the host.
//
// A plugin must not own a logger of its own (each shared library would otherwise carry its own
// spdlog registry and the user would see two formats). The host hands every plugin a sink when it
// registers the plugin (see plugin.h); until then, messages go to stderr. Thread-safe as long as
// the sink is (the host's sink is an spdlog logger). Added in SDK 1.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <string>

namespace qrun {

enum class LogLevel : int { Debug = 0, Info = 1, Warn = 2, Error = 3 };

using LogSink = void (*)(int level, const char* message);

namespace detail {
inline void stderr_sink(int level, const char* message) {
  static const char* names[] = {"debug", "info", "warn", "error"};
  std::fprintf(stderr, "[%s] %s\n", names[(level < 0 || level > 3) ? 1 : level], message);
}
// One sink per shared library (inline variable, hidden visibility by default in plugins).
inline LogSink& log_sink() {
  static LogSink sink = &stderr_sink;
  return sink;
}
}  // namespace detail

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
  std::string m = fmt::format(f, std::forward<Args>(args)...);
  detail::log_sink()(static_cast<int>(level), m.c_str());
}
template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  log(LogLevel::Info, f, std::forward<Args>(args)...);
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  log(LogLevel::Warn, f, std::forward<Args>(args)...);
}
template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  log(LogLevel::Debug, f, std::forward<Args>(args)...);
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  log(LogLevel::Error, f, std::forward<Args>(args)...);
}

}  // namespace qrun
