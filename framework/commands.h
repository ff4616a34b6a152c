// framework/commands.h - the subcommands of `qrun` (see main.cpp for the list).
#pragma once

#include <string>
#include <vector>

namespace qrun {

// Runs the command named by args[0] (or a recipe path). Returns the exit code; throws qrun::Error
// for failures (main maps them to exit codes).
int dispatch(const std::vector<std::string>& args);

}  // namespace qrun
