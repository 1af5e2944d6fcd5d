// Fuzz target: the posenc command's argument parsing, in process. The bytes are split at '\0' into
// argv[1..] (at most 24 words) and given to run_cli with parse_only: CLI11's parser, the command's
// flag declarations (from the registry), the checks of unknown commands, flags and stray words, and
// the one-line error texts; no command runs (it would read and write files). Each word is also typed
// by the value parsers every command uses (parse_int, parse_float, parse_bool, parse_float_dtype).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "cli/run_cli.h"

namespace {
std::FILE* g_null = nullptr;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_null = std::fopen("/dev/null", "w");
  return g_null != nullptr ? 0 : 1;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> words{"posenc"};
  std::string cur;
  for (std::size_t i = 0; i < size && words.size() <= 24; ++i) {
    if (data[i] == 0) {
      words.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  if (words.size() <= 24 && (!cur.empty() || size == 0)) words.push_back(cur);
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  const int rc = posenc::cli::run_cli(static_cast<int>(words.size()), argv.data(), {g_null, true});
  if (rc != 0 && rc != 2) std::abort();  // 1 is an internal error: none is expected from parsing
  for (std::size_t i = 1; i < words.size(); ++i) {
    try {
      (void)posenc::cli::parse_int("--n", words[i]);
    } catch (const posenc::cli::Failure&) {
    }
    try {
      (void)posenc::cli::parse_float("--x", words[i]);
    } catch (const posenc::cli::Failure&) {
    }
    try {
      (void)posenc::cli::parse_bool("--b", words[i]);
    } catch (const posenc::cli::Failure&) {
    }
    try {
      (void)posenc::cli::parse_float_dtype("--dtype", words[i]);
    } catch (const posenc::cli::Failure&) {
    }
  }
  return 0;
}
