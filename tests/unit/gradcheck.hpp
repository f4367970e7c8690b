// Finite-difference gradient checks shared by the autodiff suites: a graph around one op (stream
// and constant inputs, a loss built after it), evaluated in double with and without the gradients
// of buildGradients, and the comparison of those gradients with central differences.

#pragma once

#include "backend_cpu/plan.hpp"
#include "ir/graph.hpp"

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace popart::gradcheck {

/// One input of the op under test: fed from the host (a stream, which gets a gradient if it is
/// floating point) or a constant. An empty id is an omitted optional input.
struct Feed {
  TensorId id;
  TensorData data;
  bool stream = true;
};

/// Adds the loss after the op (whose outputs \p outs have known infos) and returns its id; the
/// loss is the sum of that tensor's elements.
using Loss = std::function<TensorId(ir::Graph &g, const std::vector<TensorId> &outs, int opset)>;

/// The loss is output 0 itself.
TensorId plainLoss(ir::Graph &g, const std::vector<TensorId> &outs, int opset);
/// The loss is output 0 times uneven weights (unevenWeights), so that each element's gradient differs.
TensorId weightedLoss(ir::Graph &g, const std::vector<TensorId> &outs, int opset);
/// Loss = Σ_k ReduceSum(out_k · w_k) over the first \p count outputs, with w_k = unevenWeights(n, 3k).
Loss weightedSumLoss(size_t count = 1);

/// Weights 1 + 0.37·((i + offset) mod 7), i < \p n.
std::vector<double> unevenWeights(int64_t n, size_t offset = 0);

/// One op (in \p domain, "" for ai.onnx) with inputs \p feeds and outputs \p outs, and a loss after it.
struct Problem {
  Problem(std::string t, int o, ir::Attributes a = {}, std::vector<Feed> f = {})
      : type(std::move(t)), opset(o), attrs(std::move(a)), feeds(std::move(f)) {}
  std::string type;
  int opset = 13;
  ir::Attributes attrs;
  std::vector<Feed> feeds;
  std::vector<TensorId> outs{"y0"};
  Loss loss = weightedLoss;
  std::string domain;
  /// Whether the op's outputs are graph outputs too (to read them after a run).
  bool exposeOutputs = false;
  backend_cpu::CompileOptions options = {};
  /// Runs on the graph with gradients before buildGradients (a pass the training session runs
  /// first, such as ir::unrollControlFlow); the graph without gradients, which the finite
  /// differences run, does not get it.
  std::function<void(ir::Graph &)> beforeGradients;
};

/// Feeds x0, x1, ... (streams of \p shapes in \p type, zero) followed by the constants k0, k1, ...
/// in \p consts; a constant whose type is UNDEFINED (TensorData()) is an omitted input.
std::vector<Feed> streamsThenConsts(const std::vector<Shape> &shapes, DataType type,
                                    const std::vector<TensorData> &consts = {});

/// Builds the graph of \p p; with \p grads, the gradients of the loss with respect to every
/// floating-point stream are added as outputs and their ids stored there.
std::unique_ptr<ir::Graph> buildGraph(const Problem &p, std::vector<TensorId> *grads);

/// The graph of a Problem compiled into a plan that can be run on any feeds of the same infos.
class OpNet {
public:
  OpNet(const Problem &p, bool gradients);

  /// Copies the stream feeds (matched by id) in and runs.
  void run(const std::vector<Feed> &feeds);
  /// The sum of the loss elements (a DOUBLE tensor).
  double loss() const;
  /// The gradients of the floating-point streams in feed order, as doubles (DOUBLE tensors).
  std::vector<std::vector<double>> gradients() const;
  /// A copy of tensor \p id after a run.
  TensorData value(const TensorId &id) const;
  template <typename T> std::vector<T> get(const TensorId &id) const {
    const auto *p = static_cast<const T *>(plan_->address(id));
    return std::vector<T>(p, p + plan_->info(id).elementCount());
  }
  const ir::Graph &graph() const { return *graph_; }
  const backend_cpu::ExecutionPlan &plan() const { return *plan_; }
  /// Ids of the gradients (those of the floating-point streams, in feed order).
  const std::vector<TensorId> &gradIds() const { return gradIds_; }

private:
  std::unique_ptr<ir::Graph> graph_;
  std::vector<TensorId> gradIds_;
  TensorId loss_;
  std::unique_ptr<backend_cpu::ExecutionPlan> plan_;
};

/// Random DOUBLE values uniform in [lo, hi), each passed through \p adjust if given.
TensorData randomDoubles(std::mt19937 &rng, const Shape &s, double lo = -2, double hi = 2,
                         const std::function<double(double)> &adjust = {});

/// Fills the DOUBLE streams of \p feeds in order from mt19937(\p seed), uniform in [-2, 2), each
/// value of stream number k (counting streams only) passed through \p adjust(k, v) if given.
void fillStreams(std::vector<Feed> &feeds, unsigned seed, const std::function<double(size_t, double)> &adjust = {});

/// Checks the gradients of \p p's loss at \p feeds against central differences (step 1e-6) of
/// every element of every floating-point stream: |analytic − numeric| <= tol·(1 + |numeric|).
/// Failures name the op, the input, the element and \p seed.
void checkGradient(const Problem &p, const std::vector<Feed> &feeds, unsigned seed, double tol = 1e-5);
/// The same with the feeds of \p p.
inline void checkGradient(const Problem &p, unsigned seed, double tol = 1e-5) { checkGradient(p, p.feeds, seed, tol); }

/// Expects buildGradients(\p g, \p loss, \p wrt) to throw an error whose message contains \p what.
void expectGradientError(ir::Graph &g, const TensorId &loss, const std::vector<TensorId> &wrt, const std::string &what);

/// \p prefix followed by \p i (written with insert: operator+ trips a GCC 12 -Wrestrict false positive).
std::string named(const char *prefix, size_t i);

/// Attributes from name/value pairs.
ir::Attributes attrs(std::initializer_list<std::pair<const char *, ir::AttributeValue>> kv);

} // namespace popart::gradcheck
