// Subcommand registry: each cli/cmd_*.cpp registers one subcommand at static-initialisation time,
// so adding a command touches no shared file.
#pragma once

#include <CLI/CLI.hpp>

namespace strata::cli {

// Declares the subcommand's options on `sub` and sets its callback (sub.callback(...)).
// The callback may throw strata::Error; main prints it and exits 1.
using CommandSetup = void (*)(CLI::App& sub);

// Returns true so it can initialise a namespace-scope constant:
//   static const bool registered = register_command("inspect", "Show a GGUF file", setup_inspect);
bool register_command(const char* name, const char* summary, CommandSetup setup);

// Exit code the callback asks main to return (defaults to 0).
void set_exit_code(int code);

}  // namespace strata::cli
