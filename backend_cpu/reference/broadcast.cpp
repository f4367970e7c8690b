#include "backend_cpu/reference/broadcast.hpp"

#include <algorithm>

namespace popart::backend_cpu {

std::vector<int64_t> broadcastStrides(const Shape &in, const Shape &out) {
  std::vector<int64_t> inStrides = rowMajorStrides(in);
  std::vector<int64_t> s(out.size(), 0);
  size_t offset = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i)
    s[i + offset] = in[i] == 1 ? 0 : inStrides[i];
  return s;
}

BroadcastWalker::BroadcastWalker(const Shape &out, const std::vector<Shape> &ins)
    : out_(out), index_(out.size(), 0), offsets_(ins.size(), 0) {
  for (const auto &in : ins)
    strides_.push_back(broadcastStrides(in, out));
}

void BroadcastWalker::reset() {
  std::fill(index_.begin(), index_.end(), 0);
  std::fill(offsets_.begin(), offsets_.end(), 0);
}

void BroadcastWalker::next() {
  for (int64_t d = static_cast<int64_t>(out_.size()) - 1; d >= 0; --d) {
    if (++index_[d] < out_[d]) {
      for (size_t i = 0; i < offsets_.size(); ++i)
        offsets_[i] += strides_[i][d];
      return;
    }
    for (size_t i = 0; i < offsets_.size(); ++i)
      offsets_[i] -= strides_[i][d] * (out_[d] - 1);
    index_[d] = 0;
  }
}

} // namespace popart::backend_cpu
