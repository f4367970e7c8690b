// PopART's ai.graphcore opset 1 (ir/ops/graphcore.hpp): every gradient against central finite
// differences in double; the forward of a model written by the onnx Python package against torch
// 1.13 and numpy, computed at test time; Builder::aiGraphcoreOpset1 models; bad attributes.

#include "gradcheck.hpp"

#include "core/log.hpp"
#include "ir/ops/graphcore.hpp"

#include <popart/builder.hpp>
#include <popart/error.hpp>
#include <popart/optimizer.hpp>
#include <popart/session.hpp>

#include <onnx/onnx_pb.h>
#include <spdlog/sinks/ostream_sink.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

using namespace popart;

namespace {

using gradcheck::attrs;

/// One op of ai.graphcore opset 1 over DOUBLE streams of \p shapes and constants \p consts.
gradcheck::Problem problem(const std::string &type, ir::Attributes a, const std::vector<Shape> &shapes,
                           const std::vector<TensorData> &consts = {}) {
  gradcheck::Problem p{type, 1, std::move(a), gradcheck::streamsThenConsts(shapes, DataType::DOUBLE, consts)};
  p.domain = "ai.graphcore";
  // The harness gives the graph the op's opset for ai.onnx too; the gradients' ai.onnx ops (Expand,
  // Sign) need a modern one, as a real model imports.
  p.beforeGradients = [](ir::Graph &g) { g.opsets()["ai.onnx"] = 17; };
  return p;
}

TensorData int64s(const Shape &s, const std::vector<int64_t> &v) { return TensorData::fromInt64(s, v); }

/// Runs \p script with /usr/bin/python3 and \p args; returns what it printed, each line
/// "name v0 v1 ..." as name -> values.
std::map<std::string, std::vector<double>> runPython(const std::string &script, const std::string &args) {
  std::filesystem::path file = std::filesystem::path(testing::TempDir()) / "graphcore_ops_reference.py";
  std::ofstream(file) << script;
  std::string command = "/usr/bin/python3 " + file.string() + " " + args;
  FILE *pipe = popen(command.c_str(), "r");
  if (!pipe) throw error("cannot run ", command);
  std::string text;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe))
    text.append(buffer, n);
  if (pclose(pipe) != 0) throw error(command, " failed:\n", text);
  std::map<std::string, std::vector<double>> values;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string name;
    words >> name;
    for (double v; words >> v;)
      values[name].push_back(v);
  }
  return values;
}

/// Writes an ONNX model of ai.graphcore nodes (inputs x and v fed; the rest initializers) to
/// argv[1], then prints the inputs and torch's / numpy's value of every output.
const char *kReferenceScript = R"PY(
import sys
import numpy as np
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper, TensorProto
import onnx

rng = np.random.default_rng(7)
x = rng.uniform(-2, 2, (2, 6, 3, 2)).astype(np.float32)
s = rng.uniform(0.5, 1.5, 6).astype(np.float32)
b = rng.uniform(-1, 1, 6).astype(np.float32)
p = rng.uniform(0.05, 1.0, (2, 3, 5)).astype(np.float32)  # classes last, as PopART's Nll
logp = np.log(p).astype(np.float32)
lab = rng.integers(0, 5, (2, 3)).astype(np.int64)
lab[1, 0] = 2
lab[0, 2] = 2
v = rng.uniform(-2, 2, (5, 4, 3)).astype(np.float32)

G = "ai.graphcore"
nodes = [
    helper.make_node("GroupNormalization", ["x", "s", "b"], ["gn_y", "gn_mean", "gn_inv"], domain=G,
                     num_groups=3, epsilon=1e-5),
    helper.make_node("Nll", ["p", "lab"], ["nll_mean_ignore"], domain=G, reduction="Mean", ignoreIndex=2),
    helper.make_node("Nll", ["p", "lab"], ["nll_none"], domain=G, reduction="None"),
    helper.make_node("Nll", ["logp", "lab"], ["nll_log_sum"], domain=G, reduction="Sum", inputIsLogProbability=1),
    helper.make_node("L1", ["v"], ["l1_mean"], domain=G, reduction="Mean", **{"lambda": 0.3}),
    helper.make_node("L1", ["v"], ["l1_none"], domain=G, reduction="None", **{"lambda": 0.3}),
    helper.make_node("IdentityLoss", ["v"], ["id_sum"], domain=G, reduction="Sum"),
    helper.make_node("IdentityLoss", ["v"], ["id_mean"], domain=G, reduction="Mean"),
    helper.make_node("Scale", ["v"], ["scaled"], domain=G, scale=-1.5),
    helper.make_node("Subsample", ["v"], ["sub"], domain=G, strides=[2, 3, 1]),
    helper.make_node("Detach", ["v"], ["det"], domain=G),
    helper.make_node("Init", [], ["zeros"], domain=G, shape=[2, 3], data_type=1, tensor_type=0, init_type=1),
    helper.make_node("PrintTensor", ["v"], ["printed"], domain=G, print_gradient=1, title="v"),
    helper.make_node("Gelu", ["v"], ["gelu"], domain=G),
]
outputs = ["gn_y", "gn_mean", "gn_inv", "nll_mean_ignore", "nll_none", "nll_log_sum", "l1_mean", "l1_none",
           "id_sum", "id_mean", "scaled", "sub", "det", "zeros", "printed", "gelu"]
tx, tv, tp, tlab = (torch.tensor(a, dtype=torch.float64) for a in (x, v, p, lab.astype(np.float64)))
tlab = tlab.long()
grouped = tx.reshape(2, 3, -1)
ref = {
    "in_x": x, "in_v": v,
    "gn_y": F.group_norm(tx, 3, torch.tensor(s, dtype=torch.float64), torch.tensor(b, dtype=torch.float64), 1e-5),
    "gn_mean": grouped.mean(-1),
    "gn_inv": 1 / torch.sqrt(grouped.var(-1, unbiased=False) + 1e-5),
    "nll_mean_ignore": F.nll_loss(torch.log(tp).permute(0, 2, 1), tlab, ignore_index=2, reduction="mean"),
    "nll_none": F.nll_loss(torch.log(tp).permute(0, 2, 1), tlab, reduction="none"),
    "nll_log_sum": F.nll_loss(torch.tensor(logp, dtype=torch.float64).permute(0, 2, 1), tlab, reduction="sum"),
    "l1_mean": 0.3 * F.l1_loss(tv, torch.zeros_like(tv), reduction="mean"),
    "l1_none": 0.3 * F.l1_loss(tv, torch.zeros_like(tv), reduction="none"),
    "id_sum": tv.sum(), "id_mean": tv.mean(),
    "scaled": -1.5 * v.astype(np.float64),
    "sub": v[::2, ::3, ::1],
    "det": v, "zeros": np.zeros((2, 3)), "printed": v,
    "gelu": F.gelu(tv),
}
shapes = {o: np.asarray(ref[o]).shape for o in outputs}
shapes["gn_mean"] = shapes["gn_inv"] = (6,)  # [N * num_groups]
graph = helper.make_graph(
    nodes, "graphcore_ops",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
     helper.make_tensor_value_info("v", TensorProto.FLOAT, v.shape)],
    [helper.make_tensor_value_info(o, TensorProto.FLOAT, shapes[o]) for o in outputs],
    [numpy_helper.from_array(a, n) for a, n in [(s, "s"), (b, "b"), (p, "p"), (logp, "logp"), (lab, "lab")]])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(G, 1)])
onnx.save(model, sys.argv[1])

for name, value in ref.items():
    flat = np.asarray(value, dtype=np.float64).reshape(-1)
    print(name, " ".join(repr(float(e)) for e in flat))
)PY";

/// Runs \p model (bytes or path) on the float inputs \p feeds (with their shapes) and returns
/// each output of \p anchors as floats.
std::map<std::string, std::vector<float>> runModel(const std::string &model,
                                                   std::map<std::string, std::pair<Shape, std::vector<float>>> feeds,
                                                   const std::vector<TensorId> &anchors) {
  auto session = InferenceSession::createFromOnnxModel(model, DataFlow(1, anchors));
  session->prepareDevice();
  std::map<std::string, std::vector<float>> outs;
  std::vector<std::unique_ptr<NDArrayWrapper<float>>> arrays;
  std::map<TensorId, IArray &> in, out;
  for (auto &[id, f] : feeds) {
    arrays.push_back(std::make_unique<NDArrayWrapper<float>>(f.second.data(), f.first));
    in.emplace(id, *arrays.back());
  }
  for (const auto &id : anchors) {
    TensorInfo info = session->getInfo(id);
    outs[id].assign(static_cast<size_t>(info.elementCount()), -12345.0f);
    arrays.push_back(std::make_unique<NDArrayWrapper<float>>(outs[id].data(), info.shape()));
    out.emplace(id, *arrays.back());
  }
  StepIO io(in, out);
  session->run(io);
  return outs;
}

void expectClose(const std::vector<float> &got, const std::vector<double> &want, double tol, const std::string &what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << what << " element " << i;
}

std::vector<float> toFloats(const std::vector<double> &v) { return {v.begin(), v.end()}; }

/// Collects what the runtime logs at info level while alive.
class LogCapture {
public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(text_)) {
    // The other sinks (stderr) stay quiet meanwhile.
    for (auto &sink : logging::logger().sinks()) {
      quieted_.emplace_back(sink, sink->level());
      sink->set_level(spdlog::level::off);
    }
    logging::logger().sinks().push_back(sink_);
    level_ = logging::logger().level();
    logging::logger().set_level(spdlog::level::info);
  }
  ~LogCapture() {
    auto &sinks = logging::logger().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
    for (auto &[sink, level] : quieted_)
      sink->set_level(level);
    logging::logger().set_level(level_);
  }
  LogCapture(const LogCapture &) = delete;
  LogCapture &operator=(const LogCapture &) = delete;
  std::string text() const { return text_.str(); }

private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
  spdlog::level::level_enum level_;
  std::vector<std::pair<spdlog::sink_ptr, spdlog::level::level_enum>> quieted_;
};

} // namespace

// ---- gradients against central differences ----

TEST(GraphcoreOps, GroupNormalizationGradientMatchesFiniteDifferences) {
  for (int64_t groups : {1, 2, 4}) {
    gradcheck::Problem p =
        problem("GroupNormalization", attrs({{"num_groups", groups}, {"epsilon", 1e-3f}}), {{2, 4, 3}, {4}, {4}});
    // Y only is differentiated; the statistics outputs exist and the grad op reads them.
    p.outs = {"y0", "mean", "inv_std"};
    gradcheck::fillStreams(p.feeds, 40 + static_cast<unsigned>(groups));
    gradcheck::checkGradient(p, 40 + static_cast<unsigned>(groups), 1e-4);
  }
  // 4-D, statistics outputs omitted (the grad op recomputes them).
  gradcheck::Problem p = problem("GroupNormalization", attrs({{"num_groups", int64_t{3}}}), {{2, 6, 2, 3}, {6}, {6}});
  p.outs = {"y0", "", ""};
  gradcheck::fillStreams(p.feeds, 47);
  gradcheck::checkGradient(p, 47, 1e-4);
}

TEST(GraphcoreOps, ScaleSubsampleAndPrintTensorGradientsMatchFiniteDifferences) {
  gradcheck::Problem scale = problem("Scale", attrs({{"scale", -1.75f}}), {{3, 4}});
  gradcheck::fillStreams(scale.feeds, 1);
  gradcheck::checkGradient(scale, 1);
  for (const std::vector<int64_t> &strides :
       {std::vector<int64_t>{2, 3, 1}, std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{5, 4, 2}}) {
    gradcheck::Problem sub = problem("Subsample", attrs({{"strides", strides}}), {{5, 4, 3}});
    gradcheck::fillStreams(sub.feeds, 2);
    gradcheck::checkGradient(sub, 2);
  }
  for (int64_t printGradient : {0, 1}) {
    gradcheck::Problem print =
        problem("PrintTensor", attrs({{"print_gradient", printGradient}, {"title", std::string("t")}}), {{2, 3}});
    gradcheck::fillStreams(print.feeds, 3);
    LogCapture log;
    gradcheck::checkGradient(print, 3);
    // The forward logs the input; the gradient is logged under "t_gradient" only if asked.
    EXPECT_NE(log.text().find("t DOUBLE[2,3]: ["), std::string::npos) << log.text();
    EXPECT_EQ(log.text().find("t_gradient DOUBLE[2,3]: [") != std::string::npos, printGradient == 1) << log.text();
  }
}

TEST(GraphcoreOps, LossGradientsMatchFiniteDifferences) {
  for (const char *reduction : {"Sum", "Mean", "None"}) {
    SCOPED_TRACE(reduction);
    gradcheck::Problem identity = problem("IdentityLoss", attrs({{"reduction", std::string(reduction)}}), {{3, 4}});
    gradcheck::fillStreams(identity.feeds, 4);
    gradcheck::checkGradient(identity, 4);
    gradcheck::Problem l1 =
        problem("L1", attrs({{"reduction", std::string(reduction)}, {"lambda", 0.3f}}), {{3, 2, 2}});
    // Away from |x|'s kink at 0.
    gradcheck::fillStreams(l1.feeds, 5, [](size_t, double v) { return v < 0 ? v - 0.1 : v + 0.1; });
    gradcheck::checkGradient(l1, 5);
    for (bool logProbabilities : {false, true})
      for (bool ignore : {false, true}) {
        SCOPED_TRACE(testing::Message() << "log " << logProbabilities << " ignore " << ignore);
        ir::Attributes a = attrs(
            {{"reduction", std::string(reduction)}, {"inputIsLogProbability", int64_t{logProbabilities ? 1 : 0}}});
        if (ignore) a.set("ignoreIndex", int64_t{1});
        // Labels [2, 3] over 4 classes (last axis), class 1 present so that ignoring it matters.
        gradcheck::Problem nll = problem("Nll", a, {{2, 3, 4}}, {int64s({2, 3}, {1, 0, 3, 2, 1, 1})});
        gradcheck::fillStreams(nll.feeds, 6, [&](size_t, double v) {
          return logProbabilities ? v : 0.2 + 0.4 * (v + 2); // probabilities in [0.2, 1.8)
        });
        gradcheck::checkGradient(nll, 6);
      }
  }
}

TEST(GraphcoreOps, NoGradientFlowsThroughDetach) {
  gradcheck::Problem p = problem("Detach", {}, {{3, 4}});
  std::vector<TensorId> grads;
  auto g = gradcheck::buildGraph(p, &grads);
  // The loss depends on x through the Detach, yet no gradient op reaches x: its gradient is the
  // zero constant of an unreached input.
  ASSERT_EQ(grads.size(), 1u);
  const ir::Tensor &grad = g->tensor(grads[0]);
  ASSERT_TRUE(grad.isConst());
  for (double v : grad.data()->toDoubleVector())
    EXPECT_EQ(v, 0.0);
  // The forward is the identity.
  gradcheck::fillStreams(p.feeds, 8);
  p.exposeOutputs = true;
  gradcheck::OpNet net(p, false);
  net.run(p.feeds);
  EXPECT_EQ(net.get<double>("y0"), p.feeds[0].data.toDoubleVector());
}

// ---- forward against torch/numpy, on a model written by the onnx Python package ----

TEST(GraphcoreOps, ImportedModelMatchesTorchAndNumpy) {
  std::filesystem::path model = std::filesystem::path(testing::TempDir()) / "graphcore_ops.onnx";
  auto ref = runPython(kReferenceScript, model.string());
  std::vector<TensorId> anchors;
  for (const auto &[name, values] : ref)
    if (name.rfind("in_", 0) != 0) anchors.push_back(name);
  ASSERT_EQ(anchors.size(), 16u);
  LogCapture log;
  auto outs =
      runModel(model.string(),
               {{"x", {{2, 6, 3, 2}, toFloats(ref["in_x"])}}, {"v", {{5, 4, 3}, toFloats(ref["in_v"])}}}, anchors);
  for (const auto &id : anchors)
    expectClose(outs[id], ref[id], 1e-5, id);
  // PrintTensor logged its input under its title.
  EXPECT_NE(log.text().find("v FLOAT[5,4,3]: [-1.4529438 -0.3243854 "), std::string::npos) << log.text();
}

// ---- Builder::aiGraphcoreOpset1 ----

TEST(GraphcoreOps, BuilderWritesGraphcoreNodesThatRun) {
  auto builder = Builder::create();
  auto gc = builder->aiGraphcoreOpset1();
  TensorId x = builder->addInputTensor(TensorInfo(DataType::FLOAT, {2, 4, 3}), "x");
  std::vector<float> scaleValues{1.0f, 2.0f, 0.5f, -1.0f}, biasValues{0.0f, 0.1f, -0.2f, 0.3f};
  TensorId scale = builder->addInitializedInputTensor(scaleValues, {4}, "scale");
  TensorId bias = builder->addInitializedInputTensor(biasValues, {4}, "bias");
  std::vector<TensorId> gn = gc.groupnormalization({x, scale, bias}, 2, 1e-5f, "gn");
  TensorId scaled = gc.scale({x}, 3.0f);
  TensorId sub = gc.subsample({x}, {1, 2, 2});
  TensorId det = gc.detach({x});
  TensorId zeros = gc.init({3, 2}, static_cast<int64_t>(DataType::FLOAT), 1);
  TensorId printed = gc.printtensor({x}, 0, "print", "x");
  TensorId gelu = gc.gelu({x});
  TensorId idLoss = gc.identityloss({x}, ReductionType::Sum);
  TensorId l1 = gc.l1loss({x}, 0.5f, ReductionType::Mean);
  std::vector<float> probsValues{0.2f, 0.3f, 0.5f, 0.6f, 0.3f, 0.1f};
  TensorId probs = builder->addInitializedInputTensor(probsValues, {2, 3}, "probs");
  TensorId label = builder->addInitializedInputTensor(std::vector<int32_t>{2, 0}, {2}, "label");
  TensorId nll = gc.nllloss({probs, label}, ReductionType::Sum, std::nullopt, false);
  TensorId nllIgnore = gc.nllloss({probs, label}, ReductionType::Mean, 0, false);
  std::vector<TensorId> anchors{gn[0],   gn[1], gn[2],  scaled, sub, det,      zeros,
                                printed, gelu,  idLoss, l1,     nll, nllIgnore};
  for (const auto &id : anchors)
    builder->addOutputTensor(id);

  onnx::ModelProto m;
  ASSERT_TRUE(m.ParseFromString(builder->getModelProto()));
  bool imported = false;
  for (const auto &o : m.opset_import())
    imported = imported || (o.domain() == "ai.graphcore" && o.version() == 1);
  EXPECT_TRUE(imported);
  for (const auto &n : m.graph().node())
    EXPECT_EQ(n.domain(), "ai.graphcore") << n.op_type();

  std::vector<float> xv(24);
  for (size_t i = 0; i < xv.size(); ++i)
    xv[i] = std::sin(static_cast<float>(i) * 0.7f) * 2.0f;
  auto outs = runModel(builder->getModelProto(), {{x, {{2, 4, 3}, xv}}}, anchors);

  // Group norm: each (sample, 2 channels × 3) group normalised, then per-channel affine.
  std::vector<double> y(24), means, invStds;
  for (int n = 0; n < 2; ++n)
    for (int g = 0; g < 2; ++g) {
      double sum = 0, sq = 0;
      for (int i = 0; i < 6; ++i)
        sum += xv[static_cast<size_t>(n * 12 + g * 6 + i)];
      double mean = sum / 6;
      for (int i = 0; i < 6; ++i)
        sq += std::pow(xv[static_cast<size_t>(n * 12 + g * 6 + i)] - mean, 2);
      double inv = 1 / std::sqrt(sq / 6 + 1e-5);
      means.push_back(mean);
      invStds.push_back(inv);
      for (int i = 0; i < 6; ++i) {
        auto e = static_cast<size_t>(n * 12 + g * 6 + i);
        auto c = static_cast<size_t>(g * 2 + i / 3);
        y[e] = (xv[e] - mean) * inv * scaleValues[c] + biasValues[c];
      }
    }
  expectClose(outs[gn[0]], y, 1e-5, "groupnormalization y");
  expectClose(outs[gn[1]], means, 1e-5, "groupnormalization mean");
  expectClose(outs[gn[2]], invStds, 1e-5, "groupnormalization invStdDev");
  std::vector<double> tripled, subsampled, same(xv.begin(), xv.end()), gelus;
  double sum = 0, absSum = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    tripled.push_back(3.0 * xv[i]);
    gelus.push_back(0.5 * xv[i] * (1 + std::erf(xv[i] / std::sqrt(2.0))));
    sum += xv[i];
    absSum += std::fabs(xv[i]);
    // [2, 4, 3] strided by {1, 2, 2}: channels 0 and 2, positions 0 and 2.
    if ((i / 3) % 4 % 2 == 0 && i % 3 % 2 == 0) subsampled.push_back(xv[i]);
  }
  expectClose(outs[scaled], tripled, 1e-6, "scale");
  expectClose(outs[sub], subsampled, 0, "subsample");
  expectClose(outs[det], same, 0, "detach");
  expectClose(outs[zeros], std::vector<double>(6, 0.0), 0, "init");
  expectClose(outs[printed], same, 0, "printtensor");
  expectClose(outs[gelu], gelus, 1e-6, "gelu");
  expectClose(outs[idLoss], {sum}, 1e-6, "identityloss");
  expectClose(outs[l1], {0.5 * absSum / 24}, 1e-6, "l1loss");
  expectClose(outs[nll], {-std::log(0.5) - std::log(0.6)}, 1e-6, "nllloss sum");
  // Label 0 (the second sample's) ignored: the mean is over the one position left.
  expectClose(outs[nllIgnore], {-std::log(0.5)}, 1e-6, "nllloss mean, ignoreIndex 0");
}

/// One SGD step through a TrainingSession on a Builder model, GroupNormalization -> Scale -> Nll
/// over the channels (through a Transpose: PopART's Nll takes the classes last) plus an L1 term on
/// the detached input, against torch's gradients of the same function.
TEST(GraphcoreOps, TrainingStepMatchesTorch) {
  const char *script = R"PY(
import numpy as np, torch, torch.nn.functional as F
x = torch.tensor(np.sin(np.arange(24) * 0.7).reshape(2, 4, 3) * 2, dtype=torch.float64)
s = torch.tensor([1.0, 2.0, 0.5, -1.0], dtype=torch.float64, requires_grad=True)
b = torch.tensor([0.0, 0.1, -0.2, 0.3], dtype=torch.float64, requires_grad=True)
label = torch.tensor([[0, 3, 1], [2, 2, 0]])
y = F.group_norm(x, 2, s, b, 1e-5) * 0.5
probs = torch.softmax(y, 1)
loss = F.nll_loss(torch.log(probs), label, reduction="mean") + 0.1 * (x * s.reshape(1, 4, 1)).detach().abs().sum()
loss.backward()
lr = 0.1
print("s", " ".join(repr(float(v)) for v in (s - lr * s.grad).detach()))
print("b", " ".join(repr(float(v)) for v in (b - lr * b.grad).detach()))
print("x", " ".join(repr(float(v)) for v in x.reshape(-1)))
)PY";
  auto ref = runPython(script, "");
  auto builder = Builder::create();
  auto ai = builder->aiOnnxOpset13();
  auto gc = builder->aiGraphcoreOpset1();
  TensorId x = builder->addInputTensor(TensorInfo(DataType::FLOAT, {2, 4, 3}), "x");
  TensorId s = builder->addInitializedInputTensor(std::vector<float>{1.0f, 2.0f, 0.5f, -1.0f}, {4}, "s");
  TensorId b = builder->addInitializedInputTensor(std::vector<float>{0.0f, 0.1f, -0.2f, 0.3f}, {4}, "b");
  TensorId label = builder->addInitializedInputTensor(std::vector<int32_t>{0, 3, 1, 2, 2, 0}, {2, 3}, "label");
  TensorId y = gc.scale({gc.groupnormalization({x, s, b}, 2)[0]}, 0.5f);
  TensorId probs = ai.softmax({ai.transpose({y}, {0, 2, 1})}, -1);
  TensorId nll = gc.nllloss({probs, label}, ReductionType::Mean);
  std::vector<int64_t> channelShape{1, 4, 1};
  TensorId sReshaped = ai.reshape({s, builder->addInitializedInputTensor(channelShape, {3})});
  TensorId l1 = gc.l1loss({gc.detach({ai.mul({x, sReshaped})})}, 0.1f, ReductionType::Sum);
  TensorId loss = gc.identityloss({ai.add({nll, l1})}, ReductionType::Sum);
  builder->addOutputTensor(loss);

  auto session = TrainingSession::createFromOnnxModel(builder->getModelProto(), DataFlow(1, std::vector<TensorId>{}),
                                                      loss, ConstSGD(0.1f));
  session->prepareDevice();
  session->weightsFromHost();
  std::vector<float> xv = toFloats(ref["x"]);
  NDArrayWrapper<float> in(xv.data(), {2, 4, 3});
  StepIO io({{x, in}}, {});
  session->run(io);
  for (const TensorId &w : {s, b}) {
    std::vector<float> v(4);
    NDArrayWrapper<float> arr(v.data(), {4});
    WeightsIO weights;
    weights.insert(w, arr);
    session->readWeights(weights);
    expectClose(v, ref[w], 1e-5, w);
  }
}

TEST(GraphcoreOps, BadAttributesAreNamedErrors) {
  auto expectError = [](const std::string &type, ir::Attributes a, const std::vector<Shape> &shapes,
                        const std::string &what, const std::vector<TensorData> &consts = {}) {
    gradcheck::Problem p = problem(type, std::move(a), shapes, consts);
    try {
      gradcheck::buildGraph(p, nullptr);
      ADD_FAILURE() << type << ": no error, expected one containing '" << what << "'";
    } catch (const error &e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expectError("GroupNormalization", attrs({{"num_groups", int64_t{3}}}), {{2, 4, 3}, {4}, {4}},
              "num_groups 3 does not divide the 4 channels");
  expectError("GroupNormalization", {}, {{2, 4, 3}, {4}, {4}}, "attribute 'num_groups' is required");
  expectError("GroupNormalization", attrs({{"num_groups", int64_t{2}}}), {{2, 4, 3}, {3}, {4}}, "Scale");
  expectError("Subsample", attrs({{"strides", std::vector<int64_t>{2, 0}}}), {{4, 4}}, "stride 0 of dimension 1");
  expectError("Subsample", attrs({{"strides", std::vector<int64_t>{2}}}), {{4, 4}}, "one per dimension");
  expectError("L1", attrs({{"lambda", 1.0f}, {"reduction", std::string("mean")}}), {{3}},
              "reduction 'mean' is not one of Sum, Mean, None");
  expectError("IdentityLoss", {}, {{3}}, "attribute 'reduction' is required");
  expectError("Nll", attrs({{"reduction", std::string("Sum")}}), {{2, 3}}, "label ('k0') has shape [3]",
              {int64s({3}, {0, 1, 2})});
  expectError("Init",
              attrs({{"shape", std::vector<int64_t>{2}},
                     {"data_type", int64_t{99}},
                     {"tensor_type", int64_t{0}},
                     {"init_type", int64_t{1}}}),
              {}, "data_type 99");
  // A label out of range is a run-time error naming its position.
  gradcheck::Problem nll = problem("Nll", attrs({{"reduction", std::string("Sum")}}), {{2, 3}}, {int64s({2}, {0, 7})});
  gradcheck::fillStreams(nll.feeds, 9, [](size_t, double v) { return 0.5 + 0.1 * v; });
  gradcheck::OpNet net(nll, false);
  try {
    net.run(nll.feeds);
    ADD_FAILURE() << "no error for label 7 of 3 classes";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("label 7 at position 1 is out of range [0, 3)"), std::string::npos)
        << e.what();
  }
}
