// libFuzzer harness for the trainer's JSON config reader: on any bytes, parse_train_config
// returns a config or throws kiln::Error naming the file; anything else is a bug.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "train/config_file.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const kiln::TrainConfig c = kiln::parse_train_config(text, "fuzz.json", kiln::TrainConfig{});
    if (c.loop.epochs < 1 || c.loop.batch_size < 1 ||
        !(c.loop.lr > 0)) {  // accepted values obey the documented ranges
      std::fprintf(stderr, "accepted an out-of-range config\n");
      std::abort();
    }
  } catch (const kiln::Error& e) {
    if (std::string_view(e.what()).substr(0, 10) != "fuzz.json:") {
      std::fprintf(stderr, "error without the file name: %s\n", e.what());
      std::abort();
    }
  }
  return 0;
}
