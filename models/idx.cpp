// IDX reading: plain files directly, gzip files through zlib's inflate, which checks the
// stream's end, its CRC-32 and its length; every size is validated before it is used.
#include "models/idx.h"

#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/input_file.h"

namespace kiln {
namespace {

constexpr std::int64_t kMaxElements = std::int64_t{1} << 32;  // 4 Gi: far above any IDX set

// Deflate compresses at most 1032:1, so a gzip file of n bytes holds at most ~1032 n bytes.
constexpr std::uint64_t kMaxDeflateRatio = 1032;

// The bytes of an IDX file, decompressed where it is gzip. Only a regular file is opened (a
// FIFO never blocks the reader); a gzip stream must reach its end-of-stream marker, which
// inflate accepts only after checking the CRC-32 and length trailer, so a file cut anywhere,
// inside the trailer too, is an error.
class IdxStream {
 public:
  explicit IdxStream(const std::string& path) : path_(path), fd_(open_regular_fd(path)) {
    file_bytes_ = static_cast<std::uint64_t>(std::filesystem::file_size(path));
    std::array<unsigned char, 2> magic{};
    const std::size_t got = raw_read(magic.data(), magic.size());
    gzip_ = got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    pending_.assign(magic.begin(), magic.begin() + static_cast<std::ptrdiff_t>(got));
    if (!gzip_) return;
    KILN_CHECK(inflateInit2(&z_, 16 + MAX_WBITS) == Z_OK, "{}: zlib could not start", path_);
    inflating_ = true;
  }
  ~IdxStream() {
    if (inflating_) inflateEnd(&z_);
    ::close(fd_);
  }
  IdxStream(const IdxStream&) = delete;
  IdxStream& operator=(const IdxStream&) = delete;

  bool gzip() const { return gzip_; }
  std::uint64_t file_bytes() const { return file_bytes_; }

  // Reads up to `n` bytes; fewer only where the data ends.
  std::size_t read(void* out, std::size_t n) {
    return gzip_ ? inflate_into(out, n) : plain(out, n);
  }

  // Throws unless the data ends exactly here, `data_bytes` after the header.
  void expect_end(std::uint64_t data_bytes) {
    std::array<unsigned char, 4096> extra{};
    const std::size_t more = read(extra.data(), 1);
    if (more > 0 && gzip_) {
      // More data than announced: a damaged stream often decodes to extra bytes before inflate
      // finds the damage, so decode the rest to tell corruption from real trailing data.
      while (read(extra.data(), extra.size()) > 0) {}
      KILN_CHECK(stream_end_, "{}: corrupt compressed data (it does not end as a gzip stream)",
                 path_);
    }
    KILN_CHECK(more == 0, "{}: trailing bytes after the {} bytes of data that the header announces",
               path_, data_bytes);
    if (!gzip_) return;
    KILN_CHECK(stream_end_,
               "{}: truncated compressed data: the gzip stream ends before its CRC-32 and "
               "length trailer",
               path_);
    KILN_CHECK(z_.avail_in == 0 && raw_read(extra.data(), 1) == 0,
               "{}: trailing bytes after the end of the gzip stream", path_);
  }

 private:
  std::size_t raw_read(void* out, std::size_t n) {
    auto* dst = static_cast<unsigned char*>(out);
    std::size_t done = 0;
    while (done < n) {
      const ssize_t got = ::read(fd_, dst + done, n - done);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        const int err = errno;
        throw Error(fmt::format("{}: read failed ({})", path_, std::strerror(err)));
      }
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
    }
    return done;
  }
  std::size_t plain(void* out, std::size_t n) {
    const std::size_t from_pending = std::min(n, pending_.size());
    if (from_pending > 0) {
      std::memcpy(out, pending_.data(), from_pending);
      pending_.erase(pending_.begin(),
                     pending_.begin() + static_cast<std::ptrdiff_t>(from_pending));
    }
    return from_pending +
           raw_read(static_cast<unsigned char*>(out) + from_pending, n - from_pending);
  }
  std::size_t inflate_into(void* out, std::size_t n) {
    z_.next_out = static_cast<Bytef*>(out);
    z_.avail_out = static_cast<uInt>(n);
    while (z_.avail_out > 0 && !stream_end_) {
      if (z_.avail_in == 0) {
        const std::size_t got = pending_.empty() ? raw_read(input_.data(), input_.size())
                                                 : plain(input_.data(), input_.size());
        if (got == 0) break;  // the file ended: expect_end or the caller reports it
        z_.next_in = input_.data();
        z_.avail_in = static_cast<uInt>(got);
      }
      const int rc = inflate(&z_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) stream_end_ = true;
      KILN_CHECK(rc == Z_OK || rc == Z_STREAM_END || rc == Z_BUF_ERROR,
                 "{}: corrupt compressed data ({})", path_, z_.msg ? z_.msg : zError(rc));
    }
    return n - z_.avail_out;
  }

  std::string path_;
  int fd_;
  std::uint64_t file_bytes_ = 0;
  bool gzip_ = false, inflating_ = false, stream_end_ = false;
  std::vector<unsigned char> pending_;  // the sniffed magic bytes, not yet consumed
  std::array<unsigned char, 1 << 16> input_{};
  z_stream z_{};
};

// Reads exactly `bytes` bytes or throws, saying how many arrived.
void read_exact(IdxStream& in, void* out, std::size_t bytes, const std::string& path,
                const char* what) {
  const std::size_t done = in.read(out, bytes);
  KILN_CHECK(done == bytes, "{}: truncated: the {} needs {} bytes but only {} are present", path,
             what, bytes, done);
}

// The data of a gzip file, read in growing steps: a header that announces more than the
// stream holds fails when the stream ends, before memory for the announced size is taken.
std::vector<unsigned char> read_growing(IdxStream& in, std::size_t bytes, const std::string& path) {
  std::vector<unsigned char> data;
  std::size_t step = std::size_t{1} << 20;
  while (data.size() < bytes) {
    const std::size_t want = std::min(bytes - data.size(), step);
    const std::size_t before = data.size();
    data.resize(before + want);
    const std::size_t got = in.read(data.data() + before, want);
    KILN_CHECK(got == want, "{}: truncated: the data needs {} bytes but only {} are present", path,
               bytes, before + got);
    step = std::min<std::size_t>(step * 2, std::size_t{1} << 28);
  }
  return data;
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
  KILN_CHECK(std::filesystem::exists(path), "{}: no such file", path);
  IdxStream in(path);
  std::array<unsigned char, 4> magic{};
  read_exact(in, magic.data(), magic.size(), path, "header");
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
    read_exact(in, be.data(), be.size(), path, "dimensions");
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
  const std::uint64_t capacity = in.gzip() ? in.file_bytes() * kMaxDeflateRatio : in.file_bytes();
  KILN_CHECK(data_bytes <= capacity,
             "{}: truncated: the header announces {} bytes of data but the file has {} bytes", path,
             data_bytes, in.file_bytes());

  Tensor t;
  const std::vector<unsigned char> inflated =
      in.gzip() ? read_growing(in, static_cast<std::size_t>(data_bytes), path)
                : std::vector<unsigned char>();
  try {
    t = Tensor::empty(Shape(dims), dtype);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", path, e.what()));
  }
  if (in.gzip())
    std::memcpy(t.raw(), inflated.data(), inflated.size());
  else
    read_exact(in, t.raw(), t.nbytes(), path, "data");
  in.expect_end(data_bytes);
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
