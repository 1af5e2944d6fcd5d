// The posenc command's flags parsed and its subcommand run (cli/run_cli.h). Each subcommand lives in
// its own file (cmd_<name>.cc). Every failure, from CLI11's parser or from the library, ends here as
// exactly one line, "posenc: <flag>: <what was expected>", with status 2 for usage and input errors
// (1 for an internal error, or for output that could not all be written to stdout); no output file
// is written then.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "cli/run_cli.h"
#include "posenc/c_api.h"

namespace posenc::cli {
namespace {

std::FILE* g_err = stderr;  // where print_error writes (run_cli's `err`)

int print_error(const std::string& msg, int code) {
  std::fprintf(g_err, "posenc: %s\n", one_line(msg).c_str());
  return code;
}

// A run that succeeded still fails if what it printed did not reach stdout (a full disk, a closed
// pipe): both streams are flushed and checked here, before exit status 0 is given.
int finish_stdout() {
  std::cout.flush();
  errno = 0;
  const bool failed = std::fflush(stdout) != 0 || std::ferror(stdout) != 0 || !std::cout.good();
  if (!failed) return 0;
  const int err = errno;  // 0 when the failed write came earlier, while printing
  return print_error(std::string("stdout: could not write all of the output") +
                         (err != 0 ? std::string(" (") + std::strerror(err) + ")" : ""),
                     1);
}

// "list, table, …": the commands' names.
std::string command_names(const std::vector<Command>& commands) {
  std::string names;
  for (const Command& c : commands) names += (names.empty() ? "" : ", ") + c.app->get_name();
  return names;
}

// The error line for a first word that is neither a command nor --help / --version (CLI11 would say
// "argument was not expected", or only ask for a command), or empty.
std::string first_word_error(int argc, char** argv, const std::vector<Command>& commands) {
  if (argc < 2) return {};
  if (argv[1][0] != '-') {
    const std::string name = argv[1];
    for (const Command& c : commands)
      if (c.app->get_name() == name) return {};
    return "unknown command '" + name + "', expected one of: " + command_names(commands);
  }
  const std::string flag = std::string(argv[1]).substr(0, std::string(argv[1]).find('='));
  if (flag == "--version" && argc > 2)  // CLI11 would print the version and ignore the rest
    return "--version: takes nothing after it, got '" + std::string(argv[2]) + "'";
  if (flag != "-h" && flag != "--help" && flag != "--version")
    return flag + ": unknown flag for posenc (expected --help, --version or a command first: " +
           command_names(commands) + ")";
  return {};
}

// Whether msg ends with tail.
bool ends_with(const std::string& msg, const std::string& tail) {
  return msg.size() > tail.size() && msg.compare(msg.size() - tail.size(), tail.size(), tail) == 0;
}

// CLI11's parse error in the "posenc: <flag>: <what>" shape.
std::string parse_error_line(const CLI::ParseError& e, const std::vector<Command>& commands) {
  std::string msg = e.what();
  if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && msg.rfind("A subcommand", 0) == 0)
    return "expected a command: " + command_names(commands) + " (see posenc --help)";
  static const std::string kRequired = " is required";
  if (ends_with(msg, kRequired) && msg.find(' ') == msg.size() - kRequired.size())
    msg = msg.substr(0, msg.size() - kRequired.size()) + ": is required (see --help)";
  static const std::string kMissing = ": 1 required ";
  if (const std::size_t at = msg.find(kMissing); at != std::string::npos && msg.size() > 8 && ends_with(msg, " missing"))
    msg = msg.substr(0, at) + ": expected a value (" +
          msg.substr(at + kMissing.size(), msg.size() - 8 - at - kMissing.size()) + ")";
  static const std::string kExtra = "The following argument was not expected: ";
  if (msg.rfind(kExtra, 0) == 0) msg = "unexpected argument '" + msg.substr(kExtra.size()) + "'";
  static const std::string kTwice = ": At Most 1 required but received ";
  if (const std::size_t at = msg.find(kTwice); at != std::string::npos)
    msg = msg.substr(0, at) + ": given " + msg.substr(at + kTwice.size()) + " times, expected once";
  static const std::string kOverride = " was given a disallowed flag override";
  if (ends_with(msg, kOverride))
    msg = "--" + msg.substr(0, msg.size() - kOverride.size()) + ": is a flag and takes no value (give it alone)";
  return msg;
}

// The error line for the first unknown flag or stray word left after command c's flags (collected by
// allow_extras so that they get one clear line), or empty.
std::string extras_error(const CLI::App& c) {
  const std::vector<std::string> extras = c.remaining();
  if (extras.empty()) return {};
  const std::string& x = extras.front();
  const std::string name = c.get_name();
  if (x.rfind("-", 0) != 0) return "unexpected argument '" + x + "' (see posenc " + name + " --help)";
  const std::string flag = x.substr(0, x.find('='));
  std::string owners;  // a parameter of an encoding this command does not take?
  for (const posenc::EncodingInfo& e : posenc::registry())
    for (const posenc::ParamSpec& p : e.params)
      if ("--" + p.name == flag) owners += (owners.empty() ? "" : " and ") + e.name;
  if (!owners.empty()) return flag + ": is a parameter of " + owners + ", which posenc " + name + " does not take";
  return flag + ": unknown flag for posenc " + name + " (see posenc " + name + " --help)";
}

// Runs the parsed command c: its exit status, every failure as one line.
int run_command(const Command& c, const CliRun& how) {
  try {
    if (const std::string err = extras_error(*c.app); !err.empty()) return print_error(err, 2);
    if (how.parse_only) return 0;
    c.run();
    return finish_stdout();
  } catch (const Failure& f) {
    return print_error(f.status.message(), f.status.code() == posenc::Code::kInternal ? 1 : 2);
  } catch (const std::bad_alloc&) {
    print_error("out of memory", 1);
    // At exit OpenBLAS joins its worker threads, which retry a failed buffer allocation forever:
    // the command ends at once after its line, so that a process short of memory does end.
    if (how.exit_on_out_of_memory) {
      std::fflush(how.err);
      std::_Exit(1);
    }
    return 1;
  } catch (const std::exception& e) {
    return print_error(std::string("internal error: ") + e.what(), 1);
  }
}

}  // namespace

int run_cli(int argc, char** argv, const CliRun& how) {
  g_err = how.err;
  CLI::App app{"posenc: positional encodings for transformers (NumPy .npy in, .npy out)", "posenc"};
  app.set_version_flag("--version", std::string("posenc ") + posenc_version());
  app.require_subcommand(1, 1);
  app.fallthrough(false);
  app.option_defaults()->disable_flag_override();  // "--json=3" is an error, not true

  std::vector<Command> commands;
  try {
    commands = {add_list_command(app), add_table_command(app),     add_apply_command(app),
                add_bias_command(app), add_attention_command(app), add_tour_command(app),
                add_bench_command(app), add_study_command(app),
                add_train_command(app), add_plot_command(app),
                add_check_command(app), add_rope_config_command(app),
                add_mrope_positions_command(app)};
  } catch (const std::exception& e) {
    return print_error(std::string("internal error while declaring flags: ") + e.what(), 1);
  }
  if (const std::string err = first_word_error(argc, argv, commands); !err.empty()) return print_error(err, 2);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // --help, --version
      app.exit(e);
      return finish_stdout();
    }
    return print_error(parse_error_line(e, commands), 2);
  }
  for (const Command& c : commands)
    if (c.app->parsed()) return run_command(c, how);
  return print_error("expected a command (see posenc --help)", 2);
}

}  // namespace posenc::cli
