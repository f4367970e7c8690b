#pragma once
// Named op attributes, typed as ONNX types them.

#include "core/tensordata.hpp"

#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace popart::ir {

class Graph;

/// One attribute value: int, float, string, tensor, a list of ints, floats or strings, or a
/// subgraph (If's branches, Loop's and Scan's body). A subgraph is never edited once imported:
/// ops that need it specialised work on a clone (Graph::clone), so ops may share it.
using AttributeValue =
    std::variant<int64_t, float, std::string, std::vector<int64_t>, std::vector<float>, std::vector<std::string>,
                 std::shared_ptr<TensorData>, std::shared_ptr<const Graph>>;

/// The attributes of one op, looked up by name with typed getters.
class Attributes {
public:
  bool has(const std::string &name) const { return values_.count(name) != 0; }
  void set(const std::string &name, AttributeValue value) { values_[name] = std::move(value); }
  void erase(const std::string &name) { values_.erase(name); }
  const std::map<std::string, AttributeValue> &all() const { return values_; }

  /// The int attribute \p name, or \p fallback when absent; throws if it has another type.
  int64_t getInt(const std::string &name, int64_t fallback) const;
  int64_t getInt(const std::string &name) const;
  float getFloat(const std::string &name, float fallback) const;
  float getFloat(const std::string &name) const;
  std::string getString(const std::string &name, const std::string &fallback) const;
  std::string getString(const std::string &name) const;
  std::vector<int64_t> getInts(const std::string &name, const std::vector<int64_t> &fallback) const;
  std::vector<int64_t> getInts(const std::string &name) const;
  std::vector<float> getFloats(const std::string &name, const std::vector<float> &fallback) const;
  std::vector<float> getFloats(const std::string &name) const;
  std::vector<std::string> getStrings(const std::string &name) const;
  std::shared_ptr<TensorData> getTensor(const std::string &name) const;
  /// The subgraph attribute \p name, or null when absent.
  std::shared_ptr<const Graph> getGraph(const std::string &name) const;

  /// One line, "name=value" pairs, for IR dumps.
  std::string toString() const;

private:
  template <typename T> const T *find(const std::string &name) const;
  std::map<std::string, AttributeValue> values_;
};

} // namespace popart::ir
