// Tests of the autotuning records (gpu/tuning_record.h): their text, their key, and the table in
// memory and on disk, where a damaged or foreign record is never trusted. The timing itself
// (gpu/autotune.h) is tested with the convolution tiles in cuda_kernels_test.cpp.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gpu/cache_admin.h"
#include "gpu/cache_entry.h"
#include "gpu/tuning_record.h"
#include "tests/temp_dir.h"

namespace fs = std::filesystem;
using namespace kiln::gpu;

namespace {

const std::vector<std::string> kLabels = {"128x64w2x2p8s3", "64x128w2x2p8s3", "64x64w2x2p8s4"};

TuningRecord sample() {
  return TuningRecord{"conv_nhwc fwd bf16 m64 n131072 k576", kLabels, {93.5, 88.25, -1.0}, 1};
}

}  // namespace

TEST_CASE("a tuning record's text round-trips and anything else is refused") {
  const TuningRecord r = sample();
  const std::string text = encode_tuning(r);
  CHECK(text.find("chosen 64x128w2x2p8s3\n") != std::string::npos);
  const auto back = decode_tuning(text, r.problem, kLabels);
  REQUIRE(back);
  CHECK(back->chosen == 1);
  CHECK(back->us == std::vector<double>{93.5, 88.25, -1.0});
  CHECK(back->choice() == "64x128w2x2p8s3");
  CHECK_FALSE(decode_tuning(text, r.problem + " ", kLabels));             // another problem
  CHECK_FALSE(decode_tuning(text, r.problem, {"a", "b", "c"}));           // other candidates
  CHECK_FALSE(decode_tuning(text, r.problem, {kLabels[0], kLabels[1]}));  // fewer
  CHECK_FALSE(decode_tuning(text.substr(0, text.size() / 2), r.problem, kLabels));
  CHECK_FALSE(decode_tuning(text + "extra 1\n", r.problem, kLabels));
  std::string unknown = text;
  unknown.replace(unknown.find("chosen 64x128"), 13, "chosen 32x32w");
  CHECK_FALSE(decode_tuning(unknown, r.problem, kLabels));
  CHECK_FALSE(decode_tuning("", r.problem, kLabels));
}

TEST_CASE("a tuning key covers the problem, the candidates, the architecture and the driver") {
  const TuningRecord r = sample();
  const Digest key = tuning_key(r.problem, kLabels, 90, 13000);
  CHECK(key == tuning_key(r.problem, kLabels, 90, 13000));
  CHECK(key != tuning_key(r.problem + "x", kLabels, 90, 13000));
  CHECK(key != tuning_key(r.problem, {kLabels[1], kLabels[0], kLabels[2]}, 90, 13000));
  CHECK(key != tuning_key(r.problem, kLabels, 80, 13000));
  CHECK(key != tuning_key(r.problem, kLabels, 90, 13010));
}

TEST_CASE("the tuning table keeps records in memory and on disk, and never trusts a bad one") {
  kiln::test::TempDir dir;
  const TuningRecord r = sample();
  {
    TuningTable table(dir.path());
    CHECK_FALSE(table.find(r.problem, kLabels, 90, 13000));
    table.store(r, 90, 13000);
    const auto found = table.find(r.problem, kLabels, 90, 13000);
    REQUIRE(found);
    CHECK(found->chosen == 1);
    CHECK_FALSE(found->from_disk);
    CHECK(table.used().size() == 1);
  }
  TuningTable fresh(dir.path());  // another process: from the disk
  auto found = fresh.find(r.problem, kLabels, 90, 13000);
  REQUIRE(found);
  CHECK(found->from_disk);
  CHECK(found->us == r.us);
  CHECK_FALSE(fresh.find(r.problem, kLabels, 90, 13010));  // another driver times again
  // kiln-cache lists the record with the kernels, by its problem.
  const std::vector<CacheEntryInfo> entries = list_cache(dir.path());
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].name == "autotune: " + r.problem);

  const Digest key = tuning_key(r.problem, kLabels, 90, 13000);
  const fs::path entry = dir.path() / (to_hex(key) + ".kcubin");
  REQUIRE(fs::exists(entry));
  const std::string garbage = "kiln-tuning-1\nproblem nonsense\n";  // a whole entry, bad text
  write_file_atomically(entry,
                        encode_entry(key, std::vector<char>(garbage.begin(), garbage.end())));
  CHECK_FALSE(TuningTable(dir.path()).find(r.problem, kLabels, 90, 13000));
  std::ofstream(entry, std::ios::binary | std::ios::trunc) << "KILNCUBN";  // truncated
  CHECK_FALSE(TuningTable(dir.path()).find(r.problem, kLabels, 90, 13000));

  TuningTable memory_only{fs::path()};  // no directory: still a working table
  memory_only.store(r, 90, 13000);
  CHECK(memory_only.find(r.problem, kLabels, 90, 13000));
}
