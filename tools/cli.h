// Command-line parsing shared by the tools: --help exits 0, a bad flag or value prints
// CLI11's message and exits 2.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>

namespace kiln::tools {

// nullopt when the tool should go on; otherwise the exit code to return.
inline std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the message
    return 2;
  }
  return std::nullopt;
}

}  // namespace kiln::tools
