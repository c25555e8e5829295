// Command-line parsing shared by the tools: --help exits 0, a bad flag or value prints
// CLI11's message and exits 2; an error message is printed as one line.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

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

// `message` with its control characters escaped (a newline as \n, a tab as \t, others as
// \xNN), so that an error is one line even when a path in it holds a newline.
inline std::string one_line(std::string_view message) {
  std::string out;
  for (const char ch : message) {
    const auto byte = static_cast<unsigned char>(ch);
    if (ch == '\n')
      out += "\\n";
    else if (ch == '\t')
      out += "\\t";
    else if (byte < 0x20 || byte == 0x7f)
      out += fmt::format("\\x{:02x}", byte);
    else
      out += ch;
  }
  return out;
}

}  // namespace kiln::tools
