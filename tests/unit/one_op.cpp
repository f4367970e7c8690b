#include "one_op.hpp"

#include "backend_cpu/kernel.hpp"

#include <algorithm>

namespace popart::test_ops {

OneOp makeOneOp(const std::string &type, const std::string &domain, int opset, const std::vector<TensorInfo> &ins,
                ir::Attributes attrs, size_t outputs, const std::map<size_t, TensorData> &consts,
                const std::function<void(ir::Op &)> &prepare, const std::vector<size_t> &omittedOutputs) {
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  OneOp o;
  o.graph->opsets()[domain] = opset;
  std::vector<TensorId> inIds, outIds;
  for (size_t i = 0; i < ins.size(); ++i) {
    inIds.push_back("x" + std::to_string(i));
    if (auto c = consts.find(i); c != consts.end())
      o.graph->addConst(inIds.back(), c->second);
    else if (ins[i].shape() == Shape{-1})
      inIds.back().clear(); // omitted
    else
      o.graph->addTensor(inIds.back(), ir::TensorKind::Stream, ins[i]);
  }
  for (size_t i = 0; i < outputs; ++i) {
    const bool omitted = std::find(omittedOutputs.begin(), omittedOutputs.end(), i) != omittedOutputs.end();
    outIds.push_back(omitted ? std::string() : "y" + std::to_string(i));
  }
  o.op = &o.graph->addOp(type, domain, opset, "", std::move(attrs), inIds, outIds);
  if (prepare) prepare(*o.op);
  o.op->def->setup(*o.op);
  return o;
}

TensorData tensorOf(DataType type, const std::vector<float> &values) {
  return TensorData::fromDoubles(type, {static_cast<int64_t>(values.size())},
                                 std::vector<double>(values.begin(), values.end()));
}

} // namespace popart::test_ops
