// The --data spec, and Fashion-MNIST as a raw image source.
#include "data/image_sources.h"

#include <charconv>

namespace kiln {

DataSource parse_data_source(const std::string& spec) {
  const std::size_t colon = spec.find(':');
  DataSource s{spec.substr(0, colon), colon == std::string::npos ? "" : spec.substr(colon + 1), {}};
  const std::string shown = spec.size() > 80 ? spec.substr(0, 80) + "..." : spec;
  const char* forms =
      "fashion-mnist[:DIR], cifar10:DIR, cifar100:DIR, folder:DIR or synthetic[:CxHxW]";
  const bool known = s.kind == "fashion-mnist" || s.kind == "cifar10" || s.kind == "cifar100" ||
                     s.kind == "folder" || s.kind == "synthetic";
  KILN_CHECK(known, "--data '{}' is not a data source ({})", shown, forms);
  const bool needs_dir = s.kind == "cifar10" || s.kind == "cifar100" || s.kind == "folder";
  KILN_CHECK(!needs_dir || !s.dir.empty(), "--data '{}' needs a directory: {}:DIR", shown, s.kind);
  if (s.kind == "synthetic" && !s.dir.empty()) {
    s.synthetic_shape = parse_image_shape(s.dir, "--data " + shown);
    s.dir.clear();
  }
  return s;
}

std::vector<std::int64_t> parse_image_shape(const std::string& text, const std::string& where) {
  std::vector<std::int64_t> dims;
  const char* at = text.data();
  const char* end = text.data() + text.size();
  while (at < end && dims.size() < 4) {
    std::int64_t value = 0;
    const auto [next, ec] = std::from_chars(at, end, value);
    if (ec != std::errc() || value < 1 || value > 4096) break;
    dims.push_back(value);
    at = next;
    if (at == end || *at != 'x') break;
    ++at;
  }
  KILN_CHECK(dims.size() == 3 && at == end,
             "{}: '{}' is not an image shape CxHxW (three sizes from 1 to 4096, e.g. 3x32x32)",
             where, text.size() > 40 ? text.substr(0, 40) + "..." : text);
  return dims;
}

}  // namespace kiln
