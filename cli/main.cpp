// strata: the command-line entry point. Subcommands live in cli/cmd_*.cpp.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/backend_cli.h"
#include "cli/command.h"
#include "strata/base/error.h"

namespace strata::cli {
namespace {

struct Registered {
  const char* name;
  const char* summary;
  CommandSetup setup;
};

std::vector<Registered>& registry() {
  static std::vector<Registered> commands;
  return commands;
}

int g_exit_code = 0;

}  // namespace

bool register_command(const char* name, const char* summary, CommandSetup setup) {
  registry().push_back({name, summary, setup});
  return true;
}

void set_exit_code(int code) { g_exit_code = code; }

}  // namespace strata::cli

int main(int argc, char** argv) {
  using namespace strata::cli;
  CLI::App app{"strata: Mixture-of-Experts inference with hot experts on the GPU and cold ones on the CPU"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "strata 0.1.0");
  for (const auto& cmd : registry()) {
    CLI::App* sub = app.add_subcommand(cmd.name, cmd.summary);
    cmd.setup(*sub);
  }
  std::vector<std::string> args(argv, argv + argc);
  std::vector<char*> arg_ptrs;
  bool options = true;  // after "--" everything is a positional value, never an alias
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") options = false;
    if (i > 0 && options) args[i] = expand_short_alias(args[i]);
    arg_ptrs.push_back(args[i].data());
  }
  try {
    app.parse(argc, arg_ptrs.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "strata: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata: internal error: %s\n", e.what());
    return 2;
  }
  return g_exit_code;
}
