// Attributes of a node: named integers, reals, integer lists and strings.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace kiln {

using AttrValue = std::variant<std::int64_t, double, std::vector<std::int64_t>, std::string>;

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<const std::string, AttrValue>> items) : items_(items) {}

  bool has(const std::string& name) const { return items_.count(name) != 0; }
  void set(const std::string& name, AttrValue value) { items_[name] = std::move(value); }
  void erase(const std::string& name) { items_.erase(name); }
  // Typed getters; a missing or mistyped attribute is an internal error (ops build their own
  // attrs).
  std::int64_t integer(const std::string& name) const;
  double real(const std::string& name) const;
  const std::vector<std::int64_t>& integers(const std::string& name) const;
  const std::string& text(const std::string& name) const;
  const std::map<std::string, AttrValue>& items() const { return items_; }
  std::string str() const;  // "stride=1 padding=[1, 1]"

 private:
  const AttrValue& get(const std::string& name) const;
  std::map<std::string, AttrValue> items_;
};

}  // namespace kiln
