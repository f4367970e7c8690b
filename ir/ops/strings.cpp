// StringNormalizer.

#include "ir/ops/strings.hpp"
#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

#include <algorithm>
#include <cctype>

namespace popart::ir {

namespace {
std::string changeCase(std::string s, bool upper) {
  for (char &c : s)
    c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c))
                                : std::tolower(static_cast<unsigned char>(c)));
  return s;
}
} // namespace

void registerTfIdfOps(OpRegistry &r);

std::vector<std::string> normalizeStrings(const std::vector<std::string> &in, const Attributes &attrs) {
  std::string action = attrs.getString("case_change_action", "NONE");
  if (action != "NONE" && action != "LOWER" && action != "UPPER")
    throw error("StringNormalizer: case_change_action '", action, "' is not NONE, LOWER or UPPER");
  bool caseSensitive = attrs.getInt("is_case_sensitive", 0) != 0;
  std::vector<std::string> stop = attrs.getStrings("stopwords");
  if (!caseSensitive)
    for (auto &s : stop)
      s = changeCase(s, false);
  std::vector<std::string> out;
  for (const auto &s : in) {
    std::string key = caseSensitive ? s : changeCase(s, false);
    if (std::find(stop.begin(), stop.end(), key) != stop.end()) continue;
    out.push_back(action == "NONE" ? s : changeCase(s, action == "UPPER"));
  }
  if (out.empty()) out.push_back("");
  return out;
}

namespace {
void setupStringNormalizer(Op &op) {
  requireInputCount(op, 1, 1);
  requireType(op, 0, {DataType::STRING});
  const Shape &s = op.inInfo(0).shape();
  if (!(s.size() == 1 || (s.size() == 2 && s[0] == 1)))
    throw error(op.debugName(), ": input must be [C] or [1,C], got ", toString(s));
  int64_t n = static_cast<int64_t>(normalizeStrings(op.constInput(0, "X").strings(), op.attrs).size());
  op.setOutInfo(0, TensorInfo(DataType::STRING, s.size() == 1 ? Shape{n} : Shape{1, n}));
}
} // namespace

void registerStringOps(OpRegistry &r) {
  OpDef d = makeDef("StringNormalizer", 10, 1000, setupStringNormalizer);
  d.allInputsAreValueInputs = true;
  r.add(d);
  registerTfIdfOps(r);
}

namespace {
void setupTfIdf(Op &op) {
  requireInputCount(op, 1, 1);
  requireType(op, 0, {DataType::INT32, DataType::INT64, DataType::STRING});
  const Shape &s = op.inInfo(0).shape();
  if (s.empty() || s.size() > 2) throw error(op.debugName(), ": input must be [C] or [N,C], got ", toString(s));
  std::vector<int64_t> indexes = op.attrs.getInts("ngram_indexes");
  if (indexes.empty()) throw error(op.debugName(), ": ngram_indexes is empty");
  // Each is an output column: from the model, so checked before it sizes the output.
  for (int64_t i : indexes)
    if (i < 0) throw error(op.debugName(), ": ngram_indexes has a negative index ", i);
  int64_t width = checkedAdd(op, *std::max_element(indexes.begin(), indexes.end()), 1, "the output width");
  std::string mode = op.attrs.getString("mode");
  if (mode != "TF" && mode != "IDF" && mode != "TFIDF")
    throw error(op.debugName(), ": mode '", mode, "' is not TF, IDF or TFIDF");
  op.setOutInfo(0, TensorInfo(DataType::FLOAT, s.size() == 1 ? Shape{width} : Shape{s[0], width}));
}
} // namespace

void registerTfIdfOps(OpRegistry &r) {
  OpDef d = makeDef("TfIdfVectorizer", 9, 1000, setupTfIdf);
  r.add(d);
}

} // namespace popart::ir
