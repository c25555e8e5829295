// Autotuning records: their key, their text, and the table of them in memory and on disk.
#include "gpu/tuning_record.h"

#include <fmt/format.h>

#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "gpu/cache_admin.h"
#include "gpu/cache_entry.h"

namespace kiln::gpu {
namespace {

// Bump when the meaning of a record or of its key changes.
constexpr std::string_view kTuningScheme = "kiln-tuning-1";

}  // namespace

Digest tuning_key(const std::string& problem, const std::vector<std::string>& candidates, int sm,
                  int driver) {
  Sha256 hash;
  hash.update_field(kTuningScheme).update_field(problem);
  hash.update_field(fmt::format("sm_{} driver {}", sm, driver));
  hash.update_field(std::to_string(candidates.size()));
  for (const std::string& c : candidates) hash.update_field(c);
  return hash.finish();
}

std::string encode_tuning(const TuningRecord& record) {
  KILN_ASSERT(record.us.size() == record.candidates.size() && record.chosen >= 0 &&
                  record.chosen < static_cast<int>(record.candidates.size()),
              "tuning record of '{}': {} times for {} candidates, choice {}", record.problem,
              record.us.size(), record.candidates.size(), record.chosen);
  std::string text =
      fmt::format("{}\nproblem {}\nchosen {}\n", kTuningScheme, record.problem, record.choice());
  for (std::size_t i = 0; i < record.candidates.size(); ++i)
    text += fmt::format("{} {:.3f}\n", record.candidates[i], record.us[i]);
  return text;
}

std::optional<TuningRecord> decode_tuning(const std::string& text, const std::string& problem,
                                          const std::vector<std::string>& candidates) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kTuningScheme) return std::nullopt;
  if (!std::getline(in, line) || line != "problem " + problem) return std::nullopt;
  std::string chosen;
  if (!std::getline(in, line) || line.rfind("chosen ", 0) != 0) return std::nullopt;
  chosen = line.substr(7);
  TuningRecord r{problem, candidates, {}, -1, true};
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    std::string label;
    double us = 0;
    if (!std::getline(in, line)) return std::nullopt;
    std::istringstream fields(line);
    if (!(fields >> label >> us) || label != candidates[i]) return std::nullopt;
    r.us.push_back(us);
    if (label == chosen) r.chosen = static_cast<int>(i);
  }
  if (r.chosen < 0 || std::getline(in, line)) return std::nullopt;  // unknown choice, or more
  return r;
}

TuningTable::TuningTable(std::filesystem::path dir) : disk_(std::move(dir)) {}

std::optional<TuningRecord> TuningTable::find(const std::string& problem,
                                              const std::vector<std::string>& candidates, int sm,
                                              int driver) {
  const Digest key = tuning_key(problem, candidates, sm, driver);
  {
    std::lock_guard lock(mutex_);
    if (auto it = memory_.find(key); it != memory_.end()) return it->second;
  }
  DiskCache::Lookup lookup = disk_.load(key);
  if (lookup.status != DiskCache::Status::hit) return std::nullopt;
  std::optional<TuningRecord> record =
      decode_tuning(std::string(lookup.payload.begin(), lookup.payload.end()), problem, candidates);
  if (!record) {
    log().warn("autotune: ignoring the unreadable record {} for '{}'; it is timed again",
               disk_.entry_path(key).string(), problem);
    return std::nullopt;
  }
  std::lock_guard lock(mutex_);
  if (memory_.emplace(key, *record).second) order_.push_back(key);
  return record;
}

void TuningTable::store(const TuningRecord& record, int sm, int driver) {
  const Digest key = tuning_key(record.problem, record.candidates, sm, driver);
  {
    std::lock_guard lock(mutex_);
    if (memory_.insert_or_assign(key, record).second) order_.push_back(key);
  }
  const std::string text = encode_tuning(record);
  if (!disk_.store(key, std::vector<char>(text.begin(), text.end()))) return;
  const std::string meta = cache_meta_text("autotune: " + record.problem, sm,
                                           fmt::format("driver {}", driver), {}, text);
  write_file_atomically(meta_path(disk_.dir(), key), std::vector<char>(meta.begin(), meta.end()));
}

std::vector<TuningRecord> TuningTable::used() const {
  std::lock_guard lock(mutex_);
  std::vector<TuningRecord> records;
  for (const Digest& key : order_) records.push_back(memory_.at(key));
  return records;
}

}  // namespace kiln::gpu
