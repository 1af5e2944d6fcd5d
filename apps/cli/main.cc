// posenc — positional encodings for transformers over .npy files: cli/run_cli.h does the work.
#include "cli/run_cli.h"

int main(int argc, char** argv) {
  posenc::cli::CliRun how;
  how.exit_on_out_of_memory = true;
  return posenc::cli::run_cli(argc, argv, how);
}
