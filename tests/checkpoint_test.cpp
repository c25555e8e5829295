// safetensors: round trips, the exact bytes written, every kind of malformed file, atomic saves
// (full disk, a writer killed mid-write, unwritable places) and the fuzzers' inputs (safetensors,
// IDX).
#include <doctest/doctest.h>

#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "core/atomic_file.h"
#include "core/safetensors.h"
#include "data/idx.h"
#include "train/checkpoint_metadata.h"
#include "train/config_file.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;
using Named = std::vector<std::pair<std::string, Tensor>>;

// A fresh directory under the system temp directory, removed with everything in it on scope exit.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    for (int attempt = 0;; ++attempt) {
      path_ = fs::temp_directory_path() /
              fmt::format("kiln_checkpoint_test_{}_{}", ::getpid(), counter++);
      if (fs::create_directory(path_)) break;
      REQUIRE(attempt < 100);
    }
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  fs::path file(const std::string& name) const { return path_ / name; }
  const fs::path& path() const { return path_; }
  // Names of everything in the directory except `keep`.
  std::vector<std::string> others(const std::string& keep) const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(path_))
      if (e.path().filename() != keep) names.push_back(e.path().filename().string());
    return names;
  }

 private:
  fs::path path_;
};

void write_bytes(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

Bytes read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A safetensors file from a header text (taken as is) and data.
Bytes st_bytes(const std::string& header, const Bytes& data = {}) {
  Bytes out;
  out.reserve(8 + header.size() + data.size());
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(header.size() >> (8 * i)));
  for (char c : header) out.push_back(static_cast<std::uint8_t>(c));
  for (std::uint8_t b : data) out.push_back(b);
  return out;
}

// One tensor entry of a header: "name":{"dtype":...,"shape":...,"data_offsets":...}.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return fmt::format(R"("{}":{{"dtype":{},"shape":{},"data_offsets":{}}})", name, dtype, shape,
                     offsets);
}

bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Every tensor of `expected` is in `file`, bit for bit.
void check_contents(const SafetensorsFile& file, const Named& expected) {
  REQUIRE(file.tensors.size() == expected.size());
  for (const auto& [name, t] : expected) {
    INFO("tensor ", name);
    REQUIRE(file.tensors.count(name) == 1);
    CHECK(same_tensor(file.tensors.at(name), t));
  }
}

// A few tensors of every dtype, with the awkward values: NaN, infinities, -0, integer extremes.
Named every_dtype() {
  const double nan = std::numeric_limits<double>::quiet_NaN(),
               inf = std::numeric_limits<double>::infinity();
  return {
      {"conv.weight", Tensor::from_vector<float>(
                          {2, 3}, {1.5f, -0.0f, float(nan), float(inf), -float(inf), 1e-42f})},
      {"f64", Tensor::from_vector<double>({4}, {nan, -inf, 0.1, -1e308})},
      {"i32", Tensor::from_vector<std::int32_t>({2, 2}, {INT32_MIN, INT32_MAX, -1, 0})},
      {"i64", Tensor::from_vector<std::int64_t>({3}, {INT64_MIN, INT64_MAX, 42})},
      {"u8", Tensor::from_vector<std::uint8_t>({1, 5}, {0, 1, 127, 128, 255})},
      {"scalar", Tensor::from_vector<float>({}, {3.0f})},
      {"empty", Tensor::zeros({0, 3}, DType::f64)},
      {"odd.u8", Tensor::from_vector<std::uint8_t>({3}, {7, 8, 9})},
  };
}

// The message of the kiln::Error that `f` throws ("" when it throws none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Runs `child` in a forked process and returns its wait status; the child never returns here.
int in_child(const std::function<int()>& child) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 99;
    try {
      code = child();
    } catch (...) {}
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}

// ---------------------------------------------------------------------------------------------
// Writing and reading back

TEST_CASE("safetensors: every dtype and the metadata survive a round trip") {
  TempDir dir;
  const fs::path path = dir.file("ckpt.safetensors");
  const Named tensors = every_dtype();
  const std::map<std::string, std::string> metadata = {
      {"config", R"({"lr": 0.001, "model": "lenet"})"},
      {"empty", ""},
      {"unicode", "µ-step \u00e9 \U0001F600"}};
  save_safetensors(path, tensors, metadata);

  const SafetensorsFile file = load_safetensors(path);
  check_contents(file, tensors);
  CHECK(file.metadata == metadata);
  // Parsing the bytes in memory gives the same.
  const SafetensorsFile parsed = parse_safetensors(read_bytes(path), "mem");
  check_contents(parsed, tensors);
  CHECK(parsed.metadata == metadata);
  CHECK(dir.others("ckpt.safetensors").empty());  // no temp file left
}

TEST_CASE("safetensors: a saved file has exactly the reference layout") {
  TempDir dir;
  const fs::path path = dir.file("exact.safetensors");
  // Given i32 first, but 8-byte elements are laid out first so every tensor stays aligned.
  save_safetensors(path,
                   {{"b", Tensor::from_vector<std::int32_t>({2}, {1, -2})},
                    {"a", Tensor::from_vector<double>({1, 1}, {0.5})}},
                   {{"step", "3"}});
  std::string header =
      R"({"__metadata__":{"step":"3"},"a":{"dtype":"F64","shape":[1,1],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"I32","shape":[2],"data_offsets":[8,16]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const Bytes expected_data = {0, 0, 0, 0, 0,    0,    0xE0, 0x3F,  // 0.5 as a little-endian double
                               1, 0, 0, 0, 0xFE, 0xFF, 0xFF, 0xFF};
  CHECK(read_bytes(path) == st_bytes(header, expected_data));
  CHECK(header.size() % 8 == 0);

  // No tensors, no metadata: the smallest valid file.
  save_safetensors(path, {}, {});
  CHECK(read_bytes(path) == st_bytes("{}      "));
  CHECK(load_safetensors(path).tensors.empty());
}

TEST_CASE("safetensors: Python reads the files kiln writes") {
  if (std::system("python3 -c 'import json, struct' >/dev/null 2>&1") != 0) {
    MESSAGE("python3 not found: skipped");
    return;
  }
  TempDir dir;
  const fs::path path = dir.file("py.safetensors");
  const fs::path script = dir.file("read.py");
  save_safetensors(path,
                   {{"w", Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4.5f})},
                    {"n", Tensor::from_vector<std::int64_t>({3}, {-5, 6, 7})},
                    {"u", Tensor::from_vector<std::uint8_t>({2}, {200, 3})}},
                   {{"epoch", "2"}});
  // A reader written from the format description alone, as strict as the reference one;
  // and the reference reader itself where the safetensors module is installed.
  std::ofstream(script) << R"(import json, struct, sys
raw = open(sys.argv[1], 'rb').read()
(n,) = struct.unpack('<Q', raw[:8])
assert n % 8 == 0 and 8 + n <= len(raw)
header = json.loads(raw[8:8 + n].decode('utf-8'))
assert header.pop('__metadata__') == {'epoch': '2'}
data = raw[8 + n:]
fmt = {'F32': 'f', 'F64': 'd', 'I32': 'i', 'I64': 'q', 'U8': 'B'}
end = 0
for name, info in sorted(header.items(), key=lambda kv: kv[1]['data_offsets']):
    b, e = info['data_offsets']
    assert b == end, 'gap or overlap'
    end = e
    count = 1
    for d in info['shape']:
        count *= d
    values = struct.unpack('<%d%s' % (count, fmt[info['dtype']]), data[b:e])
    print(name, info['dtype'], info['shape'], sum(values))
assert end == len(data)
try:
    import safetensors
except ImportError:
    sys.exit(0)
try:
    from safetensors import deserialize
except ImportError:
    from safetensors._safetensors_rust import deserialize
tensors = {name: t for name, t in deserialize(raw)}
assert sorted(tensors) == ['n', 'u', 'w'], sorted(tensors)
assert list(tensors['w']['shape']) == [2, 2] and bytes(tensors['w']['data']) == data[header['w']['data_offsets'][0]:header['w']['data_offsets'][1]]
print('reference reader: ok')
)";
  const fs::path out = dir.file("out.txt");
  const int rc = std::system(
      fmt::format("python3 {} {} > {} 2>&1", script.string(), path.string(), out.string()).c_str());
  const Bytes printed = read_bytes(out);
  const std::string text(printed.begin(), printed.end());
  INFO(text);
  REQUIRE(rc == 0);
  CHECK(text.find("n I64 [3] 8\n") != std::string::npos);
  CHECK(text.find("w F32 [2, 2] 10.5\n") != std::string::npos);
  CHECK(text.find("u U8 [2] 203\n") != std::string::npos);
  if (text.find("reference reader: ok") == std::string::npos)
    MESSAGE("Python's safetensors module not installed: only the independent reader ran");
}

TEST_CASE("safetensors: save refuses bad names and tensors before touching the file") {
  TempDir dir;
  const fs::path path = dir.file("bad.safetensors");
  const Tensor t = Tensor::zeros({2}, DType::f32);
  CHECK(error_of([&] {
          save_safetensors(path, {{"a", t}, {"a", t}});
        }) == path.string() + ": the tensor name 'a' is given twice");
  CHECK(error_of([&] {
          save_safetensors(path, {{"", t}});
        }) == path.string() + ": a tensor has an empty name");
  CHECK(error_of([&] {
          save_safetensors(path, {{"__metadata__", t}});
        }).find("reserved") != std::string::npos);
  CHECK(error_of([&] {
          save_safetensors(path, {{"u", Tensor()}});
        }) == path.string() + ": tensor 'u' is undefined");
  CHECK(error_of([&] {
          save_safetensors(path, {{"a", t}}, {{"k", "\xff\xfe"}});
        }).find("not valid UTF-8") != std::string::npos);
  CHECK(dir.others("").empty());
}

// ---------------------------------------------------------------------------------------------
// Malformed files: each is a kiln::Error naming the file and the problem, never a crash

struct Malformed {
  const char* what;
  Bytes bytes;
  std::string message;  // expected inside the message, after "<file>: "
};

std::vector<Malformed> malformed_files() {
  const auto one = [](const std::string& dtype, const std::string& shape,
                      const std::string& offsets) {
    return "{" + entry("t", dtype, shape, offsets) + "}";
  };
  Bytes past_cap = st_bytes("{}");
  past_cap[3] = 0x10;  // 2^28 > 100 MB
  Bytes huge = st_bytes("{}");
  std::fill(huge.begin(), huge.begin() + 8, 0xFF);
  std::string deep = R"({"t":{"dtype":"F32","shape":)" + std::string(100000, '[') +
                     std::string(100000, ']') + "}}";
  return {
      {"empty file", {}, "0 bytes is too short for a safetensors file"},
      {"truncated length",
       {8, 0, 0},
       "3 bytes is too short for a safetensors file (the header length alone takes 8)"},
      {"header past the end",
       {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'},
       "header length 100 runs past the end of the file (2 bytes follow the length)"},
      {"header over the cap", past_cap,
       "header length 268435458 exceeds the limit of 100000000 bytes"},
      {"header length 2^64-1", huge, "header length 18446744073709551615 exceeds the limit"},
      {"not JSON", st_bytes("{\"t\": "), "the header is not valid JSON"},
      {"bad UTF-8", st_bytes("{\"\xc3\x28\":1}"), "the header is not valid JSON"},
      {"not an object", st_bytes("[1, 2]  "), "the header does not start with '{'"},
      {"leading space", st_bytes(" {}"), "the header does not start with '{'"},
      {"entry not an object", st_bytes(R"({"t":5})"), "tensor 't' is a JSON number, not an object"},
      {"missing key", st_bytes(R"({"t":{"dtype":"F32","shape":[]}})"),
       "tensor 't' has no data_offsets"},
      {"unknown key",
       st_bytes(R"({"t":{"dtype":"U8","shape":[],"data_offsets":[0,1],"x":1}})", {1}),
       "tensor 't' has the unknown key 'x' (expected dtype, shape and data_offsets)"},
      {"dtype not a string", st_bytes(one("4", "[1]", "[0,4]"), Bytes(4)),
       "tensor 't': dtype is a JSON number"},
      {"unsupported dtype", st_bytes(one("\"I16\"", "[2]", "[0,4]"), Bytes(4)),
       "tensor 't' has dtype I16, which kiln does not support (F32, F64, BF16, F16, I32, I64, U8)"},
      {"unknown dtype", st_bytes(one("\"F33\"", "[1]", "[0,4]"), Bytes(4)),
       "tensor 't' has the unknown dtype 'F33'"},
      {"shape not an array", st_bytes(one("\"U8\"", "\"2\"", "[0,2]"), Bytes(2)),
       "tensor 't': shape is a JSON string, not an array"},
      {"negative dimension", st_bytes(one("\"U8\"", "[2,-3]", "[0,0]")),
       "tensor 't': shape dimension 1 is -3 (negative)"},
      {"fractional dimension", st_bytes(one("\"U8\"", "[2.5]", "[0,2]"), Bytes(2)),
       "tensor 't': shape dimension 0 is 2.5 (a non-negative integer is expected)"},
      {"dimension as string", st_bytes(one("\"U8\"", "[\"2\"]", "[0,2]"), Bytes(2)),
       "shape dimension 0 is the string '2'"},
      {"rank 9", st_bytes(one("\"U8\"", "[1,1,1,1,1,1,1,1,1]", "[0,1]"), {1}),
       "tensor 't' has rank 9 (at most 8"},
      {"element count overflow",
       st_bytes(one("\"F64\"", "[4294967296,4294967296]", "[0,8]"), Bytes(8)),
       "tensor 't': shape [4294967296,4294967296] has more than 2^63 elements"},
      {"dimension past int64", st_bytes(one("\"U8\"", "[18446744073709551615]", "[0,1]"), {1}),
       "has more than 2^63 elements"},
      {"dimension past uint64", st_bytes(one("\"U8\"", "[100000000000000000000000]", "[0,1]"), {1}),
       "(a non-negative integer is expected)"},
      {"size overflow", st_bytes(one("\"F64\"", "[4611686018427387904]", "[0,8]"), Bytes(8)),
       "needs 4611686018427387904 elements of 8 bytes but data_offsets [0, 8] hold 8 bytes"},
      {"offsets not a pair", st_bytes(one("\"U8\"", "[1]", "[0,1,2]"), {1}),
       "data_offsets is [0,1,2] (expected [begin, end])"},
      {"negative offset", st_bytes(one("\"U8\"", "[1]", "[-1,0]"), {1}),
       "tensor 't': data_offsets begin is -1 (negative)"},
      {"reversed offsets", st_bytes(one("\"U8\"", "[1]", "[1,0]"), {1}),
       "data_offsets [1, 0] end before they begin"},
      {"offsets past the data",
       st_bytes("{" + entry("fc1.weight", "\"F32\"", "[25]", "[0,100]") + "}", Bytes(64)),
       "tensor 'fc1.weight' data_offsets [0, 100] run past the 64 bytes of data"},
      {"offset near 2^64",
       st_bytes(one("\"U8\"", "[1]", "[18446744073709551615,18446744073709551615]"), {1}),
       "run past the 1 bytes of data"},
      {"size mismatch", st_bytes(one("\"F32\"", "[2,3]", "[0,20]"), Bytes(20)),
       "tensor 't': shape [2, 3] of F32 needs 6 elements of 4 bytes but data_offsets [0, 20] hold "
       "20 bytes"},
      {"overlap",
       st_bytes("{" + entry("a", "\"F32\"", "[2]", "[0,8]") + "," +
                    entry("b", "\"F32\"", "[2]", "[4,12]") + "}",
                Bytes(12)),
       "tensors 'a' (data_offsets [0, 8]) and 'b' ([4, 12]) overlap"},
      {"same offsets",
       st_bytes("{" + entry("a", "\"U8\"", "[2]", "[0,2]") + "," +
                    entry("b", "\"U8\"", "[2]", "[0,2]") + "}",
                Bytes(2)),
       "tensors 'a' (data_offsets [0, 2]) and 'b' ([0, 2]) overlap"},
      {"gap",
       st_bytes("{" + entry("a", "\"U8\"", "[2]", "[0,2]") + "," +
                    entry("b", "\"U8\"", "[2]", "[4,6]") + "}",
                Bytes(6)),
       "bytes [2, 4) of the data belong to no tensor (a gap before 'b')"},
      {"trailing data", st_bytes(one("\"U8\"", "[2]", "[0,2]"), Bytes(5)),
       "the last 3 bytes of the 5 bytes of data belong to no tensor"},
      {"duplicate tensor",
       st_bytes("{" + entry("a", "\"U8\"", "[1]", "[0,1]") + "," +
                    entry("a", "\"U8\"", "[1]", "[1,2]") + "}",
                Bytes(2)),
       "the header has the key 'a' twice in one object"},
      {"duplicate field",
       st_bytes(R"({"t":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", {1}),
       "the header has the key 'dtype' twice"},
      {"metadata not an object", st_bytes(R"({"__metadata__":["a"]})"),
       "__metadata__ is a JSON array, not an object of strings"},
      {"metadata value not a string", st_bytes(R"({"__metadata__":{"step":3}})"),
       "__metadata__ value of 'step' is a JSON number, not a string"},
      {"deep nesting", st_bytes(deep), "the header nests deeper than the safetensors format does"},
  };
}

TEST_CASE("safetensors: every malformed file is a kiln::Error naming the file and the problem") {
  TempDir dir;
  const fs::path path = dir.file("ckpt.safetensors");
  for (const Malformed& m : malformed_files()) {
    INFO(std::string(m.what));
    const std::string parsed = error_of([&] { parse_safetensors(m.bytes, "ckpt.safetensors"); });
    CHECK(parsed.starts_with("ckpt.safetensors: "));
    CHECK_MESSAGE(parsed.find(m.message) != std::string::npos, parsed);
    // Loading the same bytes from disk gives the same message, naming the path.
    write_bytes(path, m.bytes);
    const std::string loaded = error_of([&] { load_safetensors(path); });
    CHECK(loaded == path.string() + parsed.substr(std::string("ckpt.safetensors").size()));
  }
}

TEST_CASE(
    "safetensors: a missing file, a directory and every truncation or byte flip are clean errors") {
  TempDir dir;
  CHECK(error_of([&] { load_safetensors(dir.file("none.safetensors")); }) ==
        dir.file("none.safetensors").string() +
            ": cannot open for reading (No such file or directory)");
  CHECK(error_of([&] { load_safetensors(dir.path()); }).find("not a regular file") !=
        std::string::npos);

  const fs::path path = dir.file("good.safetensors");
  save_safetensors(path, every_dtype(), {{"k", "v"}});
  const Bytes good = read_bytes(path);
  for (std::size_t n = 0; n < good.size(); ++n) {
    INFO("truncated to ", n, " bytes");
    CHECK(error_of([&] {
            parse_safetensors(std::span(good.data(), n), "cut");
          }).starts_with("cut: "));
  }
  // Any single byte of the length or header changed: a valid file or a kiln::Error.
  const std::size_t header_end = 8 + (good[0] | good[1] << 8);
  int accepted = 0;
  for (std::size_t i = 0; i < header_end; ++i) {
    for (std::uint8_t value : {0x00, 0x20, 0x22, 0x2C, 0x30, 0x39, 0x5B, 0x7B, 0x7D, 0xFF}) {
      Bytes bad = good;
      bad[i] = value;
      try {
        parse_safetensors(bad, "flip");
        ++accepted;
      } catch (const Error& e) {
        CHECK(std::string(e.what()).starts_with("flip: "));
      }
    }
  }
  CHECK(accepted > 0);  // padding spaces and digits that keep the layout
}

// A checkpoint_metadata fuzz input as its harness reads it: the values of these keys in
// order, split at 0xFF bytes; an empty value leaves its key out.
Metadata fuzzed_metadata(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Metadata metadata;
  std::string_view rest = text;
  for (const char* key :
       {"kiln.config", "model", "kiln.step", "kiln.epoch", "kiln.batch", "batch_size", "seed",
        "hidden", "embedding", "layers", "seq_len", "cell"}) {
    const std::size_t end = std::min(rest.find('\xff'), rest.size());
    if (end > 0) metadata[key] = std::string(rest.substr(0, end));
    rest.remove_prefix(std::min(end + 1, rest.size()));
  }
  return metadata;
}

// Loads every file of fuzz/{corpus,regressions}/<harness>/: "valid_*" seeds must load; the
// other seeds and every input that once crashed a fuzzer must fail with a kiln::Error.
int check_fuzz_inputs(const std::string& harness,
                      const std::function<void(const fs::path&)>& load) {
  const char* source = std::getenv("KILN_SOURCE_DIR");
  const fs::path root = source ? fs::path(source) : fs::path(__FILE__).parent_path().parent_path();
  int inputs = 0;
  for (const char* kind : {"corpus", "regressions"}) {
    const fs::path folder = root / "fuzz" / kind / harness;
    if (!fs::is_directory(folder)) continue;
    for (const auto& e : fs::directory_iterator(folder)) {
      INFO(e.path().string());
      const std::string error = error_of([&] { load(e.path()); });
      if (e.path().filename().string().starts_with("valid_"))
        CHECK(error.empty());
      else
        CHECK(error.starts_with(e.path().string() + ": "));
      ++inputs;
    }
  }
  return inputs;
}

TEST_CASE("fuzz inputs: the seed corpora and every input a fuzzer crashed on load cleanly") {
  const char* source = std::getenv("KILN_SOURCE_DIR");
  const fs::path root = source ? fs::path(source) : fs::path(__FILE__).parent_path().parent_path();
  if (!fs::exists(root / "fuzz" / "corpus")) {  // a test binary run away from its source tree
    MESSAGE("skipped: no fuzz corpus under " << root.string());
    return;
  }
  CHECK(check_fuzz_inputs("safetensors", [](const fs::path& p) { load_safetensors(p); }) >= 10);
  CHECK(check_fuzz_inputs("idx", [](const fs::path& p) { read_idx(p.string()); }) >= 10);
  CHECK(check_fuzz_inputs("config", [](const fs::path& p) { read_train_config(p, {}); }) >= 10);
  CHECK(check_fuzz_inputs("checkpoint_metadata", [](const fs::path& p) {
          const Metadata metadata = fuzzed_metadata(p);
          checkpoint_position(metadata, p.string());
          checkpoint_settings(metadata, p.string());
        }) >= 8);
}

// ---------------------------------------------------------------------------------------------
// Atomic saves

Named checkpoint(float value, std::int64_t elements) {
  return {{"w", Tensor::full({elements}, value, DType::f32)},
          {"step", Tensor::full({1}, value, DType::i64)}};
}

TEST_CASE("atomic save: a full disk leaves the previous checkpoint and no temp file") {
  TempDir dir;
  const fs::path path = dir.file("ckpt.safetensors");
  const Named previous = checkpoint(1.0f, 1000);
  save_safetensors(path, previous, {{"step", "1"}});
  const Named next = checkpoint(2.0f, 1000);
  for (const char* limit : {"0", "7", "8", "60", "4000", "4095"}) {
    INFO("KILN_FAKE_DISK_FULL_AFTER=", limit);
    REQUIRE(::setenv("KILN_FAKE_DISK_FULL_AFTER", limit, 1) == 0);
    const std::string error = error_of([&] { save_safetensors(path, next, {{"step", "2"}}); });
    ::unsetenv("KILN_FAKE_DISK_FULL_AFTER");
    CHECK(error == fmt::format("{}: write failed after {} bytes (No space left on device); "
                               "the previous file is intact",
                               path.string(), limit));
    check_contents(load_safetensors(path), previous);
    CHECK(load_safetensors(path).metadata.at("step") == "1");
    CHECK(dir.others("ckpt.safetensors").empty());
  }
  // The hook refuses a value that is not a byte count; a large one lets the save through.
  ::setenv("KILN_FAKE_DISK_FULL_AFTER", "lots", 1);
  CHECK(error_of([&] { save_safetensors(path, next); }) ==
        "KILN_FAKE_DISK_FULL_AFTER='lots' is not a byte count");
  ::setenv("KILN_FAKE_DISK_FULL_AFTER", "1000000", 1);
  save_safetensors(path, next);
  ::unsetenv("KILN_FAKE_DISK_FULL_AFTER");
  check_contents(load_safetensors(path), next);
}

TEST_CASE("atomic save: a real write error (file size limit) leaves the previous checkpoint") {
  TempDir dir;
  const fs::path path = dir.file("ckpt.safetensors");
  const Named previous = checkpoint(1.0f, 100);
  save_safetensors(path, previous);
  // RLIMIT_FSIZE makes write() fail with EFBIG once the temp file reaches 64 KiB.
  const int status = in_child([&] {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{65536, 65536};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 2;
    const std::string error = error_of([&] { save_safetensors(path, checkpoint(2.0f, 1 << 20)); });
    return error == path.string() +
                        ": write failed after 65536 bytes (File too large); the previous file is "
                        "intact"
               ? 0
               : 1;
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  check_contents(load_safetensors(path), previous);
  CHECK(dir.others("ckpt.safetensors").empty());
}

TEST_CASE("atomic save: a writer killed mid-write leaves the previous checkpoint loadable") {
  TempDir dir;
  const fs::path path = dir.file("ckpt.safetensors");
  const Named previous = checkpoint(1.0f, 1000);
  save_safetensors(path, previous);
  const std::string prefix = atomic_temp_prefix(path);
  constexpr std::int64_t kElements = 50'000'000;  // 200 MB of f32
  constexpr std::uintmax_t kBytes = kElements * 4;
  int killed_mid_write = 0;
  // Kill as the temp file appears, part-way through, and once all the data is written (during
  // fsync).
  for (std::uintmax_t at : {std::uintmax_t{0}, kBytes / 4, kBytes / 2, kBytes}) {
    INFO("kill once the temp file holds ", at, " bytes");
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      try {
        save_safetensors(path, checkpoint(2.0f, kElements));
      } catch (...) {
        ::_exit(1);
      }
      ::_exit(0);
    }
    bool landed = false;
    int status = 0;
    bool finished = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!landed && !finished && std::chrono::steady_clock::now() < deadline) {
      for (const auto& e : fs::directory_iterator(dir.path())) {
        std::error_code ec;
        const std::uintmax_t size = fs::file_size(e.path(), ec);
        if (!ec && e.path().filename().string().starts_with(prefix) &&
            size >= std::max<std::uintmax_t>(at, 1)) {
          landed = ::kill(pid, SIGKILL) == 0;
          break;
        }
      }
      finished = !landed && ::waitpid(pid, &status, WNOHANG) == pid;  // it finished first
    }
    if (!finished) {
      ::kill(pid, SIGKILL);
      REQUIRE(::waitpid(pid, &status, 0) == pid);
    }
    const SafetensorsFile file = load_safetensors(path);  // loadable whatever happened
    if (landed && WIFSIGNALED(status) && same_tensor(file.tensors.at("w"), previous[0].second)) {
      ++killed_mid_write;
      check_contents(file, previous);
    }
    // A killed writer cannot remove its temp file; the next save does not trip over it.
    for (const std::string& name : dir.others("ckpt.safetensors")) fs::remove(dir.file(name));
    save_safetensors(path, previous);
  }
  MESSAGE(killed_mid_write, " of 4 kills landed mid-write");
  CHECK(killed_mid_write >= 2);
}

TEST_CASE("atomic save: an unwritable place is a kiln::Error and loses nothing") {
  TempDir dir;
  const Named previous = checkpoint(1.0f, 10);
  // No such directory; a path through a regular file; a directory as the target.
  const fs::path missing = dir.file("no_dir") / "ckpt.safetensors";
  CHECK(error_of([&] { save_safetensors(missing, previous); }) ==
        fmt::format(
            "{}: cannot create a temporary file in {} to write it (No such file or directory)",
            missing.string(), missing.parent_path().string()));
  write_bytes(dir.file("plain"), {1});
  CHECK(error_of([&] {
          save_safetensors(dir.file("plain") / "x.safetensors", previous);
        }).find("(Not a directory)") != std::string::npos);
  fs::create_directory(dir.file("taken"));
  CHECK(error_of([&] { save_safetensors(dir.file("taken"), previous); }) ==
        dir.file("taken").string() +
            ": exists and is a directory; refusing to replace it with a file");
  CHECK(dir.others("").size() == 2);  // "plain" and "taken": no temp file left

  // A read-only directory holding a good checkpoint. Root ignores permissions, so the save then
  // runs in a child that has dropped to user nobody.
  const fs::path ro = dir.file("ro");
  fs::create_directory(ro);
  const fs::path path = ro / "ckpt.safetensors";
  save_safetensors(path, previous);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                          fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  fs::permissions(dir.path(), fs::perms::others_exec, fs::perm_options::add);
  const int status = in_child([&] {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) return 2;
    const std::string error = error_of([&] { save_safetensors(path, checkpoint(2.0f, 10)); });
    return error == fmt::format(
                        "{}: cannot create a temporary file in {} to write it (Permission denied)",
                        path.string(), ro.string())
               ? 0
               : 1;
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  fs::permissions(ro, fs::perms::owner_all, fs::perm_options::add);
  check_contents(load_safetensors(path), previous);
  CHECK(std::distance(fs::directory_iterator(ro), fs::directory_iterator()) ==
        1);  // no temp file left
}

TEST_CASE(
    "atomic save: a failing writer callback removes the temp file, the mode of the old file is "
    "kept") {
  TempDir dir;
  const fs::path path = dir.file("data.bin");
  const Bytes old = {1, 2, 3};
  write_file_atomically(path, old);
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
  const auto failing = [](AtomicFileSink& sink) {
    sink.write(Bytes{9, 9});
    throw Error("the writer gave up");
  };
  CHECK_THROWS_WITH_AS(write_file_atomically(path, failing), "the writer gave up", Error);
  CHECK(read_bytes(path) == old);
  CHECK(dir.others("data.bin").empty());
  write_file_atomically(path, Bytes{4, 5});
  CHECK(read_bytes(path) == Bytes{4, 5});
  CHECK(fs::status(path).permissions() == (fs::perms::owner_read | fs::perms::owner_write));
}

}  // namespace
}  // namespace kiln
