#include "ir/attributes.hpp"
#include "ir/graph.hpp"
#include <popart/error.hpp>

#include <sstream>

namespace popart::ir {

template <typename T> const T *Attributes::find(const std::string &name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return nullptr;
  if (const T *v = std::get_if<T>(&it->second)) return v;
  throw error("attribute '", name, "' has another type than the one expected");
}

int64_t Attributes::getInt(const std::string &name, int64_t fallback) const {
  const int64_t *v = find<int64_t>(name);
  return v ? *v : fallback;
}
int64_t Attributes::getInt(const std::string &name) const {
  if (const int64_t *v = find<int64_t>(name)) return *v;
  throw error("required int attribute '", name, "' is missing");
}
float Attributes::getFloat(const std::string &name, float fallback) const {
  auto it = values_.find(name);
  if (it != values_.end())
    if (const int64_t *i = std::get_if<int64_t>(&it->second)) return static_cast<float>(*i);
  const float *v = find<float>(name);
  return v ? *v : fallback;
}
float Attributes::getFloat(const std::string &name) const {
  if (!has(name)) throw error("required float attribute '", name, "' is missing");
  return getFloat(name, 0.f);
}
std::string Attributes::getString(const std::string &name, const std::string &fallback) const {
  const std::string *v = find<std::string>(name);
  return v ? *v : fallback;
}
std::string Attributes::getString(const std::string &name) const {
  if (const std::string *v = find<std::string>(name)) return *v;
  throw error("required string attribute '", name, "' is missing");
}
std::vector<int64_t> Attributes::getInts(const std::string &name, const std::vector<int64_t> &fallback) const {
  auto it = values_.find(name);
  if (it != values_.end())
    if (const int64_t *i = std::get_if<int64_t>(&it->second)) return {*i};
  const auto *v = find<std::vector<int64_t>>(name);
  return v ? *v : fallback;
}
std::vector<int64_t> Attributes::getInts(const std::string &name) const {
  if (!has(name)) throw error("required ints attribute '", name, "' is missing");
  return getInts(name, {});
}
std::vector<float> Attributes::getFloats(const std::string &name, const std::vector<float> &fallback) const {
  const auto *v = find<std::vector<float>>(name);
  return v ? *v : fallback;
}
std::vector<float> Attributes::getFloats(const std::string &name) const {
  if (const auto *v = find<std::vector<float>>(name)) return *v;
  throw error("required floats attribute '", name, "' is missing");
}
std::vector<std::string> Attributes::getStrings(const std::string &name) const {
  const auto *v = find<std::vector<std::string>>(name);
  return v ? *v : std::vector<std::string>{};
}
std::shared_ptr<TensorData> Attributes::getTensor(const std::string &name) const {
  const auto *v = find<std::shared_ptr<TensorData>>(name);
  return v ? *v : nullptr;
}

std::shared_ptr<const Graph> Attributes::getGraph(const std::string &name) const {
  const auto *v = find<std::shared_ptr<const Graph>>(name);
  return v ? *v : nullptr;
}

std::string Attributes::toString() const {
  std::ostringstream os;
  bool first = true;
  for (const auto &[name, value] : values_) {
    if (!first) os << ", ";
    first = false;
    os << name << "=";
    std::visit(
        [&](const auto &v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, int64_t> || std::is_same_v<V, float>) {
            os << v;
          } else if constexpr (std::is_same_v<V, std::string>) {
            os << '"' << v << '"';
          } else if constexpr (std::is_same_v<V, std::shared_ptr<TensorData>>) {
            os << "tensor " << (v ? v->info().toString() : "null");
          } else if constexpr (std::is_same_v<V, std::shared_ptr<const Graph>>) {
            os << "graph(" << (v ? v->ops().size() : 0) << " ops)";
          } else {
            os << "[";
            for (size_t i = 0; i < v.size(); ++i)
              os << (i ? "," : "") << v[i];
            os << "]";
          }
        },
        value);
  }
  return os.str();
}

} // namespace popart::ir
