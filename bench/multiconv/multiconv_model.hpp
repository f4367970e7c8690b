#pragma once
// ONNX models of convolution branches, as one ai.graphcore MultiConv node per stage or as the
// same convolutions in separate Conv nodes, written with the onnx protobuf classes (Builder's
// aiGraphcoreOpset1 is not there yet). Shared by bench/multiconv and tests/unit/test_multiconv.cpp.

#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace multiconv_model {

/// One 2-D convolution: \p x to \p y with \p out channels, a square kernel \p kernel, stride and
/// symmetric padding, weights (and a bias if \p bias) as initializers named after \p y.
struct ConvSpec {
  std::string x, y;
  int64_t in = 0, out = 0, kernel = 1, stride = 1, pad = 0;
  bool bias = true;
  int64_t dilation = 1;
};

/// A graph being written: inputs, initializers and nodes in the order added.
class OnnxGraph {
public:
  OnnxGraph() {
    model_.set_ir_version(8);
    auto *onnxOpset = model_.add_opset_import();
    onnxOpset->set_domain("");
    onnxOpset->set_version(17);
    auto *graphcore = model_.add_opset_import();
    graphcore->set_domain("ai.graphcore");
    graphcore->set_version(1);
    model_.mutable_graph()->set_name("multiconv");
  }
  onnx::GraphProto &graph() { return *model_.mutable_graph(); }

  void input(const std::string &name, const std::vector<int64_t> &shape) { setType(graph().add_input(), name, shape); }
  void output(const std::string &name, const std::vector<int64_t> &shape) {
    setType(graph().add_output(), name, shape);
  }
  /// An f32 initializer of deterministic pseudo-random values in [-scale, scale).
  void weight(const std::string &name, const std::vector<int64_t> &shape, float scale, uint32_t seed) {
    auto *t = graph().add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    int64_t n = 1;
    for (int64_t d : shape) {
      t->add_dims(d);
      n *= d;
    }
    uint32_t state = seed * 2654435761u + 1u;
    for (int64_t i = 0; i < n; ++i) {
      state = state * 1664525u + 1013904223u; // an LCG: the same values on every platform
      t->add_float_data(scale * (static_cast<float>(state >> 8) / 8388608.0f - 1.0f));
    }
  }
  onnx::NodeProto &node(const std::string &type, const std::vector<std::string> &ins,
                        const std::vector<std::string> &outs, const std::string &domain = "") {
    auto *n = graph().add_node();
    n->set_op_type(type);
    n->set_domain(domain);
    n->set_name(outs.empty() ? type : outs[0] + "_" + type);
    for (const auto &i : ins)
      n->add_input(i);
    for (const auto &o : outs)
      n->add_output(o);
    return *n;
  }
  static void ints(onnx::NodeProto &n, const std::string &name, const std::vector<int64_t> &values) {
    auto *a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t v : values)
      a->add_ints(v);
  }
  static void integer(onnx::NodeProto &n, const std::string &name, int64_t value) {
    auto *a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(value);
  }
  std::string serialize() const { return model_.SerializeAsString(); }

private:
  static void setType(onnx::ValueInfoProto *v, const std::string &name, const std::vector<int64_t> &shape) {
    v->set_name(name);
    auto *t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto::FLOAT);
    auto *s = t->mutable_shape();
    for (int64_t d : shape)
      s->add_dim()->set_dim_value(d);
  }
  onnx::ModelProto model_;
};

/// Adds the weights of \p convs and the convolutions: one MultiConv node (\p multi, PopART's layout:
/// inputs x, w, b per convolution, "" for no bias; strides, pads, dilations concatenated) or
/// one Conv node each. \p seed varies the weights.
inline void addConvs(OnnxGraph &g, const std::vector<ConvSpec> &convs, bool multi, uint32_t seed) {
  std::vector<std::string> ins, outs;
  std::vector<int64_t> strides, pads, dilations;
  for (size_t i = 0; i < convs.size(); ++i) {
    const ConvSpec &c = convs[i];
    const std::string w = c.y + "_w", b = c.bias ? c.y + "_b" : "";
    // He-like scale, so that activations keep their size through the branches.
    float scale = std::sqrt(3.0f / static_cast<float>(c.in * c.kernel * c.kernel));
    g.weight(w, {c.out, c.in, c.kernel, c.kernel}, scale, seed + static_cast<uint32_t>(2 * i));
    if (c.bias) g.weight(b, {c.out}, 0.1f, seed + static_cast<uint32_t>(2 * i + 1));
    if (!multi) {
      auto &n = g.node("Conv", {c.x, w, b}, {c.y});
      OnnxGraph::ints(n, "strides", {c.stride, c.stride});
      OnnxGraph::ints(n, "pads", {c.pad, c.pad, c.pad, c.pad});
      OnnxGraph::ints(n, "dilations", {c.dilation, c.dilation});
      continue;
    }
    ins.insert(ins.end(), {c.x, w, b});
    outs.push_back(c.y);
    strides.insert(strides.end(), {c.stride, c.stride});
    pads.insert(pads.end(), {c.pad, c.pad, c.pad, c.pad});
    dilations.insert(dilations.end(), {c.dilation, c.dilation});
  }
  if (!multi) return;
  auto &n = g.node("MultiConv", ins, outs, "ai.graphcore");
  OnnxGraph::ints(n, "strides", strides);
  OnnxGraph::ints(n, "pads", pads);
  OnnxGraph::ints(n, "dilations", dilations);
  OnnxGraph::integer(n, "numConvs", static_cast<int64_t>(convs.size()));
}

/// An Inception-style block (GoogLeNet's 3a, channels scaled by \p width / 4) on x [batch, 192·width/4,
/// size, size]: stage 1 the 1x1 branch and the 1x1 reductions before the 3x3 and 5x5 branches;
/// stage 2 the 3x3, the 5x5 and the 1x1 projection after a 3x3 max pool; Relu after each
/// convolution; y the concatenation of the four branches; loss the mean of y². With \p multi each
/// stage is one MultiConv, else separate Convs.
inline std::string inceptionBlock(int64_t batch, int64_t size, int64_t width, bool multi) {
  auto ch = [width](int64_t c) { return c * width / 4; };
  OnnxGraph g;
  g.input("x", {batch, ch(192), size, size});
  std::vector<ConvSpec> stage1{{"x", "b1_pre", ch(192), ch(64), 1, 1, 0},
                               {"x", "r3_pre", ch(192), ch(96), 1, 1, 0},
                               {"x", "r5_pre", ch(192), ch(16), 1, 1, 0}};
  addConvs(g, stage1, multi, 11);
  for (const auto &c : stage1)
    g.node("Relu", {c.y}, {c.y.substr(0, 2)});
  auto &pool = g.node("MaxPool", {"x"}, {"pool"});
  OnnxGraph::ints(pool, "kernel_shape", {3, 3});
  OnnxGraph::ints(pool, "pads", {1, 1, 1, 1});
  std::vector<ConvSpec> stage2{{"r3", "b3_pre", ch(96), ch(128), 3, 1, 1},
                               {"r5", "b5_pre", ch(16), ch(32), 5, 1, 2},
                               {"pool", "bp_pre", ch(192), ch(32), 1, 1, 0}};
  addConvs(g, stage2, multi, 23);
  for (const auto &c : stage2)
    g.node("Relu", {c.y}, {c.y.substr(0, 2)});
  auto &cat = g.node("Concat", {"b1", "b3", "b5", "bp"}, {"y"});
  OnnxGraph::integer(cat, "axis", 1);
  g.node("Mul", {"y", "y"}, {"y2"});
  auto &mean = g.node("ReduceMean", {"y2"}, {"loss"});
  OnnxGraph::integer(mean, "keepdims", 0);
  g.output("y", {batch, ch(256), size, size});
  g.output("loss", {});
  return g.serialize();
}

/// One large 3x3 convolution, x [batch, 256, 28, 28] to y of 256 channels: compute-bound work
/// whose speed-up from 1 to more threads is what the machine's cores give (bench/multiconv's bound).
inline std::string largeConvolution(int64_t batch) {
  OnnxGraph g;
  g.input("x", {batch, 256, 28, 28});
  addConvs(g, {{"x", "y", 256, 256, 3, 1, 1}}, false, 31);
  g.output("y", {batch, 256, 28, 28});
  return g.serialize();
}

} // namespace multiconv_model
