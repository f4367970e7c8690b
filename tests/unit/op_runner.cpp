#include "op_runner.hpp"

#include "backend_cpu/plan.hpp"
#include "ir/graph.hpp"

#include <cstring>

namespace popart::op_runner {

std::vector<TensorData> runOp(const std::string &type, int opset, ir::Attributes attrs, const std::vector<Input> &ins,
                              const std::vector<Input> &consts, size_t outputs, const std::string &domain,
                              backend_cpu::KernelProvider provider) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = opset;
  std::vector<TensorId> ids;
  for (const auto &in : ins) {
    g.addTensor(in.id, ir::TensorKind::Stream, in.data.info());
    g.addInput(in.id);
    ids.push_back(in.id);
  }
  for (const auto &c : consts) {
    g.addConst(c.id, c.data);
    ids.push_back(c.id);
  }
  std::vector<TensorId> outs;
  for (size_t i = 0; i < outputs; ++i)
    outs.push_back("y" + std::to_string(i));
  g.addOp(type, domain, opset, "", std::move(attrs), ids, outs);
  for (const auto &o : outs)
    g.addOutput(o);
  ir::inferShapes(g, nullptr);
  backend_cpu::ExecutionPlan plan(g, {provider});
  for (const auto &in : ins)
    std::memcpy(plan.address(in.id), in.data.data(), static_cast<size_t>(in.data.byteCount()));
  plan.run();
  std::vector<TensorData> result;
  for (const auto &o : outs)
    result.emplace_back(plan.info(o), plan.address(o));
  return result;
}

TensorData randomTensor(DataType type, const Shape &shape, std::mt19937 &rng, double lo, double hi) {
  std::uniform_real_distribution<double> d(lo, hi);
  int64_t n = 1;
  for (int64_t s : shape)
    n *= s;
  std::vector<double> v(static_cast<size_t>(n));
  for (auto &x : v)
    x = static_cast<float>(d(rng)); // the same values in both precisions
  return TensorData::fromDoubles(type, shape, v);
}

void runUpdateStep(backend_cpu::Kernel &kernel, const std::vector<void *> &buffers, const void *gradient,
                   const void *hyperParameters, const float &gradScale, int64_t n, const std::vector<int64_t> &cuts) {
  std::vector<const void *> in{buffers[0], gradient, hyperParameters, &gradScale};
  std::vector<void *> out{buffers[0]};
  for (size_t k = 1; k < buffers.size(); ++k) {
    in.push_back(buffers[k]);
    out.push_back(buffers[k]);
  }
  backend_cpu::KernelArgs args{in.data(), in.size(), out.data(), out.size()};
  if (cuts.empty()) {
    kernel.run(args);
    return;
  }
  std::vector<int64_t> bounds{0};
  bounds.insert(bounds.end(), cuts.begin(), cuts.end());
  bounds.push_back(n);
  for (size_t r = bounds.size() - 1; r-- > 0;)
    kernel.runRange(args, bounds[r], bounds[r + 1]);
}

} // namespace popart::op_runner
