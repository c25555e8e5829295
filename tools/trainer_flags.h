// The trainer's training flags on the command line, made from the one flag table
// (train/flags.h): each flag's option with its help, the tasks it is for and its default;
// the values go through the same checks as --config files.
#pragma once

#include <CLI/CLI.hpp>

#include <map>
#include <set>
#include <string>

#include "train/config.h"

namespace kiln::tools {

// What CLI11 parsed, by flag name, before the table's checks.
struct FlagValues {
  std::map<std::string, std::string> text;
  std::map<std::string, bool> present;  // boolean flags (std::map: stable addresses)
};

// Adds every flag of the table to `app`, its default shown from `defaults`.
void add_training_flags(CLI::App& app, const TrainConfig& defaults, FlagValues& values);

// Applies the flags given on the command line to `config` and adds their names to `given`.
// kiln::Error (a usage error: exit 2) naming the flag for a value of the wrong type or
// out of range.
void apply_training_flags(const CLI::App& app, const FlagValues& values, TrainConfig& config,
                          std::set<std::string>& given);

}  // namespace kiln::tools
