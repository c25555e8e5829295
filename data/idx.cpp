// IDX reading through zlib (gzread reads plain files unchanged), validating every size
// before it is used.
#include "data/idx.h"

#include <zlib.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>

namespace kiln {
namespace {

constexpr std::int64_t kMaxElements = std::int64_t{1}
                                      << 32;  // 4 Gi elements: far above any IDX dataset

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

// zlib's description of the last error, without the path it prefixes.
std::string zlib_message(gzFile f, const std::string& path) {
  int code = 0;
  std::string message = gzerror(f, &code);
  if (message.starts_with(path + ": ")) message.erase(0, path.size() + 2);
  return message;
}

// Deflate compresses at most 1032:1, so a gzip file of n bytes holds at most ~1032 n bytes.
constexpr std::uint64_t kMaxDeflateRatio = 1032;

// Reads exactly `bytes` bytes or throws, saying how many arrived.
void read_exact(gzFile f, void* out, std::size_t bytes, const std::string& path, const char* what) {
  auto* dst = static_cast<unsigned char*>(out);
  std::size_t done = 0;
  while (done < bytes) {
    const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(bytes - done, 1u << 30));
    const int got = gzread(f, dst + done, chunk);
    if (got < 0)
      throw Error(fmt::format("{}: corrupt compressed data while reading the {} ({})", path, what,
                              zlib_message(f, path)));
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  KILN_CHECK(done == bytes, "{}: truncated: the {} needs {} bytes but only {} are present", path,
             what, bytes, done);
}

DType idx_dtype(unsigned char code, const std::string& path) {
  switch (code) {
    case 0x08:
      return DType::u8;
    case 0x0C:
      return DType::i32;
    case 0x0D:
      return DType::f32;
    case 0x0E:
      return DType::f64;
    default:
      break;
  }
  throw Error(fmt::format(
      "{}: unsupported IDX element type 0x{:02x} (u8 0x08, i32 0x0c, f32 0x0d, f64 0x0e)", path,
      code));
}

unsigned char idx_code(DType dtype) {
  switch (dtype) {
    case DType::u8:
      return 0x08;
    case DType::i32:
      return 0x0C;
    case DType::f32:
      return 0x0D;
    case DType::f64:
      return 0x0E;
    default:
      break;
  }
  throw Error(fmt::format("write_idx: dtype {} has no IDX code", dtype_name(dtype)));
}

// IDX stores multi-byte elements big-endian.
void swap_to_host(Tensor& t) {
  const std::size_t width = dtype_size(t.dtype());
  if (width == 1) return;
  auto* bytes = static_cast<unsigned char*>(t.raw());
  for (std::int64_t i = 0; i < t.numel(); ++i)
    std::reverse(bytes + i * static_cast<std::int64_t>(width),
                 bytes + (i + 1) * static_cast<std::int64_t>(width));
}

}  // namespace

Tensor read_idx(const std::string& path) {
  KILN_CHECK(std::filesystem::is_regular_file(path), "{}: no such file", path);
  GzFile file(gzopen(path.c_str(), "rb"));
  KILN_CHECK(file != nullptr, "{}: cannot open for reading", path);
  std::array<unsigned char, 4> magic{};
  read_exact(file.get(), magic.data(), magic.size(), path, "header");
  KILN_CHECK(magic[0] == 0 && magic[1] == 0,
             "{}: not an IDX file (magic bytes {:02x} {:02x}, expected 00 00)", path, magic[0],
             magic[1]);
  const DType dtype = idx_dtype(magic[2], path);
  const int rank = magic[3];
  KILN_CHECK(rank >= 1 && rank <= 8, "{}: IDX rank {} (1 to 8 supported)", path, rank);

  std::vector<std::int64_t> dims(static_cast<std::size_t>(rank));
  std::int64_t numel = 1;
  for (int d = 0; d < rank; ++d) {
    std::array<unsigned char, 4> be{};
    read_exact(file.get(), be.data(), be.size(), path, "dimensions");
    const std::int64_t dim = (std::int64_t{be[0]} << 24) | (std::int64_t{be[1]} << 16) |
                             (std::int64_t{be[2]} << 8) | be[3];
    KILN_CHECK(dim > 0, "{}: dimension {} is 0", path, d);
    KILN_CHECK(numel <= kMaxElements / dim, "{}: dimensions give more than {} elements", path,
               kMaxElements);
    numel *= dim;
    dims[static_cast<std::size_t>(d)] = dim;
  }

  // Before allocating: could the file hold the data its header announces?
  const std::uint64_t data_bytes = static_cast<std::uint64_t>(numel) * dtype_size(dtype);
  const std::uint64_t file_bytes = std::filesystem::file_size(path);
  const std::uint64_t capacity = gzdirect(file.get()) ? file_bytes : file_bytes * kMaxDeflateRatio;
  KILN_CHECK(data_bytes <= capacity,
             "{}: truncated: the header announces {} bytes of data but the file has {} bytes", path,
             data_bytes, file_bytes);

  Tensor t;
  try {
    t = Tensor::empty(Shape(dims), dtype);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", path, e.what()));
  }
  read_exact(file.get(), t.raw(), t.nbytes(), path, "data");
  unsigned char extra = 0;
  const int more = gzread(file.get(), &extra, 1);
  KILN_CHECK(more == 0, "{}: {} after the {} bytes of data that the header announces", path,
             more < 0 ? "corrupt compressed data" : "trailing bytes", t.nbytes());
  // A gzip stream cut before its CRC/length trailer ends "cleanly" with Z_BUF_ERROR.
  int code = Z_OK;
  gzerror(file.get(), &code);
  KILN_CHECK(code == Z_OK || code == Z_STREAM_END, "{}: truncated or corrupt compressed data ({})",
             path, zlib_message(file.get(), path));
  swap_to_host(t);
  return t;
}

void write_idx(const std::string& path, const Tensor& t) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "wb"), std::fclose);
  KILN_CHECK(f != nullptr, "{}: cannot open for writing", path);
  std::vector<unsigned char> header = {0, 0, idx_code(t.dtype()),
                                       static_cast<unsigned char>(t.shape().rank())};
  for (std::int64_t d : t.shape().dims())
    for (int shift = 24; shift >= 0; shift -= 8)
      header.push_back(static_cast<unsigned char>(d >> shift));
  Tensor data = t.clone();
  swap_to_host(data);  // host to big-endian is the same byte swap
  const bool ok = std::fwrite(header.data(), 1, header.size(), f.get()) == header.size() &&
                  std::fwrite(data.raw(), 1, data.nbytes(), f.get()) == data.nbytes();
  KILN_CHECK(ok, "{}: write failed", path);
}

}  // namespace kiln
