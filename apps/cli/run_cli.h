// cli/run_cli.h — the posenc command as a function: main() (main.cc) calls it, the fuzz target of the
// command's flags (tests/fuzz/fuzz_cli.cc) calls it with parse_only. It exits only when asked to.
#pragma once

#include <cstdio>

namespace posenc::cli {

struct CliRun {
  std::FILE* err = stderr;  // where the one-line error goes
  bool parse_only = false;  // parse and check the flags, report their errors, run no command
  bool exit_on_out_of_memory = false;  // after the "out of memory" line, std::_Exit(1) at once
};

// Runs `posenc argv[1..]`; returns the exit status (0 ok, 2 usage or input error, 1 internal error).
int run_cli(int argc, char** argv, const CliRun& how = {});

}  // namespace posenc::cli
