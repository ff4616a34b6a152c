// framework/log_backend.h - the host's log output (spdlog), behind a plain C++ interface.
//
// Why separate: LibTorch ships its own fmt (12.x) in its include folder, while Debian's spdlog is
// built against the system fmt (9.x). Every qrun target formats with LibTorch's fmt in header-only
// mode; spdlog lives in this one translation unit, compiled without LibTorch's include path, so
// the two fmt versions never meet (they also sit in different inline namespaces, fmt::v9 and
// fmt::v12).
#pragma once

namespace qrun {

// Sets up the stderr logger; level from QRUN_LOG_LEVEL (debug, info, warn, error).
void init_logging();
// Writes one message (level as qrun::LogLevel). Thread-safe.
void log_write(int level, const char* message);
// In a run of several ranks: every line carries "rank N"; ranks other than 0 log warnings and
// errors only (rank 0 prints the progress).
void set_log_rank(int rank, int world_size);

}  // namespace qrun
