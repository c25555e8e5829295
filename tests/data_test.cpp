// IDX reading and writing (plain and gzip, every kind of malformed file), Fashion-MNIST
// loading and its validation, synthetic data, and the seeded batcher.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <unistd.h>

#include "models/dataset.h"
#include "models/idx.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<unsigned char>;

// A fresh directory under the system temp directory, removed with everything in it on scope exit.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    for (int attempt = 0;; ++attempt) {
      path_ =
          fs::temp_directory_path() / ("kiln_data_test_" + std::to_string(::getpid()) + "_" +
                                       std::to_string(counter++) + "_" + std::to_string(attempt));
      if (fs::create_directory(path_)) break;
      REQUIRE(attempt < 100);
    }
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void write_bytes(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  REQUIRE(out.good());
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Writes `bytes` gzip-compressed to `path` through zlib.
void write_gzip(const std::string& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb9");
  REQUIRE(f != nullptr);
  const int written = gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  const int closed = gzclose(f);
  REQUIRE(written == static_cast<int>(bytes.size()));
  REQUIRE(closed == Z_OK);
}

// An IDX header: 00 00 <type code> <rank>, then each dimension big-endian.
Bytes idx_header(unsigned char code, const std::vector<std::uint32_t>& dims) {
  Bytes h = {0, 0, code, static_cast<unsigned char>(dims.size())};
  for (std::uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8)
      h.push_back(static_cast<unsigned char>(d >> shift));
  return h;
}

// A plain u8 IDX file: the header for `dims` followed by `data`.
Bytes idx_u8(const std::vector<std::uint32_t>& dims, const Bytes& data) {
  Bytes b = idx_header(0x08, dims);
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

Bytes pattern(std::size_t n, unsigned seed = 7) {
  Bytes b(n);
  for (std::size_t i = 0; i < n; ++i)
    b[i] = static_cast<unsigned char>((i * 31u + seed * 17u + (i / 97u) * 5u) % 251u);
  return b;
}

// Pseudo-random bytes of 16 values: deflate codes them with real Huffman blocks (neither stored
// nor one long run), so a corrupted stream exercises the decoder.
Bytes noisy(std::size_t n, std::uint32_t seed) {
  Bytes b(n);
  for (std::size_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    b[i] = static_cast<unsigned char>((seed >> 24) & 0x0F);
  }
  return b;
}

// Tensors are equal in shape, dtype and every byte (so NaN payloads and -0 count).
void check_identical(const Tensor& got, const Tensor& want) {
  REQUIRE(got.dtype() == want.dtype());
  REQUIRE(got.shape() == want.shape());
  CHECK(std::memcmp(got.raw(), want.raw(), want.nbytes()) == 0);
  for (std::int64_t i = 0; i < std::min<std::int64_t>(want.numel(), 64); ++i) {
    const double a = got.at(i), b = want.at(i);
    if (!(std::isnan(a) && std::isnan(b))) CHECK(a == b);
  }
}

// Runs `f`, which must throw kiln::Error; returns its message (a failed check, and a
// placeholder the caller's checks will not match, otherwise).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL_CHECK("expected kiln::Error but got another exception: " << e.what());
    return "<not a kiln::Error>";
  }
  FAIL_CHECK("expected kiln::Error but nothing was thrown");
  return "<nothing thrown>";
}

void check_idx_error(const std::string& path, const std::string& word) {
  const std::string message = error_of([&] { (void)read_idx(path); });
  INFO("message: " << message);
  CHECK(message.find(path) != std::string::npos);
  CHECK(message.find(word) != std::string::npos);
}

// A labelled dataset whose example i has label i and every pixel equal to i, so a batch tells
// which examples it holds.
Dataset indexed_dataset(std::int64_t n) {
  Dataset d{Tensor::empty({n, 1, 2, 3}, DType::f32), Tensor::empty({n}, DType::i64)};
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < 6; ++j) d.images.data<float>()[i * 6 + j] = static_cast<float>(i);
    d.labels.data<std::int64_t>()[i] = i;
  }
  return d;
}

// The example indices of one whole epoch, batch after batch; checks images match labels.
std::vector<std::int64_t> epoch_order(Batcher& batcher, std::int64_t epoch, std::int64_t batch) {
  batcher.start_epoch(epoch);
  Tensor images = Tensor::empty({batch, 1, 2, 3}, DType::f32);
  Tensor labels = Tensor::empty({batch}, DType::i64);
  std::vector<std::int64_t> order;
  for (std::int64_t b = 0; b < batcher.batches_per_epoch(); ++b) {
    batcher.fill(b, images, labels);
    for (std::int64_t i = 0; i < batch; ++i) {
      const std::int64_t label = labels.data<std::int64_t>()[i];
      for (std::int64_t j = 0; j < 6; ++j)
        REQUIRE(images.data<float>()[i * 6 + j] == static_cast<float>(label));
      order.push_back(label);
    }
  }
  return order;
}

bool fashion_mnist_present() {
  if (fs::is_directory(kFashionMnistDir)) return true;
  MESSAGE("skipped: " << kFashionMnistDir << " does not exist (install dataset-fashion-mnist)");
  return false;
}

}  // namespace

// --- IDX round trips ------------------------------------------------------------------------

TEST_CASE("write_idx then read_idx round-trips u8, i32, f32 and f64 exactly") {
  TempDir dir;
  SUBCASE("u8 rank 3") {
    const Bytes values = pattern(4 * 5 * 6);
    Tensor t = Tensor::empty({4, 5, 6}, DType::u8);
    std::memcpy(t.raw(), values.data(), values.size());
    t.data<std::uint8_t>()[0] = 0;
    t.data<std::uint8_t>()[1] = 255;
    write_idx(dir.file("u8.idx"), t);
    check_identical(read_idx(dir.file("u8.idx")), t);
  }
  SUBCASE("i32 rank 1 with extremes") {
    const std::vector<std::int32_t> v = {0,
                                         1,
                                         -1,
                                         0x01020304,
                                         std::numeric_limits<std::int32_t>::min(),
                                         std::numeric_limits<std::int32_t>::max(),
                                         -123456789};
    const Tensor t = Tensor::from_vector<std::int32_t>({static_cast<std::int64_t>(v.size())}, v);
    write_idx(dir.file("i32.idx"), t);
    check_identical(read_idx(dir.file("i32.idx")), t);
  }
  SUBCASE("f32 rank 2 with specials") {
    const std::vector<float> v = {0.0f,
                                  -0.0f,
                                  1.5f,
                                  -3.25e-38f,
                                  1e-45f,
                                  std::numeric_limits<float>::infinity(),
                                  -std::numeric_limits<float>::infinity(),
                                  std::numeric_limits<float>::quiet_NaN(),
                                  3.14159265f,
                                  std::numeric_limits<float>::max(),
                                  1e30f,
                                  -7.0f};
    const Tensor t = Tensor::from_vector<float>({3, 4}, v);
    write_idx(dir.file("f32.idx"), t);
    check_identical(read_idx(dir.file("f32.idx")), t);
  }
  SUBCASE("f64 rank 4") {
    std::vector<double> v(2 * 3 * 1 * 5);
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = std::pow(-1.7, static_cast<double>(i)) / 3.0 + 1e-300 * static_cast<double>(i);
    v[3] = std::numeric_limits<double>::denorm_min();
    const Tensor t = Tensor::from_vector<double>({2, 3, 1, 5}, v);
    write_idx(dir.file("f64.idx"), t);
    check_identical(read_idx(dir.file("f64.idx")), t);
  }
}

TEST_CASE("write_idx writes the big-endian IDX layout") {
  TempDir dir;
  const Tensor t = Tensor::from_vector<std::int32_t>({1, 2}, {0x01020304, -2});
  write_idx(dir.file("i32.idx"), t);
  const Bytes want = {0x00, 0x00, 0x0C, 0x02,   // magic: i32, rank 2
                      0x00, 0x00, 0x00, 0x01,   // dim 0
                      0x00, 0x00, 0x00, 0x02,   // dim 1
                      0x01, 0x02, 0x03, 0x04,   // 0x01020304
                      0xFF, 0xFF, 0xFF, 0xFE};  // -2
  CHECK(read_bytes(dir.file("i32.idx")) == want);

  // And a hand-written big-endian f32 file reads as the right value.
  Bytes f = idx_header(0x0D, {1});
  f.insert(f.end(), {0x3F, 0xC0, 0x00, 0x00});  // 1.5f
  write_bytes(dir.file("f32.idx"), f);
  const Tensor r = read_idx(dir.file("f32.idx"));
  CHECK(r.dtype() == DType::f32);
  CHECK(r.shape() == Shape{1});
  CHECK(r.data<float>()[0] == 1.5f);
}

TEST_CASE("write_idx rejects dtypes IDX cannot hold and unwritable paths") {
  TempDir dir;
  const std::string i64_message =
      error_of([&] { write_idx(dir.file("i64.idx"), Tensor::zeros({2}, DType::i64)); });
  CHECK(i64_message.find("i64") != std::string::npos);
  const std::string bad = dir.file("no/such/subdir/x.idx");
  const std::string open_message = error_of([&] { write_idx(bad, Tensor::zeros({2}, DType::u8)); });
  CHECK(open_message.find(bad) != std::string::npos);
}

TEST_CASE("a gzip-compressed IDX file reads back equal") {
  TempDir dir;
  Tensor t = Tensor::empty({7, 28, 28}, DType::u8);
  const Bytes values = pattern(static_cast<std::size_t>(t.numel()), 3);
  std::memcpy(t.raw(), values.data(), values.size());
  write_idx(dir.file("images.idx"), t);
  write_gzip(dir.file("images.idx.gz"), read_bytes(dir.file("images.idx")));
  // The compressed file really is gzip, not a copy.
  const Bytes gz = read_bytes(dir.file("images.idx.gz"));
  REQUIRE(gz.size() > 2);
  CHECK(gz[0] == 0x1f);
  CHECK(gz[1] == 0x8b);
  check_identical(read_idx(dir.file("images.idx.gz")), t);

  // f64 through gzip too (the byte swap after decompression).
  const Tensor d = Tensor::from_vector<double>({2, 2}, {1.0, -2.5, 1e100, -0.0});
  write_idx(dir.file("d.idx"), d);
  write_gzip(dir.file("d.idx.gz"), read_bytes(dir.file("d.idx")));
  check_identical(read_idx(dir.file("d.idx.gz")), d);
}

// --- malformed IDX files ----------------------------------------------------------------------

TEST_CASE("read_idx: a missing file") {
  TempDir dir;
  check_idx_error(dir.file("absent-idx3-ubyte"), "no such file");
  // A directory is not a file either, nor is a FIFO (which must not block the reader).
  check_idx_error(dir.path().string(), "is a directory, not a regular file");
  REQUIRE(::mkfifo(dir.file("fifo-idx3-ubyte").c_str(), 0600) == 0);
  check_idx_error(dir.file("fifo-idx3-ubyte"), "is a FIFO, not a regular file");
}

TEST_CASE("read_idx: a truncated header") {
  TempDir dir;
  SUBCASE("empty file") {
    write_bytes(dir.file("empty"), {});
    check_idx_error(dir.file("empty"), "truncated");
  }
  SUBCASE("half a magic number") {
    write_bytes(dir.file("short"), {0x00, 0x00});
    check_idx_error(dir.file("short"), "truncated");
  }
  SUBCASE("rank 3 but only one dimension") {
    write_bytes(dir.file("dims"), {0x00, 0x00, 0x08, 0x03, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00});
    check_idx_error(dir.file("dims"), "truncated");
    const std::string message = error_of([&] { (void)read_idx(dir.file("dims")); });
    CHECK(message.find("dimensions") != std::string::npos);
  }
}

TEST_CASE("read_idx: truncated data") {
  TempDir dir;
  SUBCASE("u8") {
    write_bytes(dir.file("u8"), idx_u8({4, 5}, pattern(19)));  // one byte short
    check_idx_error(dir.file("u8"), "truncated");
    const std::string message = error_of([&] { (void)read_idx(dir.file("u8")); });
    INFO(message);
    CHECK(message.find("20") != std::string::npos);  // how many bytes the header promised
    CHECK(message.find("19") != std::string::npos);  // and how many arrived
  }
  SUBCASE("f64 with no data at all") {
    write_bytes(dir.file("f64"), idx_header(0x0E, {3}));
    check_idx_error(dir.file("f64"), "truncated");
  }
  SUBCASE("a gzip file that ends early") {
    write_idx(dir.file("full.idx"), Tensor::zeros({50, 50}, DType::i32));
    Bytes data = read_bytes(dir.file("full.idx"));
    data.resize(data.size() - 100);
    write_gzip(dir.file("short.idx.gz"), data);  // valid gzip, but the IDX inside is short
    check_idx_error(dir.file("short.idx.gz"), "truncated");
  }
}

TEST_CASE("read_idx: bad magic") {
  TempDir dir;
  write_bytes(dir.file("text"), {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', '\n'});
  check_idx_error(dir.file("text"), "not an IDX file");
  write_bytes(dir.file("one"), {0x00, 0x01, 0x08, 0x01, 0x00, 0x00, 0x00, 0x01, 0x05});
  check_idx_error(dir.file("one"), "not an IDX file");
  // Bad magic inside a valid gzip stream.
  write_gzip(dir.file("text.gz"), {'P', 'K', 3, 4, 0, 0, 0, 0, 0, 0});
  check_idx_error(dir.file("text.gz"), "not an IDX file");
}

TEST_CASE("read_idx: unsupported element types") {
  TempDir dir;
  for (unsigned char code : {0x00, 0x09, 0x0B, 0x0F, 0xFF}) {
    CAPTURE(static_cast<int>(code));
    Bytes b = idx_header(code, {2});
    b.insert(b.end(), 16, 0);
    write_bytes(dir.file("type"), b);
    check_idx_error(dir.file("type"), "unsupported");
  }
}

TEST_CASE("read_idx: rank 0 and absurd ranks") {
  TempDir dir;
  write_bytes(dir.file("rank0"), {0x00, 0x00, 0x08, 0x00, 0x01});
  check_idx_error(dir.file("rank0"), "rank");
  Bytes b = idx_header(0x08, {1, 1, 1, 1, 1, 1, 1, 1, 1});  // rank 9
  b.push_back(0);
  write_bytes(dir.file("rank9"), b);
  check_idx_error(dir.file("rank9"), "rank");
}

TEST_CASE("read_idx: a dimension of 0") {
  TempDir dir;
  write_bytes(dir.file("zero"), idx_header(0x08, {3, 0, 28}));
  check_idx_error(dir.file("zero"), "is 0");
  const std::string message = error_of([&] { (void)read_idx(dir.file("zero")); });
  CHECK(message.find("dimension 1") != std::string::npos);
  write_bytes(dir.file("zero1"), idx_header(0x0D, {0}));
  check_idx_error(dir.file("zero1"), "is 0");
}

TEST_CASE("read_idx: dimensions whose product overflows or is absurd") {
  TempDir dir;
  SUBCASE("product overflows 64 bits if multiplied naively") {
    write_bytes(dir.file("overflow"), idx_header(0x08, {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}));
    check_idx_error(dir.file("overflow"), "more than");
  }
  SUBCASE("a product that fits in 64 bits but is absurd") {
    write_bytes(dir.file("absurd"), idx_header(0x08, {60000, 60000, 28, 28}));
    check_idx_error(dir.file("absurd"), "more than");
  }
  SUBCASE("two dimensions of 2^16 and a third of 2") {
    write_bytes(dir.file("big"), idx_header(0x0D, {65536, 65536, 2}));
    check_idx_error(dir.file("big"), "more than");
  }
}

TEST_CASE("read_idx: trailing bytes after the data") {
  TempDir dir;
  Bytes b = idx_u8({2, 3}, pattern(6));
  b.push_back(0x42);
  write_bytes(dir.file("trailing"), b);
  check_idx_error(dir.file("trailing"), "trailing");
  // The same inside a gzip stream.
  write_gzip(dir.file("trailing.gz"), b);
  check_idx_error(dir.file("trailing.gz"), "trailing");
  // Without the extra byte the file is fine.
  b.pop_back();
  write_bytes(dir.file("exact"), b);
  CHECK(read_idx(dir.file("exact")).shape() == Shape{2, 3});
}

TEST_CASE("read_idx: a corrupt gzip stream throws kiln::Error, never crashes") {
  TempDir dir;
  Tensor t = Tensor::empty({40, 28, 28}, DType::u8);
  const Bytes values = noisy(static_cast<std::size_t>(t.numel()), 11);
  std::memcpy(t.raw(), values.data(), values.size());
  write_idx(dir.file("good.idx"), t);
  write_gzip(dir.file("good.idx.gz"), read_bytes(dir.file("good.idx")));
  const Bytes gz = read_bytes(dir.file("good.idx.gz"));
  REQUIRE(gz.size() > 64);
  check_identical(read_idx(dir.file("good.idx.gz")), t);

  SUBCASE("bytes flipped in the middle") {
    Bytes bad = gz;
    for (std::size_t i = bad.size() / 2; i < bad.size() / 2 + 8; ++i) bad[i] ^= 0xFF;
    write_bytes(dir.file("bad.idx.gz"), bad);
    const std::string message = error_of([&] { (void)read_idx(dir.file("bad.idx.gz")); });
    INFO(message);
    CHECK(message.find(dir.file("bad.idx.gz")) != std::string::npos);
    CHECK(message.find("corrupt") != std::string::npos);
  }
  SUBCASE("one byte flipped anywhere after the gzip header") {
    // Bytes 4..9 of the gzip header (mtime, flags, OS) may change without harm; every byte
    // after it is deflate data or the CRC-32 / length trailer, so any change must be caught.
    for (std::size_t i = 10; i < gz.size(); i += std::max<std::size_t>(1, gz.size() / 97)) {
      CAPTURE(i);
      Bytes bad = gz;
      bad[i] ^= 0x5A;
      write_bytes(dir.file("flip.idx.gz"), bad);
      const std::string message = error_of([&] { (void)read_idx(dir.file("flip.idx.gz")); });
      CHECK(message.find(dir.file("flip.idx.gz")) != std::string::npos);
    }
    for (std::size_t back = 1; back <= 8; ++back) {  // the trailer
      CAPTURE(back);
      Bytes bad = gz;
      bad[gz.size() - back] ^= 0x01;
      write_bytes(dir.file("trailer.idx.gz"), bad);
      const std::string message = error_of([&] { (void)read_idx(dir.file("trailer.idx.gz")); });
      CHECK(message.find(dir.file("trailer.idx.gz")) != std::string::npos);
    }
  }
  SUBCASE("the compressed stream cut short inside the deflate data") {
    for (std::size_t keep :
         {std::size_t{11}, std::size_t{40}, gz.size() / 3, gz.size() / 2, gz.size() - 64}) {
      CAPTURE(keep);
      write_bytes(dir.file("cut.idx.gz"),
                  Bytes(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(keep)));
      const std::string message = error_of([&] { (void)read_idx(dir.file("cut.idx.gz")); });
      INFO(message);
      CHECK(message.find(dir.file("cut.idx.gz")) != std::string::npos);
      CHECK((message.find("truncated") != std::string::npos ||
             message.find("corrupt") != std::string::npos));
    }
  }
}

TEST_CASE("read_idx: a gzip stream missing its CRC-32 / length trailer is caught") {
  // All the data decompresses, but the integrity check is gone: zlib's gzread reports this as
  // Z_BUF_ERROR "unexpected end of file" through gzerror, not as a -1 return.
  TempDir dir;
  Tensor t = Tensor::empty({5000}, DType::u8);
  const Bytes values = noisy(5000, 1);
  std::memcpy(t.raw(), values.data(), values.size());
  write_idx(dir.file("good.idx"), t);
  write_gzip(dir.file("good.idx.gz"), read_bytes(dir.file("good.idx")));
  const Bytes gz = read_bytes(dir.file("good.idx.gz"));
  for (std::size_t cut = 1; cut <= 8; ++cut) {  // every cut inside the 8-byte trailer
    CAPTURE(cut);
    write_bytes(dir.file("cut.idx.gz"),
                Bytes(gz.begin(), gz.end() - static_cast<std::ptrdiff_t>(cut)));
    const std::string message = error_of([&] { (void)read_idx(dir.file("cut.idx.gz")); });
    INFO(message);
    CHECK(message.find(dir.file("cut.idx.gz")) != std::string::npos);
    CHECK((message.find("truncated") != std::string::npos ||
           message.find("corrupt") != std::string::npos));
  }
}

TEST_CASE("read_idx: a gzip file whose header announces more images than it holds") {
  // 100,000 images announced, 1,000 present: within what the compressed size could hold, so
  // only reading finds the lie; the data is read in growing steps, not allocated up front.
  TempDir dir;
  Bytes b = idx_header(0x08, {100000, 28, 28});
  const Bytes images = noisy(1000 * 28 * 28, 5);
  b.insert(b.end(), images.begin(), images.end());
  write_gzip(dir.file("lying.idx.gz"), b);
  const std::string message = error_of([&] { (void)read_idx(dir.file("lying.idx.gz")); });
  INFO(message);
  CHECK(message.find(dir.file("lying.idx.gz")) != std::string::npos);
  CHECK(message.find("truncated") != std::string::npos);
  CHECK(message.find("78400000") != std::string::npos);  // what the header announced
}

TEST_CASE("read_idx: a tiny file whose header promises gigabytes fails naming the file") {
  // 2^32 - 1 f64 elements (32 GiB) in an 8-byte file: within the element limit, but the error
  // must still say which file is wrong rather than only that memory ran out.
  TempDir dir;
  write_bytes(dir.file("huge"), idx_header(0x0E, {0xFFFFFFFFu}));
  const std::string message = error_of([&] { (void)read_idx(dir.file("huge")); });
  INFO(message);
  CHECK(message.find(dir.file("huge")) != std::string::npos);
}

// --- Fashion-MNIST ------------------------------------------------------------------------------

TEST_CASE("load_fashion_mnist: the real train split") {
  if (!fashion_mnist_present()) return;
  const Dataset d = load_fashion_mnist(kFashionMnistDir, Split::train);
  CHECK(d.size() == 60000);
  CHECK(d.images.dtype() == DType::f32);
  CHECK(d.images.shape() == Shape{60000, 1, 28, 28});
  CHECK(d.labels.dtype() == DType::i64);
  CHECK(d.labels.shape() == Shape{60000});
  std::vector<std::int64_t> per_class(10, 0);
  bool in_range = true;
  for (std::int64_t i = 0; i < d.size(); ++i) {
    const std::int64_t l = d.labels.data<std::int64_t>()[i];
    if (l < 0 || l >= 10) {
      in_range = false;
      continue;
    }
    ++per_class[static_cast<std::size_t>(l)];
  }
  CHECK(in_range);
  for (std::int64_t count : per_class) CHECK(count == 6000);  // Fashion-MNIST is balanced

  double sum = 0, sum_sq = 0;
  const float* px = d.images.data<float>();
  for (std::int64_t i = 0; i < d.images.numel(); ++i) {
    sum += px[i];
    sum_sq += static_cast<double>(px[i]) * px[i];
  }
  const double n = static_cast<double>(d.images.numel());
  const double mean = sum / n;
  const double stddev = std::sqrt(sum_sq / n - mean * mean);
  INFO("mean " << mean << ", std " << stddev);
  CHECK(std::abs(mean) < 0.05);
  CHECK(std::abs(stddev - 1.0) < 0.1);
}

TEST_CASE("load_fashion_mnist: the real test split") {
  if (!fashion_mnist_present()) return;
  const Dataset d = load_fashion_mnist(kFashionMnistDir, Split::test);
  CHECK(d.size() == 10000);
  CHECK(d.images.shape() == Shape{10000, 1, 28, 28});
  CHECK(d.images.dtype() == DType::f32);
  CHECK(d.labels.dtype() == DType::i64);
  std::vector<std::int64_t> per_class(10, 0);
  for (std::int64_t i = 0; i < d.size(); ++i) {
    const std::int64_t l = d.labels.data<std::int64_t>()[i];
    REQUIRE(l >= 0);
    REQUIRE(l < 10);
    ++per_class[static_cast<std::size_t>(l)];
  }
  for (std::int64_t count : per_class) CHECK(count == 1000);
}

TEST_CASE("load_fashion_mnist: a directory that does not exist") {
  TempDir tmp;
  const std::string dir = tmp.file("nowhere");
  const std::string message = error_of([&] { (void)load_fashion_mnist(dir, Split::train); });
  INFO(message);
  CHECK(message.find(dir) != std::string::npos);
  CHECK(message.find("does not exist") != std::string::npos);
}

TEST_CASE("load_fashion_mnist: small hand-made directories") {
  TempDir dir;
  const std::string images = dir.file("train-images-idx3-ubyte");
  const std::string labels = dir.file("train-labels-idx1-ubyte");
  Bytes pixels = pattern(3 * 28 * 28, 5);
  pixels[0] = 0;
  pixels[1] = 255;

  SUBCASE("only the images file: the error names the labels file") {
    write_bytes(images, idx_u8({3, 28, 28}, pixels));
    const std::string message =
        error_of([&] { (void)load_fashion_mnist(dir.path().string(), Split::train); });
    INFO(message);
    CHECK(message.find("train-labels-idx1-ubyte") != std::string::npos);
    CHECK(message.find(dir.path().string()) != std::string::npos);
  }
  SUBCASE("only train files: the test split names the t10k images file") {
    write_bytes(images, idx_u8({3, 28, 28}, pixels));
    write_bytes(labels, idx_u8({3}, {0, 1, 2}));
    const std::string message =
        error_of([&] { (void)load_fashion_mnist(dir.path().string(), Split::test); });
    INFO(message);
    CHECK(message.find("t10k-images-idx3-ubyte") != std::string::npos);
  }
  SUBCASE("a valid plain directory loads and normalises") {
    write_bytes(images, idx_u8({3, 28, 28}, pixels));
    write_bytes(labels, idx_u8({3}, {9, 0, 4}));
    const Dataset d = load_fashion_mnist(dir.path().string(), Split::train);
    CHECK(d.images.shape() == Shape{3, 1, 28, 28});
    REQUIRE(d.labels.shape() == Shape{3});
    CHECK(d.labels.data<std::int64_t>()[0] == 9);
    CHECK(d.labels.data<std::int64_t>()[1] == 0);
    CHECK(d.labels.data<std::int64_t>()[2] == 4);
    const float* px = d.images.data<float>();
    for (std::size_t i : {std::size_t{0}, std::size_t{1}, std::size_t{100}, pixels.size() - 1}) {
      CAPTURE(i);
      const double want = (pixels[i] / 255.0 - 0.2860) / 0.3530;
      CHECK(px[i] == doctest::Approx(want).epsilon(1e-5));
    }
  }
  SUBCASE("gzip files are preferred over plain ones") {
    write_bytes(images, idx_u8({3, 28, 28}, pixels));
    write_bytes(labels, {0xde, 0xad});  // broken plain labels, shadowed by the .gz
    write_gzip(labels + ".gz", idx_u8({3}, {1, 2, 3}));
    const Dataset d = load_fashion_mnist(dir.path().string(), Split::train);
    CHECK(d.labels.data<std::int64_t>()[2] == 3);
  }
  SUBCASE("a label outside [0, 10)") {
    write_bytes(images, idx_u8({3, 28, 28}, pixels));
    write_bytes(labels, idx_u8({3}, {1, 12, 3}));
    const std::string message =
        error_of([&] { (void)load_fashion_mnist(dir.path().string(), Split::train); });
    INFO(message);
    CHECK(message.find("label 12") != std::string::npos);
    CHECK(message.find(labels) != std::string::npos);
    CHECK(message.find("index 1") != std::string::npos);
  }
  SUBCASE("images and labels disagree on the count") {
    write_bytes(images, idx_u8({3, 28, 28}, pixels));
    write_bytes(labels, idx_u8({2}, {1, 2}));
    const std::string message =
        error_of([&] { (void)load_fashion_mnist(dir.path().string(), Split::train); });
    INFO(message);
    CHECK(message.find("3 images") != std::string::npos);
    CHECK(message.find("2 labels") != std::string::npos);
  }
  SUBCASE("images of the wrong size") {
    write_bytes(images, idx_u8({3, 28, 27}, pattern(3 * 28 * 27)));
    write_bytes(labels, idx_u8({3}, {1, 2, 3}));
    const std::string message =
        error_of([&] { (void)load_fashion_mnist(dir.path().string(), Split::train); });
    INFO(message);
    CHECK(message.find(images) != std::string::npos);
    CHECK(message.find("[3, 28, 27]") != std::string::npos);
  }
  SUBCASE("labels of the wrong dtype") {
    write_bytes(images, idx_u8({3, 28, 28}, pixels));
    write_idx(labels, Tensor::from_vector<std::int32_t>({3}, {1, 2, 3}));
    const std::string message =
        error_of([&] { (void)load_fashion_mnist(dir.path().string(), Split::train); });
    INFO(message);
    CHECK(message.find(labels) != std::string::npos);
    CHECK(message.find("i32") != std::string::npos);
  }
  SUBCASE("a malformed images file is named") {
    write_bytes(images, {'g', 'a', 'r', 'b', 'a', 'g', 'e', '!', '!'});
    write_bytes(labels, idx_u8({3}, {1, 2, 3}));
    const std::string message =
        error_of([&] { (void)load_fashion_mnist(dir.path().string(), Split::train); });
    INFO(message);
    CHECK(message.find(images) != std::string::npos);
    CHECK(message.find("not an IDX file") != std::string::npos);
  }
}

// --- synthetic data and the batcher -------------------------------------------------------------

TEST_CASE("synthetic_images: shape, label range and seeding") {
  const Dataset a = synthetic_images(200, {1, 28, 28}, 10, 42);
  const Dataset b = synthetic_images(200, {1, 28, 28}, 10, 42);
  const Dataset c = synthetic_images(200, {1, 28, 28}, 10, 43);
  CHECK(a.size() == 200);
  CHECK(a.images.shape() == Shape{200, 1, 28, 28});
  CHECK(a.images.dtype() == DType::f32);
  CHECK(a.labels.dtype() == DType::i64);
  std::vector<int> seen(10, 0);
  for (std::int64_t i = 0; i < a.size(); ++i) {
    const std::int64_t l = a.labels.data<std::int64_t>()[i];
    REQUIRE(l >= 0);
    REQUIRE(l < 10);
    seen[static_cast<std::size_t>(l)] = 1;
  }
  CHECK(std::accumulate(seen.begin(), seen.end(), 0) == 10);
  CHECK(std::memcmp(a.images.raw(), b.images.raw(), a.images.nbytes()) == 0);
  CHECK(std::memcmp(a.labels.raw(), b.labels.raw(), a.labels.nbytes()) == 0);
  CHECK(std::memcmp(a.images.raw(), c.images.raw(), a.images.nbytes()) != 0);
}

TEST_CASE("Batcher: the same seed and epoch give the same batches") {
  const Dataset d = indexed_dataset(48);
  Batcher a(d, 8, true, 1234);
  Batcher b(d, 8, true, 1234);
  CHECK(epoch_order(a, 3, 8) == epoch_order(b, 3, 8));
  // Also on the synthetic data, comparing the batch contents byte for byte.
  const Dataset s = synthetic_images(64, {1, 28, 28}, 10, 5);
  Batcher sa(s, 16, true, 99), sb(s, 16, true, 99);
  sa.start_epoch(2);
  sb.start_epoch(2);
  Tensor ia = Tensor::empty({16, 1, 28, 28}, DType::f32),
         ib = Tensor::empty({16, 1, 28, 28}, DType::f32);
  Tensor la = Tensor::empty({16}, DType::i64), lb = Tensor::empty({16}, DType::i64);
  for (std::int64_t i = 0; i < sa.batches_per_epoch(); ++i) {
    sa.fill(i, ia, la);
    sb.fill(i, ib, lb);
    CHECK(std::memcmp(ia.raw(), ib.raw(), ia.nbytes()) == 0);
    CHECK(std::memcmp(la.raw(), lb.raw(), la.nbytes()) == 0);
  }
  // Restarting an epoch on the same batcher gives it again (resumable).
  Batcher c(d, 8, true, 1234);
  const std::vector<std::int64_t> first = epoch_order(c, 1, 8);
  (void)epoch_order(c, 2, 8);
  CHECK(epoch_order(c, 1, 8) == first);
}

TEST_CASE("Batcher: different epochs and seeds give different orders") {
  const Dataset d = indexed_dataset(48);
  Batcher b(d, 8, true, 1234);
  const std::vector<std::int64_t> e1 = epoch_order(b, 1, 8);
  const std::vector<std::int64_t> e2 = epoch_order(b, 2, 8);
  const std::vector<std::int64_t> e3 = epoch_order(b, 3, 8);
  CHECK(e1 != e2);
  CHECK(e2 != e3);
  CHECK(e1 != e3);
  std::vector<std::int64_t> identity(48);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(e1 != identity);
  Batcher other(d, 8, true, 4321);
  CHECK(epoch_order(other, 1, 8) != e1);
  // Without shuffling every epoch is in order.
  Batcher plain(d, 8, false, 1234);
  CHECK(epoch_order(plain, 1, 8) == identity);
  CHECK(epoch_order(plain, 7, 8) == identity);
}

TEST_CASE("Batcher: every example appears exactly once per epoch") {
  SUBCASE("batch divides N") {
    const Dataset d = indexed_dataset(48);
    Batcher b(d, 8, true, 7);
    CHECK(b.batches_per_epoch() == 6);
    std::vector<std::int64_t> identity(48);
    std::iota(identity.begin(), identity.end(), 0);
    for (std::int64_t epoch = 1; epoch <= 4; ++epoch) {
      CAPTURE(epoch);
      std::vector<std::int64_t> order = epoch_order(b, epoch, 8);
      REQUIRE(order.size() == 48);
      std::sort(order.begin(), order.end());
      CHECK(order == identity);
    }
  }
  SUBCASE("batch does not divide N: the tail is dropped, no example repeats") {
    const Dataset d = indexed_dataset(50);
    Batcher b(d, 8, true, 7);
    CHECK(b.batches_per_epoch() == 6);
    std::vector<std::int64_t> order = epoch_order(b, 1, 8);
    REQUIRE(order.size() == 48);
    std::sort(order.begin(), order.end());
    CHECK(std::adjacent_find(order.begin(), order.end()) == order.end());
    CHECK(order.front() >= 0);
    CHECK(order.back() < 50);
  }
  SUBCASE("batch equal to N") {
    const Dataset d = indexed_dataset(16);
    Batcher b(d, 16, true, 3);
    CHECK(b.batches_per_epoch() == 1);
    std::vector<std::int64_t> order = epoch_order(b, 1, 16);
    std::sort(order.begin(), order.end());
    std::vector<std::int64_t> identity(16);
    std::iota(identity.begin(), identity.end(), 0);
    CHECK(order == identity);
  }
}

TEST_CASE("Batcher: a batch larger than the dataset, or not positive, throws") {
  const Dataset d = indexed_dataset(10);
  const std::string larger = error_of([&] { Batcher b(d, 11, true, 0); });
  INFO(larger);
  CHECK(larger.find("11") != std::string::npos);
  CHECK(larger.find("10 examples") != std::string::npos);
  CHECK_THROWS_WITH_AS(Batcher(d, 0, true, 0), doctest::Contains("must be positive"), Error);
  CHECK_THROWS_WITH_AS(Batcher(d, -4, false, 0), doctest::Contains("-4"), Error);
}

}  // namespace kiln
