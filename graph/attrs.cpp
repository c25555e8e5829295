// Typed access to node attributes and their printing.
#include "graph/attrs.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

namespace kiln {

const AttrValue& Attrs::get(const std::string& name) const {
  auto it = items_.find(name);
  KILN_ASSERT(it != items_.end(), "missing attribute '{}'", name);
  return it->second;
}

std::int64_t Attrs::integer(const std::string& name) const {
  const auto* v = std::get_if<std::int64_t>(&get(name));
  KILN_ASSERT(v != nullptr, "attribute '{}' is not an integer", name);
  return *v;
}

double Attrs::real(const std::string& name) const {
  const AttrValue& value = get(name);
  if (const auto* i = std::get_if<std::int64_t>(&value)) return static_cast<double>(*i);
  const auto* v = std::get_if<double>(&value);
  KILN_ASSERT(v != nullptr, "attribute '{}' is not a real", name);
  return *v;
}

const std::vector<std::int64_t>& Attrs::integers(const std::string& name) const {
  const auto* v = std::get_if<std::vector<std::int64_t>>(&get(name));
  KILN_ASSERT(v != nullptr, "attribute '{}' is not an integer list", name);
  return *v;
}

const std::string& Attrs::text(const std::string& name) const {
  const auto* v = std::get_if<std::string>(&get(name));
  KILN_ASSERT(v != nullptr, "attribute '{}' is not a string", name);
  return *v;
}

std::string Attrs::str() const {
  std::string out;
  for (const auto& [name, value] : items_) {
    if (!out.empty()) out += ' ';
    out += name + '=';
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::vector<std::int64_t>>)
            out += fmt::format("[{}]", fmt::join(v, ", "));
          else
            out += fmt::format("{}", v);
        },
        value);
  }
  return out;
}

}  // namespace kiln
