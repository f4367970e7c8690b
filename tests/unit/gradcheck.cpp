#include "gradcheck.hpp"

#include "autodiff/autodiff.hpp"
#include "ir/passes/passes.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace popart::gradcheck {

std::string named(const char *prefix, size_t i) {
  std::string s = std::to_string(i);
  s.insert(0, prefix);
  return s;
}

std::vector<double> unevenWeights(int64_t n, size_t offset) {
  std::vector<double> w(static_cast<size_t>(n));
  for (size_t i = 0; i < w.size(); ++i)
    w[i] = 1.0 + 0.37 * static_cast<double>((i + offset) % 7);
  return w;
}

TensorId plainLoss(ir::Graph &, const std::vector<TensorId> &outs, int) { return outs[0]; }

TensorId weightedLoss(ir::Graph &g, const std::vector<TensorId> &outs, int opset) {
  const TensorInfo &y0 = g.tensor(outs[0]).info();
  g.addConst("w", TensorData::fromDoubles(y0.dataType(), y0.shape(), unevenWeights(y0.elementCount())));
  g.addOp("Mul", "", opset, "weigh", {}, {outs[0], "w"}, {"y"});
  return "y";
}

Loss weightedSumLoss(size_t count) {
  return [count](ir::Graph &g, const std::vector<TensorId> &outs, int opset) {
    std::vector<TensorId> terms;
    for (size_t k = 0; k < count; ++k) {
      const TensorInfo &info = g.tensor(outs[k]).info();
      std::string wk = named("w", k), zk = named("z", k), sk = named("s", k);
      g.addConst(wk, TensorData::fromDoubles(info.dataType(), info.shape(), unevenWeights(info.elementCount(), 3 * k)));
      g.addOp("Mul", "", opset, named("weigh", k), {}, {outs[k], wk}, {zk});
      ir::Attributes keep;
      keep.set("keepdims", int64_t{0});
      g.addOp("ReduceSum", "", opset, named("sum", k), keep, {zk}, {sk});
      terms.push_back(sk);
    }
    if (terms.size() == 1) return terms[0];
    g.addOp("Sum", "", opset, "total", {}, terms, {"loss"});
    return TensorId("loss");
  };
}

std::vector<Feed> streamsThenConsts(const std::vector<Shape> &shapes, DataType type,
                                    const std::vector<TensorData> &consts) {
  std::vector<Feed> feeds;
  for (size_t i = 0; i < shapes.size(); ++i)
    feeds.push_back({named("x", i), TensorData(TensorInfo(type, shapes[i])), true});
  for (size_t i = 0; i < consts.size(); ++i) {
    if (consts[i].info().dataType() == DataType::UNDEFINED)
      feeds.push_back({"", TensorData(), false});
    else
      feeds.push_back({named("k", i), consts[i], false});
  }
  return feeds;
}

std::unique_ptr<ir::Graph> buildGraph(const Problem &p, std::vector<TensorId> *grads) {
  ir::registerBuiltinOps();
  auto g = std::make_unique<ir::Graph>();
  g->opsets()["ai.onnx"] = p.opset;
  std::vector<TensorId> ins, wrt;
  for (const auto &f : p.feeds) {
    ins.push_back(f.id);
    if (f.id.empty()) continue;
    if (f.stream) {
      g->addTensor(f.id, ir::TensorKind::Stream, f.data.info());
      g->addInput(f.id);
      if (isFloatingPoint(f.data.info().dataType())) wrt.push_back(f.id);
    } else {
      g->addConst(f.id, f.data);
    }
  }
  g->addOp(p.type, p.domain, p.opset, "op", p.attrs, ins, p.outs);
  ir::inferShapes(*g, nullptr);
  TensorId loss = p.loss(*g, p.outs, p.opset);
  g->addOutput(loss);
  if (p.exposeOutputs)
    for (const auto &o : p.outs)
      if (!o.empty() && o != loss) g->addOutput(o);
  ir::inferShapes(*g, nullptr);
  if (grads) {
    if (p.beforeGradients) {
      p.beforeGradients(*g);
      ir::inferShapes(*g, nullptr);
    }
    *grads = autodiff::buildGradients(*g, loss, wrt);
    for (const auto &id : *grads)
      g->addOutput(id);
    ir::inferShapes(*g, nullptr);
  }
  return g;
}

OpNet::OpNet(const Problem &p, bool gradients) {
  graph_ = buildGraph(p, gradients ? &gradIds_ : nullptr);
  loss_ = graph_->outputs().front();
  plan_ = std::make_unique<backend_cpu::ExecutionPlan>(*graph_, p.options);
}

void OpNet::run(const std::vector<Feed> &feeds) {
  for (const auto &f : feeds)
    if (!f.id.empty() && f.stream)
      std::memcpy(plan_->address(f.id), f.data.data(), static_cast<size_t>(f.data.byteCount()));
  plan_->run();
}

double OpNet::loss() const {
  double s = 0;
  for (double v : get<double>(loss_))
    s += v;
  return s;
}

std::vector<std::vector<double>> OpNet::gradients() const {
  std::vector<std::vector<double>> grads;
  for (const auto &id : gradIds_)
    grads.push_back(get<double>(id));
  return grads;
}

TensorData OpNet::value(const TensorId &id) const {
  TensorData t(plan_->info(id));
  std::memcpy(t.data(), plan_->address(id), static_cast<size_t>(t.byteCount()));
  return t;
}

TensorData randomDoubles(std::mt19937 &rng, const Shape &s, double lo, double hi,
                         const std::function<double(double)> &adjust) {
  std::uniform_real_distribution<double> d(lo, hi);
  TensorData t(TensorInfo(DataType::DOUBLE, s));
  for (int64_t i = 0; i < t.info().elementCount(); ++i) {
    double v = d(rng);
    t.as<double>()[i] = adjust ? adjust(v) : v;
  }
  return t;
}

void fillStreams(std::vector<Feed> &feeds, unsigned seed, const std::function<double(size_t, double)> &adjust) {
  std::mt19937 rng(seed);
  size_t k = 0;
  for (auto &f : feeds) {
    if (f.id.empty() || !f.stream) continue;
    size_t which = k++;
    f.data = randomDoubles(rng, f.data.info().shape(), -2, 2,
                           adjust ? std::function<double(double)>([&](double v) { return adjust(which, v); })
                                  : std::function<double(double)>());
  }
}

void checkGradient(const Problem &p, const std::vector<Feed> &feeds, unsigned seed, double tol) {
  OpNet analytic(p, true);
  analytic.run(feeds);
  std::vector<std::vector<double>> grads = analytic.gradients();
  OpNet plain(p, false);
  std::vector<Feed> at = feeds;
  const double h = 1e-6;
  size_t g = 0;
  for (auto &f : at) {
    if (f.id.empty() || !f.stream || !isFloatingPoint(f.data.info().dataType())) continue;
    ASSERT_LT(g, grads.size()) << p.type << " seed " << seed;
    const TensorId &gradId = analytic.gradIds()[g];
    EXPECT_EQ(analytic.plan().info(gradId).shape(), f.data.info().shape())
        << p.type << " gradient " << gradId << " seed " << seed;
    const std::vector<double> &grad = grads[g++];
    ASSERT_EQ(grad.size(), static_cast<size_t>(f.data.info().elementCount())) << p.type << " seed " << seed;
    for (int64_t i = 0; i < f.data.info().elementCount(); ++i) {
      double v = f.data.as<double>()[i];
      f.data.as<double>()[i] = v + h;
      plain.run(at);
      double up = plain.loss();
      f.data.as<double>()[i] = v - h;
      plain.run(at);
      double down = plain.loss();
      f.data.as<double>()[i] = v;
      double numeric = (up - down) / (2 * h);
      ASSERT_NEAR(grad[static_cast<size_t>(i)], numeric, tol * (1 + std::fabs(numeric)))
          << p.type << " d/d" << f.id << "[" << i << "] seed " << seed;
    }
  }
  ASSERT_EQ(g, grads.size()) << p.type << " seed " << seed;
}

void expectGradientError(ir::Graph &g, const TensorId &loss, const std::vector<TensorId> &wrt,
                         const std::string &what) {
  try {
    autodiff::buildGradients(g, loss, wrt);
    FAIL() << "expected an error naming " << what;
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

ir::Attributes attrs(std::initializer_list<std::pair<const char *, ir::AttributeValue>> kv) {
  ir::Attributes a;
  for (const auto &[k, v] : kv)
    a.set(k, v);
  return a;
}

} // namespace popart::gradcheck
