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

  // An unknown command gets a clearer line than CLI11's "argument was not expected".
  if (argc >= 2 && argv[1][0] != '-') {
    const std::string name = argv[1];
    bool known = false;
    std::string names;
    for (const Command& c : commands) {
      known = known || c.app->get_name() == name;
      names += (names.empty() ? "" : ", ") + c.app->get_name();
    }
    if (!known) return print_error("unknown command '" + name + "', expected one of: " + names, 2);
  }

  // A flag before any command: name it (CLI11 would only ask for a command).
  if (argc >= 2 && argv[1][0] == '-') {
    const std::string flag = std::string(argv[1]).substr(0, std::string(argv[1]).find('='));
    if (flag == "--version" && argc > 2)  // CLI11 would print the version and ignore the rest
      return print_error("--version: takes nothing after it, got '" + std::string(argv[2]) + "'", 2);
    if (flag != "-h" && flag != "--help" && flag != "--version") {
      std::string names;
      for (const Command& c : commands) names += (names.empty() ? "" : ", ") + c.app->get_name();
      return print_error(flag + ": unknown flag for posenc (expected --help, --version or a command first: " +
                             names + ")",
                         2);
    }
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // --help, --version
      app.exit(e);
      return finish_stdout();
    }
    std::string msg = e.what();
    if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && msg.rfind("A subcommand", 0) == 0) {
      std::string names;
      for (const Command& c : commands) names += (names.empty() ? "" : ", ") + c.app->get_name();
      msg = "expected a command: " + names + " (see posenc --help)";
    }
    // CLI11's wordings in the "posenc: <flag>: <what>" shape
    static const std::string kRequired = " is required";
    if (msg.size() > kRequired.size() && msg.compare(msg.size() - kRequired.size(), kRequired.size(), kRequired) == 0 &&
        msg.find(' ') == msg.size() - kRequired.size())
      msg = msg.substr(0, msg.size() - kRequired.size()) + ": is required (see --help)";
    static const std::string kMissing = ": 1 required ";
    if (const std::size_t at = msg.find(kMissing);
        at != std::string::npos && msg.size() > 8 && msg.compare(msg.size() - 8, 8, " missing") == 0)
      msg = msg.substr(0, at) + ": expected a value (" +
            msg.substr(at + kMissing.size(), msg.size() - 8 - at - kMissing.size()) + ")";
    static const std::string kExtra = "The following argument was not expected: ";
    if (msg.rfind(kExtra, 0) == 0) msg = "unexpected argument '" + msg.substr(kExtra.size()) + "'";
    static const std::string kTwice = ": At Most 1 required but received ";
    if (const std::size_t at = msg.find(kTwice); at != std::string::npos)
      msg = msg.substr(0, at) + ": given " + msg.substr(at + kTwice.size()) + " times, expected once";
    const std::string override_tail = " was given a disallowed flag override";
    if (msg.size() > override_tail.size() &&
        msg.compare(msg.size() - override_tail.size(), override_tail.size(), override_tail) == 0)
      msg = "--" + msg.substr(0, msg.size() - override_tail.size()) + ": is a flag and takes no value (give it alone)";
    return print_error(msg, 2);
  }

  for (const Command& c : commands) {
    if (!c.app->parsed()) continue;
    try {
      // Unknown flags and stray words are collected (allow_extras) so that they get one clear line.
      const std::vector<std::string> extras = c.app->remaining();
      if (!extras.empty()) {
        const std::string& x = extras.front();
        if (x.rfind("-", 0) == 0) {
          const std::string flag = x.substr(0, x.find('='));
          std::string owners;  // a parameter of an encoding this command does not take?
          for (const posenc::EncodingInfo& e : posenc::registry())
            for (const posenc::ParamSpec& p : e.params)
              if ("--" + p.name == flag) owners += (owners.empty() ? "" : " and ") + e.name;
          if (!owners.empty())
            return print_error(flag + ": is a parameter of " + owners + ", which posenc " +
                                   c.app->get_name() + " does not take",
                               2);
          return print_error(flag + ": unknown flag for posenc " + c.app->get_name() + " (see posenc " +
                                 c.app->get_name() + " --help)",
                             2);
        }
        return print_error("unexpected argument '" + x + "' (see posenc " + c.app->get_name() + " --help)",
                           2);
      }
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
  return print_error("expected a command (see posenc --help)", 2);
}

}  // namespace posenc::cli
