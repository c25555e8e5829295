// libFuzzer harness for a checkpoint's metadata as trainer eval, predict, --sample and
// --resume read it (train/checkpoint_metadata.h): the data position and the settings, from
// kiln.config or an older checkpoint's loose keys. The input is split at 0xFF bytes (which
// no UTF-8 text holds) into the values of kFields, in order; an empty value leaves its key
// out. Both readers return a checked result or throw kiln::Error naming the file; anything
// else (a crash, a sanitizer report, another exception, a value out of range) is a bug.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "train/checkpoint_metadata.h"
#include "train/flags.h"

namespace {

constexpr const char* kFields[] = {"kiln.config", "model",      "kiln.step", "kiln.epoch",
                                   "kiln.batch",  "batch_size", "seed",      "hidden",
                                   "embedding",   "layers",     "seq_len",   "cell"};
constexpr std::string_view kPath = "fuzz.safetensors";

kiln::Metadata metadata_of(std::string_view input) {
  kiln::Metadata metadata;
  for (const char* key : kFields) {
    const std::size_t end = std::min(input.find('\xff'), input.size());
    if (end > 0) metadata[key] = std::string(input.substr(0, end));
    input.remove_prefix(std::min(end + 1, input.size()));
  }
  return metadata;
}

[[noreturn]] void fail(const char* what, const char* detail) {
  std::fprintf(stderr, "%s: %s\n", what, detail);
  std::abort();
}

void expect_named(const kiln::Error& e) {
  if (std::string_view(e.what()).substr(0, kPath.size()) != kPath)
    fail("error without the file name", e.what());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const kiln::Metadata metadata =
      metadata_of(std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    const kiln::TrainingPosition p = kiln::checkpoint_position(metadata, std::string(kPath));
    if (p.step < 0 || p.step > kiln::kMaxCheckpointSteps || p.epoch < 1 || p.batch < 0)
      fail("accepted a position out of range", "");
  } catch (const kiln::Error& e) {
    expect_named(e);
  }
  try {
    const kiln::TrainConfig c = kiln::checkpoint_settings(metadata, std::string(kPath));
    kiln::validate_config(c);  // every accepted value is in its flag's range
  } catch (const kiln::Error& e) {
    expect_named(e);
  }
  return 0;
}
