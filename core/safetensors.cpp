// safetensors reading and writing. Reading validates the whole header (types, shapes,
// offsets, layout) with overflow-safe arithmetic before any tensor is allocated or copied.
#include "core/safetensors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>

#include "core/atomic_file.h"
#include "core/input_file.h"

namespace kiln {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian and copied as is");

using json = nlohmann::json;

constexpr int kMaxJsonDepth = 3;  // root object > tensor object > shape array > dimension
constexpr std::string_view kMetadataKey = "__metadata__";

// One tensor of the header, validated: its bytes are [begin, end) of the data section.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  std::uint64_t begin;
  std::uint64_t end;
};

struct Header {
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
};

// A name for a message: at most 80 characters of it.
std::string shown(std::string_view name) {
  return name.size() <= 80 ? std::string(name) : fmt::format("{}...", name.substr(0, 77));
}

std::string_view safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "F32";
    case DType::f64:
      return "F64";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
    case DType::u8:
      return "U8";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
  }
  KILN_ASSERT(false, "unknown dtype {}", static_cast<int>(dtype));
}

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (DType d :
       {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8})
    if (safetensors_dtype(d) == name) return d;
  return std::nullopt;
}

bool is_other_safetensors_dtype(std::string_view name) {
  constexpr std::array<std::string_view, 14> kOthers = {
      "BOOL",    "I8",      "I16", "U16",     "U32",     "U64", "F8_E4M3",
      "F8_E5M2", "F8_E8M0", "F4",  "F6_E2M3", "F6_E3M2", "C64", "E8M0"};
  return std::find(kOthers.begin(), kOthers.end(), name) != kOthers.end();
}

// Parses JSON, rejecting a key repeated within one object and nesting deeper than the format.
json parse_json(std::string_view text, const std::string& file) {
  std::vector<std::set<std::string>> open_objects;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    using E = json::parse_event_t;
    if ((event == E::object_start || event == E::array_start) && depth >= kMaxJsonDepth)
      throw Error(
          fmt::format("{}: the header nests deeper than the safetensors format does", file));
    if (event == E::object_start) open_objects.emplace_back();
    if (event == E::object_end) open_objects.pop_back();
    if (event == E::key && !open_objects.back().insert(parsed.get<std::string>()).second)
      throw Error(fmt::format("{}: the header has the key '{}' twice in one object", file,
                              shown(parsed.get<std::string>())));
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: the header is not valid JSON ({})", file, e.what()));
  }
}

std::uint64_t parse_count(const json& value, const std::string& what) {
  KILN_CHECK(value.is_number_integer(), "{} is {} (a non-negative integer is expected)", what,
             value.is_string() ? fmt::format("the string '{}'", shown(value.get<std::string>()))
                               : value.dump());
  KILN_CHECK(value.is_number_unsigned(), "{} is {} (negative)", what, value.get<std::int64_t>());
  return value.get<std::uint64_t>();
}

DType parse_dtype(const json& value, const std::string& what) {
  KILN_CHECK(value.is_string(), "{}: dtype is a JSON {}, not a string", what, value.type_name());
  const auto& name = value.get_ref<const std::string&>();
  if (auto dtype = dtype_from_safetensors(name)) return *dtype;
  KILN_CHECK(!is_other_safetensors_dtype(name),
             "{} has dtype {}, which kiln does not support (F32, F64, BF16, F16, I32, I64, U8)",
             what, name);
  throw Error(
      fmt::format("{} has the unknown dtype '{}' (kiln reads F32, F64, BF16, F16, I32, I64 and U8)",
                  what, shown(name)));
}

// The shape, with its element count checked against overflow.
Shape parse_shape(const json& value, const std::string& what) {
  KILN_CHECK(value.is_array(), "{}: shape is a JSON {}, not an array", what, value.type_name());
  KILN_CHECK(value.size() <= kSafetensorsMaxRank, "{} has rank {} (at most {} is supported)", what,
             value.size(), kSafetensorsMaxRank);
  std::vector<std::int64_t> dims;
  std::uint64_t numel = 1;
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  for (std::size_t i = 0; i < value.size(); ++i) {
    const std::uint64_t d = parse_count(value[i], fmt::format("{}: shape dimension {}", what, i));
    KILN_CHECK(d <= kMax && (d == 0 || numel <= kMax / d),
               "{}: shape {} has more than 2^63 elements", what, value.dump());
    numel *= d;
    dims.push_back(static_cast<std::int64_t>(d));
  }
  return Shape(std::move(dims));
}

Entry parse_entry(const std::string& name, const json& value, std::uint64_t data_bytes,
                  const std::string& file) {
  const std::string what = fmt::format("{}: tensor '{}'", file, shown(name));
  KILN_CHECK(value.is_object(), "{} is a JSON {}, not an object with dtype, shape and data_offsets",
             what, value.type_name());
  for (const auto& item : value.items())
    KILN_CHECK(item.key() == "dtype" || item.key() == "shape" || item.key() == "data_offsets",
               "{} has the unknown key '{}' (expected dtype, shape and data_offsets)", what,
               shown(item.key()));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    KILN_CHECK(value.contains(key), "{} has no {}", what, key);

  Entry e{name, parse_dtype(value.at("dtype"), what), parse_shape(value.at("shape"), what), 0, 0};
  const json& offsets = value.at("data_offsets");
  KILN_CHECK(offsets.is_array() && offsets.size() == 2,
             "{}: data_offsets is {} (expected [begin, end])", what, offsets.dump().substr(0, 80));
  e.begin = parse_count(offsets[0], what + ": data_offsets begin");
  e.end = parse_count(offsets[1], what + ": data_offsets end");
  KILN_CHECK(e.begin <= e.end, "{} data_offsets [{}, {}] end before they begin", what, e.begin,
             e.end);
  KILN_CHECK(e.end <= data_bytes, "{} data_offsets [{}, {}] run past the {} bytes of data", what,
             e.begin, e.end, data_bytes);
  const std::uint64_t span = e.end - e.begin;
  const std::size_t width = dtype_size(e.dtype);
  const auto numel = static_cast<std::uint64_t>(e.shape.numel());
  KILN_CHECK(
      span % width == 0 && span / width == numel,
      "{}: shape {} of {} needs {} elements of {} bytes but data_offsets [{}, {}] hold {} bytes",
      what, e.shape.str(), safetensors_dtype(e.dtype), numel, width, e.begin, e.end, span);
  return e;
}

std::map<std::string, std::string> parse_metadata(const json& value, const std::string& file) {
  std::map<std::string, std::string> metadata;
  if (value.is_null()) return metadata;
  KILN_CHECK(value.is_object(), "{}: __metadata__ is a JSON {}, not an object of strings", file,
             value.type_name());
  for (const auto& item : value.items()) {
    KILN_CHECK(item.value().is_string(),
               "{}: __metadata__ value of '{}' is a JSON {}, not a string", file, shown(item.key()),
               item.value().type_name());
    metadata.emplace(item.key(), item.value().get<std::string>());
  }
  return metadata;
}

// The tensors must tile the data section exactly: no overlap, no gap, no trailing bytes
// (as the reference implementation requires).
void check_layout(std::vector<Entry>& entries, std::uint64_t data_bytes, const std::string& file) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  std::uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    KILN_CHECK(
        e.begin >= covered, "{}: tensors '{}' (data_offsets [{}, {}]) and '{}' ([{}, {}]) overlap",
        file, shown(previous->name), previous->begin, previous->end, shown(e.name), e.begin, e.end);
    KILN_CHECK(e.begin == covered,
               "{}: bytes [{}, {}) of the data belong to no tensor (a gap before '{}')", file,
               covered, e.begin, shown(e.name));
    covered = e.end;
    previous = &e;
  }
  KILN_CHECK(covered == data_bytes,
             "{}: the last {} bytes of the {} bytes of data belong to no tensor", file,
             data_bytes - covered, data_bytes);
}

Header parse_header(std::string_view text, std::uint64_t data_bytes, const std::string& file) {
  KILN_CHECK(!text.empty() && text.front() == '{',
             "{}: the header does not start with '{{' (not a safetensors file?)", file);
  // JSON text has no NUL byte; a parser may stop at one and ignore the rest of the header.
  const auto nul = text.find('\0');
  KILN_CHECK(nul == std::string_view::npos, "{}: the header has a NUL byte at offset {}", file,
             8 + nul);
  const json root = parse_json(text, file);
  KILN_CHECK(root.is_object(), "{}: the header is a JSON {}, not an object", file,
             root.type_name());
  Header header;
  for (const auto& item : root.items()) {
    if (item.key() == kMetadataKey)
      header.metadata = parse_metadata(item.value(), file);
    else
      header.entries.push_back(parse_entry(item.key(), item.value(), data_bytes, file));
  }
  check_layout(header.entries, data_bytes, file);
  return header;
}

// Validates the 8-byte length prefix of a file of `file_bytes` bytes; returns the header length.
std::uint64_t header_length(const std::uint8_t* prefix, std::uint64_t file_bytes,
                            const std::string& file) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];
  KILN_CHECK(n <= kSafetensorsMaxHeaderBytes, "{}: header length {} exceeds the limit of {} bytes",
             file, n, kSafetensorsMaxHeaderBytes);
  KILN_CHECK(n <= file_bytes - 8,
             "{}: header length {} runs past the end of the file ({} bytes follow the length)",
             file, n, file_bytes - 8);
  return n;
}

void check_long_enough(std::uint64_t file_bytes, const std::string& file) {
  KILN_CHECK(file_bytes >= 8,
             "{}: {} bytes is too short for a safetensors file (the header length alone takes 8)",
             file, file_bytes);
}

Tensor allocate(const Entry& e, const std::string& file) {
  try {
    return Tensor::empty(e.shape, e.dtype);
  } catch (const Error& err) {
    throw Error(fmt::format("{}: tensor '{}': {}", file, shown(e.name), err.what()));
  }
}

std::string reason(int err) { return std::error_code(err, std::generic_category()).message(); }

using File = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

// Reads exactly `bytes` bytes at `offset` or throws, naming what was being read.
void read_at(std::FILE* f, std::uint64_t offset, void* out, std::size_t bytes,
             const std::string& file, const std::string& what) {
  KILN_CHECK(offset <= static_cast<std::uint64_t>(std::numeric_limits<off_t>::max()) &&
                 fseeko(f, static_cast<off_t>(offset), SEEK_SET) == 0,
             "{}: cannot seek to byte {} ({})", file, offset, reason(errno));
  const std::size_t got = bytes == 0 ? 0 : std::fread(out, 1, bytes, f);
  KILN_CHECK(got == bytes,
             "{}: reading {} failed after {} of {} bytes ({}; did the file change while loading?)",
             file, what, got, bytes, std::ferror(f) ? reason(errno) : "end of file");
}

}  // namespace

SafetensorsFile parse_safetensors(std::span<const std::uint8_t> bytes,
                                  const std::string& name_for_errors) {
  const std::string& file = name_for_errors;
  check_long_enough(bytes.size(), file);
  const std::uint64_t n = header_length(bytes.data(), bytes.size(), file);
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), n);
  const std::span<const std::uint8_t> data = bytes.subspan(8 + n);
  Header header = parse_header(text, data.size(), file);
  SafetensorsFile out{{}, std::move(header.metadata)};
  for (const Entry& e : header.entries) {
    Tensor t = allocate(e, file);
    if (t.nbytes() > 0) std::memcpy(t.raw(), data.data() + e.begin, t.nbytes());
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

SafetensorsFile load_safetensors(const std::filesystem::path& path) {
  const std::string file = path.string();
  const FilePtr f = open_regular_file(path);  // refuses a FIFO or device before it blocks
  struct stat st {};
  KILN_CHECK(::fstat(fileno(f.get()), &st) == 0, "{}: cannot stat ({})", file, reason(errno));
  const auto file_bytes = static_cast<std::uint64_t>(st.st_size);
  check_long_enough(file_bytes, file);
  std::array<std::uint8_t, 8> prefix{};
  read_at(f.get(), 0, prefix.data(), prefix.size(), file, "the header length");
  const std::uint64_t n = header_length(prefix.data(), file_bytes, file);
  std::string text(n, '\0');
  read_at(f.get(), 8, text.data(), text.size(), file, "the header");
  Header header = parse_header(text, file_bytes - 8 - n, file);
  SafetensorsFile out{{}, std::move(header.metadata)};
  for (const Entry& e : header.entries) {
    Tensor t = allocate(e, file);
    read_at(f.get(), 8 + n + e.begin, t.raw(), t.nbytes(), file,
            fmt::format("tensor '{}'", shown(e.name)));
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

void save_safetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string file = path.string();
  std::set<std::string_view> names;
  for (const auto& [name, t] : tensors) {
    KILN_CHECK(!name.empty(), "{}: a tensor has an empty name", file);
    KILN_CHECK(name != kMetadataKey, "{}: '__metadata__' is reserved and cannot name a tensor",
               file);
    KILN_CHECK(names.insert(name).second, "{}: the tensor name '{}' is given twice", file,
               shown(name));
    KILN_CHECK(t.defined(), "{}: tensor '{}' is undefined", file, shown(name));
    KILN_CHECK(t.device().is_cpu(), "{}: tensor '{}' is on {}; copy it to the host first", file,
               shown(name), t.device().str());
  }
  // Data order: larger elements first, so every tensor is aligned to its element size.
  std::vector<std::size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return dtype_size(tensors[a].second.dtype()) > dtype_size(tensors[b].second.dtype());
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::uint64_t offset = 0;
  for (std::size_t i : order) {
    const Tensor& t = tensors[i].second;
    nlohmann::ordered_json entry;
    entry["dtype"] = safetensors_dtype(t.dtype());
    entry["shape"] = t.shape().dims();
    entry["data_offsets"] = {offset, offset + t.nbytes()};
    header[tensors[i].first] = std::move(entry);
    offset += t.nbytes();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: a tensor name or metadata string is not valid UTF-8 ({})", file,
                            e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  write_file_atomically(path, [&](AtomicFileSink& sink) {
    std::array<std::uint8_t, 8> prefix{};
    for (std::size_t i = 0; i < 8; ++i)
      prefix[i] = static_cast<std::uint8_t>(text.size() >> (8 * i));
    sink.write(prefix);
    sink.write(text.data(), text.size());
    for (std::size_t i : order) sink.write(tensors[i].second.raw(), tensors[i].second.nbytes());
  });
}

}  // namespace kiln
