// Import and session errors on bad input (item 10 of the foundation issue), plus external data.

#include "core/tensordata.hpp"
#include "ir/graph.hpp"
#include "onnx_import/onnx_import.hpp"
#include <popart/builder.hpp>
#include <popart/error.hpp>
#include <popart/optimizer.hpp>
#include <popart/session.hpp>

#include <onnx/onnx_pb.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

namespace fs = std::filesystem;
using namespace popart;

namespace {

onnx::ModelProto reluModel(int opset = 13) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto *op = m.add_opset_import();
  op->set_domain("");
  op->set_version(opset);
  auto *g = m.mutable_graph();
  g->set_name("g");
  auto addValue = [](onnx::ValueInfoProto *v, const std::string &name, std::vector<int64_t> dims) {
    v->set_name(name);
    auto *tt = v->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) {
      if (d < 0)
        tt->mutable_shape()->add_dim()->set_dim_param("batch");
      else
        tt->mutable_shape()->add_dim()->set_dim_value(d);
    }
  };
  addValue(g->add_input(), "x", {-1, 3});
  addValue(g->add_output(), "y", {-1, 3});
  auto *n = g->add_node();
  n->set_op_type("Relu");
  n->set_name("relu1");
  n->add_input("x");
  n->add_output("y");
  return m;
}

std::string expectError(const std::function<void()> &f) {
  try {
    f();
  } catch (const error &e) {
    return e.what();
  } catch (const std::exception &e) {
    return std::string("non-popart exception: ") + e.what();
  }
  return "no error";
}

struct TempDir {
  fs::path path;
  TempDir() {
    path =
        fs::temp_directory_path() / ("popart_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  static int &counter() {
    static int c = 0;
    return c;
  }
};

void writeFile(const fs::path &p, const std::string &bytes) {
  std::ofstream out(p, std::ios::binary);
  out << bytes;
}

std::vector<float> runRelu(InferenceSession &s, std::vector<float> x, Shape shape) {
  std::vector<float> y(x.size());
  NDArrayWrapper<float> xa(x.data(), shape), ya(y.data(), shape);
  StepIO io({{"x", xa}}, {{"y", ya}});
  s.run(io);
  return y;
}

} // namespace

TEST(Import, RunsAModelFromBytesWithSymbolicBatch) {
  auto s = InferenceSession::createFromOnnxModel(reluModel().SerializeAsString(), DataFlow(1, {"y"}));
  s->prepareDevice();
  EXPECT_EQ(runRelu(*s, {-1, 2, -3, 4, 5, -6}, {2, 3}), (std::vector<float>{0, 2, 0, 4, 5, 0}));
  // A new batch size recompiles.
  EXPECT_EQ(runRelu(*s, {-1, 2, 3}, {1, 3}), (std::vector<float>{0, 2, 3}));
}

TEST(Import, ASecondImportSharesTheFirstsConstInitializers) {
  // y = Relu(x) + c: a session's recompile imports the model again and takes c's data from the
  // first import instead of a copy; Variables (training) and a c of another shape are not shared.
  auto model = [](int64_t n) {
    onnx::ModelProto m = reluModel();
    auto *g = m.mutable_graph();
    g->mutable_node(0)->set_output(0, "r");
    auto *add = g->add_node();
    add->set_op_type("Add");
    add->add_input("r");
    add->add_input("c");
    add->add_output("y");
    auto *c = g->add_initializer();
    c->set_name("c");
    c->set_data_type(onnx::TensorProto::FLOAT);
    c->add_dims(n);
    for (int64_t i = 0; i < n; ++i)
      c->add_float_data(0.5f * float(i));
    return m.SerializeAsString();
  };
  onnx_import::ImportOptions plain;
  auto first = onnx_import::importModelBytes(model(3), ".", plain, "m");
  onnx_import::ImportOptions sharing;
  sharing.initializersFrom = first.get();
  auto second = onnx_import::importModelBytes(model(3), ".", sharing, "m");
  EXPECT_EQ(second->tensor("c").data().get(), first->tensor("c").data().get());
  auto other = onnx_import::importModelBytes(model(1), ".", sharing, "m");
  EXPECT_NE(other->tensor("c").data().get(), first->tensor("c").data().get());
  EXPECT_EQ(other->tensor("c").info().shape(), Shape{1});
  sharing.initializersAsVariables = true;
  auto variables = onnx_import::importModelBytes(model(3), ".", sharing, "m");
  EXPECT_NE(variables->tensor("c").data().get(), first->tensor("c").data().get());
  EXPECT_EQ(variables->tensor("c").data()->toDoubleVector(), (std::vector<double>{0, 0.5, 1}));
  // Through a session: a new batch size recompiles on the shared weights.
  auto s = InferenceSession::createFromOnnxModel(model(3), DataFlow(1, {"y"}));
  EXPECT_EQ(runRelu(*s, {-1, 2, -3, 4, 5, -6}, {2, 3}), (std::vector<float>{0, 2.5, 1, 4, 5.5, 1}));
  EXPECT_EQ(runRelu(*s, {-1, 2, 3}, {1, 3}), (std::vector<float>{0, 2.5, 4}));
}

TEST(Import, MissingFileIsNamed) {
  std::string msg = expectError([] { onnx_import::importModelFile("/nonexistent/model.onnx"); });
  EXPECT_NE(msg.find("'/nonexistent/model.onnx' does not exist"), std::string::npos) << msg;
}

TEST(Import, TruncatedAndMalformedProtobufsAreRejected) {
  std::string bytes = reluModel().SerializeAsString();
  std::string msg =
      expectError([&] { onnx_import::importModelBytes(bytes.substr(0, bytes.size() / 2), ".", {}, "half.onnx"); });
  EXPECT_NE(msg.find("'half.onnx' is not a valid ONNX ModelProto"), std::string::npos) << msg;
  msg = expectError([&] { onnx_import::importModelBytes("\xff\xff\xff garbage", ".", {}, "junk.onnx"); });
  EXPECT_NE(msg.find("'junk.onnx' is not a valid ONNX ModelProto"), std::string::npos) << msg;
}

TEST(Import, UnsupportedOpAndOpsetAreNamed) {
  auto m = reluModel();
  m.mutable_graph()->mutable_node(0)->set_op_type("FancyOp");
  m.mutable_graph()->mutable_node(0)->set_domain("com.example");
  auto *op = m.add_opset_import();
  op->set_domain("com.example");
  op->set_version(1);
  onnx_import::ImportOptions noCheck;
  noCheck.check = false;
  std::string msg = expectError([&] { onnx_import::importModelBytes(m.SerializeAsString(), ".", noCheck, "m"); });
  EXPECT_NE(msg.find("unsupported op com.example::FancyOp at opset 1 (node 'relu1')"), std::string::npos) << msg;
  msg = expectError([&] { onnx_import::importModelBytes(reluModel(19).SerializeAsString(), ".", noCheck, "m19"); });
  EXPECT_NE(msg.find("opset 19"), std::string::npos) << msg;
}

TEST(Import, InternalAttributesAreRefusedOnAModelsNodes) {
  // popart_* attributes are the runtime's own (OpDef::internalAttributes): a model cannot set
  // one, e.g. a fused activation a kernel would then apply unasked.
  auto m = reluModel();
  auto *attr = m.mutable_graph()->mutable_node(0)->add_attribute();
  attr->set_name("popart_activation");
  attr->set_type(onnx::AttributeProto::STRING);
  attr->set_s("Relu");
  onnx_import::ImportOptions noCheck;
  noCheck.check = false;
  std::string msg = expectError([&] { onnx_import::importModelBytes(m.SerializeAsString(), ".", noCheck, "m"); });
  EXPECT_NE(msg.find("node 'relu1' (Relu): attribute 'popart_activation' is reserved"), std::string::npos) << msg;
}

TEST(Import, CycleIsRejectedWithTheTensorNamed) {
  auto m = reluModel();
  auto *g = m.mutable_graph();
  g->mutable_node(0)->set_input(0, "z");
  auto *n = g->add_node();
  n->set_op_type("Relu");
  n->set_name("relu2");
  n->add_input("y");
  n->add_output("z");
  onnx_import::ImportOptions noCheck;
  noCheck.check = false;
  std::string msg = expectError([&] { onnx_import::importModelBytes(m.SerializeAsString(), ".", noCheck, "cyc"); });
  EXPECT_NE(msg.find("'z'"), std::string::npos) << msg;
}

TEST(Import, DanglingTensorIsNamed) {
  auto m = reluModel();
  m.mutable_graph()->mutable_node(0)->set_input(0, "ghost");
  onnx_import::ImportOptions noCheck;
  noCheck.check = false;
  std::string msg = expectError([&] { onnx_import::importModelBytes(m.SerializeAsString(), ".", noCheck, "d"); });
  EXPECT_NE(msg.find("'ghost'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Relu 'relu1'"), std::string::npos) << msg;
}

TEST(Session, MissingInputWrongShapeAndWrongTypeAreNamed) {
  auto s = InferenceSession::createFromOnnxModel(reluModel().SerializeAsString(), DataFlow(1, {"y"}));
  std::vector<float> y(6);
  NDArrayWrapper<float> ya(y.data(), {2, 3});
  StepIO missing({}, {{"y", ya}});
  std::string msg = expectError([&] { s->run(missing); });
  EXPECT_NE(msg.find("input 'x' is missing"), std::string::npos) << msg;
  std::vector<float> x(8);
  NDArrayWrapper<float> wrongShape(x.data(), {2, 4});
  StepIO io1({{"x", wrongShape}}, {{"y", ya}});
  msg = expectError([&] { s->run(io1); });
  EXPECT_NE(msg.find("input 'x' has shape [2,4] but the model expects [?,3]"), std::string::npos) << msg;
  std::vector<int32_t> xi(6);
  NDArrayWrapper<int32_t> wrongType(xi.data(), {2, 3});
  StepIO io2({{"x", wrongType}}, {{"y", ya}});
  msg = expectError([&] { s->run(io2); });
  EXPECT_NE(msg.find("input 'x' has type INT32 but the model expects FLOAT"), std::string::npos) << msg;
}

namespace {

/// The Relu model made an Add of x and "w", a FLOAT[3] initializer stored externally at \p location.
onnx::ModelProto addOfExternalWeight(const std::string &location) {
  onnx::ModelProto m = reluModel();
  auto *g = m.mutable_graph();
  g->mutable_node(0)->set_op_type("Add");
  g->mutable_node(0)->add_input("w");
  auto *w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(3);
  w->set_data_location(onnx::TensorProto::EXTERNAL);
  auto *kv = w->add_external_data();
  kv->set_key("location");
  kv->set_value(location);
  return m;
}

} // namespace

TEST(Import, ExternalDataLoadsInsideTheFolderAndIsRefusedOutside) {
  TempDir dir;
  auto makeModel = [](const std::string &location) {
    onnx::ModelProto m = addOfExternalWeight(location);
    auto *kv = m.mutable_graph()->mutable_initializer(0)->add_external_data();
    kv->set_key("offset");
    kv->set_value("4");
    return m;
  };
  float weights[4] = {99.f, 1.f, 2.f, 3.f};
  writeFile(dir.path / "weights.bin", std::string(reinterpret_cast<char *>(weights), sizeof weights));
  writeFile(dir.path / "good.onnx", makeModel("weights.bin").SerializeAsString());
  auto s = InferenceSession::createFromOnnxModel((dir.path / "good.onnx").string(), DataFlow(1, {"y"}));
  EXPECT_EQ(runRelu(*s, {1, 1, 1}, {1, 3}), (std::vector<float>{2, 3, 4}));

  writeFile(dir.path / "up.onnx", makeModel("../weights.bin").SerializeAsString());
  std::string msg = expectError([&] { onnx_import::importModelFile((dir.path / "up.onnx").string()); });
  EXPECT_NE(msg.find("tensor 'w': external data location '../weights.bin' leaves the model's folder"),
            std::string::npos)
      << msg;
  writeFile(dir.path / "abs.onnx", makeModel((dir.path / "weights.bin").string()).SerializeAsString());
  msg = expectError([&] { onnx_import::importModelFile((dir.path / "abs.onnx").string()); });
  EXPECT_NE(msg.find("is an absolute path"), std::string::npos) << msg;
  writeFile(dir.path / "short.onnx", makeModel("weights_missing.bin").SerializeAsString());
  msg = expectError([&] { onnx_import::importModelFile((dir.path / "short.onnx").string()); });
  EXPECT_NE(msg.find("cannot open external data file"), std::string::npos) << msg;
}

TEST(Import, TheCheckerChecksEveryNodeOfAModelWithExternalData) {
  // The checker resolves external files against the working directory: the import checks a copy
  // whose external tensors are inline and empty, so that their files (its own checks) do not stop
  // the checker before the nodes. A missing file and a bad node are each refused.
  TempDir dir;
  auto makeModel = [](const std::string &location, bool badNode) {
    onnx::ModelProto m = addOfExternalWeight(location);
    if (badNode) {
      auto *a = m.mutable_graph()->mutable_node(0)->add_attribute();
      a->set_name("external_axis");
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(1);
    }
    return m;
  };
  const float weights[3] = {1.f, 2.f, 3.f};
  writeFile(dir.path / "weights.bin", std::string(reinterpret_cast<const char *>(weights), sizeof weights));
  writeFile(dir.path / "good.onnx", makeModel("weights.bin", false).SerializeAsString());
  EXPECT_NO_THROW(onnx_import::importModelFile((dir.path / "good.onnx").string()));
  for (const char *location : {"weights.bin", "missing.bin"}) {
    writeFile(dir.path / "bad.onnx", makeModel(location, true).SerializeAsString());
    std::string msg = expectError([&] { onnx_import::importModelFile((dir.path / "bad.onnx").string()); });
    EXPECT_NE(msg.find("fails the ONNX checker: Unrecognized attribute: external_axis for operator Add"),
              std::string::npos)
        << location << ": " << msg;
  }
}

namespace {

/// The bytes of file \p p.
std::string fileBytes(const fs::path &p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// \p model (serialized) with initializer \p name moved to \p file at \p offset as external data.
std::string withExternalInitializer(const std::string &model, const std::string &name, const fs::path &file,
                                    int64_t offset) {
  onnx::ModelProto m;
  EXPECT_TRUE(m.ParseFromString(model));
  for (auto &t : *m.mutable_graph()->mutable_initializer()) {
    if (t.name() != name) continue;
    EXPECT_TRUE(t.has_raw_data()) << name;
    std::string bytes(static_cast<size_t>(offset), '\x7f'); // not a float anyone expects
    bytes += t.raw_data();
    bytes += std::string(8, '\x7f');
    writeFile(file, bytes);
    t.clear_raw_data();
    t.set_data_location(onnx::TensorProto::EXTERNAL);
    for (const auto &[key, value] : {std::pair<std::string, std::string>{"location", file.filename().string()},
                                     {"offset", std::to_string(offset)},
                                     {"length", std::to_string(bytes.size() - offset - 8)}}) {
      auto *kv = t.add_external_data();
      kv->set_key(key);
      kv->set_value(value);
    }
  }
  return m.SerializeAsString();
}

} // namespace

TEST(Import, ExternalDataAtAlignedOffsetsIsMappedAndNeverWritten) {
  TempDir dir;
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  constexpr int64_t n = 16384; // 64 KiB: external tensors this large are mapped
  std::vector<float> w0(n), xv(n), stepped(n);
  for (int64_t i = 0; i < n; ++i) {
    w0[i] = static_cast<float>(i % 97) * 0.25f;
    xv[i] = static_cast<float>(i % 13) - 6.f;
    stepped[i] = w0[i] - 0.5f * xv[i]; // exact: quarters and halves of small integers
  }
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {n}), "x");
  TensorId w = b->addInitializedInputTensor(w0.data(), TensorInfo(DataType::FLOAT, {n}), "w");
  b->addOutputTensor(ai.reducesum({ai.mul({w, x})}, std::nullopt, 0));
  // At offset 128 the weight is mapped; at 132 (not a multiple of 64) it is read.
  for (int64_t offset : {128, 132}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    const fs::path model = dir.path / "model.onnx", weights = dir.path / "weights.bin";
    writeFile(model, withExternalInitializer(b->getModelProto(), w, weights, offset));
    const std::string stored = fileBytes(weights);
    auto graph = onnx_import::importModelFile(model.string());
    const auto &data = graph->tensor(w).data();
    ASSERT_TRUE(data);
    EXPECT_EQ(data->mapped(), offset % 64 == 0);
    EXPECT_EQ(std::vector<float>(data->as<float>(), data->as<float>() + n), w0);
    data->as<float>()[0] = 42.f; // copy-on-write: the file keeps its bytes
    graph.reset();
    EXPECT_EQ(fileBytes(weights), stored);

    // A training step updates the weight in memory only.
    SGD sgd({{"defaultLearningRate", {0.5f, false}}});
    auto s = TrainingSession::createFromOnnxModel(model.string(), DataFlow(1, std::vector<TensorId>{}), "", sgd);
    s->prepareDevice();
    s->weightsFromHost();
    NDArrayWrapper<float> xa(xv.data(), {n});
    std::map<TensorId, IArray &> inputs{{x, xa}}, anchors;
    StepIO io(inputs, anchors);
    s->run(io);
    std::vector<float> after(n);
    NDArrayWrapper<float> afterArray(after.data(), {n});
    WeightsIO read;
    read.insert(w, afterArray);
    s->readWeights(read);
    EXPECT_EQ(after, stepped); // w - 0.5 x
    s.reset();
    EXPECT_EQ(fileBytes(weights), stored);
  }
}

TEST(Import, TensorProtoFilesRoundTrip) {
  TempDir dir;
  TensorData t = TensorData::fromDoubles(DataType::INT16, {2, 2}, {1, -2, 3, -4});
  writeFile(dir.path / "t.pb", onnx_import::serializeTensorProto(t, "t"));
  TensorData back = onnx_import::readTensorProtoFile((dir.path / "t.pb").string());
  EXPECT_EQ(back.info(), t.info());
  EXPECT_EQ(back.toInt64Vector(), (std::vector<int64_t>{1, -2, 3, -4}));
  writeFile(dir.path / "bad.pb", "\x0a\xff");
  std::string msg = expectError([&] { onnx_import::readTensorProtoFile((dir.path / "bad.pb").string()); });
  EXPECT_NE(msg.find("bad.pb' is not a valid serialized TensorProto"), std::string::npos) << msg;
}

TEST(DataFlowTest, AnchorReturnTypes) {
  auto m = reluModel();
  DataFlow df(4, {{"y", AnchorReturnType("EVERYN", 2)}});
  auto s = InferenceSession::createFromOnnxModel(m.SerializeAsString(), df);
  std::vector<float> x{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::vector<float> y(6);
  NDArrayWrapper<float> xa(x.data(), {4, 1, 3}), ya(y.data(), {2, 1, 3});
  StepIO io({{"x", xa}}, {{"y", ya}});
  s->run(io);
  EXPECT_EQ(y, (std::vector<float>{4, 5, 6, 10, 11, 12}));
  DataFlow sum(4, {{"y", AnchorReturnType("SUM")}});
  auto s2 = InferenceSession::createFromOnnxModel(m.SerializeAsString(), sum);
  std::vector<float> ys(3);
  NDArrayWrapper<float> ysa(ys.data(), {1, 3});
  StepIO io2({{"x", xa}}, {{"y", ysa}});
  s2->run(io2);
  EXPECT_EQ(ys, (std::vector<float>{22, 26, 30}));
  EXPECT_THROW(AnchorReturnType("SOMETIMES"), error);
  EXPECT_THROW(DataFlow(4, {{"y", AnchorReturnType("EVERYN", 3)}}), error);
}
