#include "log_backend.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>

namespace qrun {

void init_logging() {
  auto logger = spdlog::stderr_color_mt("qrun");
  logger->set_pattern("[%H:%M:%S] [%^%l%$] %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::info);
  if (const char* lvl = std::getenv("QRUN_LOG_LEVEL")) spdlog::set_level(spdlog::level::from_str(lvl));
}

void set_log_rank(int rank, int world_size) {
  if (world_size <= 1) return;
  spdlog::default_logger()->set_pattern(fmt::format("[%H:%M:%S] [rank {}] [%^%l%$] %v", rank));
  if (rank != 0 && spdlog::get_level() < spdlog::level::warn) spdlog::set_level(spdlog::level::warn);
}

void log_write(int level, const char* message) {
  switch (level) {
    case 0: spdlog::debug("{}", message); break;
    case 2: spdlog::warn("{}", message); break;
    case 3: spdlog::error("{}", message); break;
    default: spdlog::info("{}", message); break;
  }
}

}  // namespace qrun
