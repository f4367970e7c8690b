#include "onnx_import/onnx_import.hpp"
#include "core/log.hpp"
#include "ir/annotations.hpp"
#include "ir/internal_attributes.hpp"
#include <popart/error.hpp>

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

namespace popart::onnx_import {

namespace fs = std::filesystem;

namespace {

std::string readFile(const std::string &path, const char *what) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw error(what, " '", path, "' does not exist");
  if (fs::is_directory(path, ec)) throw error(what, " '", path, "' is a directory, expected a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error("cannot open ", what, " '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool parseProto(google::protobuf::MessageLite &message, const std::string &bytes) {
  google::protobuf::io::ArrayInputStream raw(bytes.data(), static_cast<int>(bytes.size()));
  google::protobuf::io::CodedInputStream coded(&raw);
  coded.SetTotalBytesLimit(std::numeric_limits<int>::max());
  return message.ParseFromCodedStream(&coded) && coded.ConsumedEntireMessage();
}

/// Where an external-data tensor's bytes are: a file in the model's folder and a range of it.
struct ExternalRange {
  fs::path file;
  int64_t offset = 0, length = 0;
};

/// The external data range of \p t, checked against its file without reading it (so that a shape
/// is checked against it before anything is allocated), refusing paths that leave the model folder.
ExternalRange externalRange(const onnx::TensorProto &t, const std::string &baseDir) {
  std::string location;
  int64_t offset = 0, length = -1;
  auto number = [&](const std::string &key, const std::string &value) {
    size_t used = 0;
    int64_t v = -1;
    try {
      v = std::stoll(value, &used);
    } catch (const std::logic_error &) { // not a number, or out of range
    }
    if (v < 0 || used != value.size())
      throw error("tensor '", t.name(), "': external data ", key, " '", value, "' is not a non-negative integer");
    return v;
  };
  for (const auto &kv : t.external_data()) {
    if (kv.key() == "location")
      location = kv.value();
    else if (kv.key() == "offset")
      offset = number("offset", kv.value());
    else if (kv.key() == "length")
      length = number("length", kv.value());
  }
  if (location.empty()) throw error("tensor '", t.name(), "': external data has no location");
  fs::path rel(location);
  if (rel.is_absolute())
    throw error("tensor '", t.name(), "': external data location '", location,
                "' is an absolute path; only paths relative to the model's folder are allowed");
  for (const auto &part : rel)
    if (part == "..")
      throw error("tensor '", t.name(), "': external data location '", location,
                  "' leaves the model's folder ('..' is not allowed)");
  fs::path full = fs::path(baseDir) / rel;
  std::ifstream in(full, std::ios::binary);
  if (!in) throw error("tensor '", t.name(), "': cannot open external data file '", full.string(), "'");
  in.seekg(0, std::ios::end);
  int64_t size = in.tellg();
  if (length < 0) length = size - offset;
  if (offset < 0 || length < 0 || offset > size || length > size - offset)
    throw error("tensor '", t.name(), "': external data range [", offset, ", ", offset + length, ") is outside file '",
                full.string(), "' of ", size, " bytes");
  return {full, offset, length};
}

/// Reads range \p r of external-data tensor \p t straight into \p dst (its final buffer: a large
/// initializer is not held twice), for ranges that TensorData::mapFile cannot map.
void readExternalData(const onnx::TensorProto &t, const ExternalRange &r, void *dst) {
  std::ifstream in(r.file, std::ios::binary);
  if (!in) throw error("tensor '", t.name(), "': cannot open external data file '", r.file.string(), "'");
  in.seekg(r.offset);
  in.read(static_cast<char *>(dst), r.length);
  if (in.gcount() != r.length)
    throw error("tensor '", t.name(), "': read ", in.gcount(), " of ", r.length, " bytes of external data file '",
                r.file.string(), "'");
}

Shape shapeFromDims(const google::protobuf::RepeatedField<int64_t> &dims) { return Shape(dims.begin(), dims.end()); }

TensorData tensorFromProto(const onnx::TensorProto &t, const std::string &baseDir) {
  DataType type = dataTypeFromOnnx(t.data_type());
  if (type == DataType::UNDEFINED) throw error("tensor '", t.name(), "' has no data type");
  if (type == DataType::COMPLEX64 || type == DataType::COMPLEX128)
    throw error("tensor '", t.name(), "': complex tensors are not supported");
  TensorInfo info(type, shapeFromDims(t.dims()));
  for (int64_t d : info.shape())
    if (d < 0) throw error("tensor '", t.name(), "' has a negative dimension in ", toString(info.shape()));
  int64_t n = 0;
  try {
    n = info.elementCount();
  } catch (const error &e) {
    throw error("tensor '", t.name(), "': ", e.what());
  }
  // Every element stored in the proto takes at least a byte of it: a shape that needs more is
  // refused before its data is allocated. External data is checked against its file instead.
  const auto stored = static_cast<int64_t>(t.ByteSizeLong());
  if (t.data_location() != onnx::TensorProto::EXTERNAL && n > stored)
    throw error("tensor '", t.name(), "': shape ", toString(info.shape()), " needs ", n,
                " elements, but the tensor holds only ", stored, " bytes");
  ExternalRange external;
  if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    external = externalRange(t, baseDir);
    // Compared in elements first: the shape's size in bytes may not fit in int64.
    const auto width = static_cast<int64_t>(dataTypeSize(type));
    const int64_t have = external.length;
    if (width == 0 || n > have / width || n * width != have)
      throw error("tensor '", t.name(), "': external data has ", have, " bytes, shape ", toString(info.shape()), " of ",
                  toString(type), " needs ", n, " elements");
  }
  // External data of 64 KiB or more at a 64-byte aligned offset is mapped, not read: its pages stay
  // the file's until written (a training step's update), so a large inference weight that a kernel
  // packs into its own layout leaves only that layout in memory the system must keep. Smaller
  // tensors are read: a mapping takes at least a page, and a process has a limited number of them.
  constexpr int64_t kMapFromBytes = int64_t{64} << 10;
  if (t.data_location() == onnx::TensorProto::EXTERNAL && type != DataType::STRING && n > 0 &&
      external.length >= kMapFromBytes)
    if (auto mapped = TensorData::mapFile(info, external.file.string(), external.offset)) return std::move(*mapped);
  TensorData data(info);
  if (type == DataType::STRING) {
    if (t.string_data_size() != n)
      throw error("tensor '", t.name(), "': ", t.string_data_size(), " strings for shape ", toString(info.shape()));
    for (int64_t i = 0; i < n; ++i)
      data.strings()[i] = t.string_data(static_cast<int>(i));
    return data;
  }
  auto expectCount = [&](int64_t have, const char *field) {
    if (have != n)
      throw error("tensor '", t.name(), "': ", field, " holds ", have, " values but shape ", toString(info.shape()),
                  " needs ", n);
  };
  if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    readExternalData(t, external, data.data());
  } else if (t.has_raw_data()) {
    if (static_cast<int64_t>(t.raw_data().size()) != info.byteCount())
      throw error("tensor '", t.name(), "': raw_data has ", t.raw_data().size(), " bytes, expected ", info.byteCount(),
                  " for ", info.toString());
    std::memcpy(data.data(), t.raw_data().data(), t.raw_data().size());
  } else {
    switch (type) {
    case DataType::FLOAT:
      expectCount(t.float_data_size(), "float_data");
      std::copy(t.float_data().begin(), t.float_data().end(), data.as<float>());
      break;
    case DataType::DOUBLE:
      expectCount(t.double_data_size(), "double_data");
      std::copy(t.double_data().begin(), t.double_data().end(), data.as<double>());
      break;
    case DataType::INT64:
      expectCount(t.int64_data_size(), "int64_data");
      std::copy(t.int64_data().begin(), t.int64_data().end(), data.as<int64_t>());
      break;
    case DataType::UINT32:
    case DataType::UINT64:
      expectCount(t.uint64_data_size(), "uint64_data");
      for (int64_t i = 0; i < n; ++i) {
        uint64_t v = t.uint64_data(static_cast<int>(i));
        if (type == DataType::UINT32)
          data.as<uint32_t>()[i] = static_cast<uint32_t>(v);
        else
          data.as<uint64_t>()[i] = v;
      }
      break;
    default: { // int32_data carries INT32, INT16, INT8, UINT16, UINT8, BOOL, FLOAT16 and BFLOAT16
      expectCount(t.int32_data_size(), "int32_data");
      size_t size = dataTypeSize(type);
      auto *out = static_cast<uint8_t *>(data.data());
      for (int64_t i = 0; i < n; ++i) {
        int32_t v = t.int32_data(static_cast<int>(i));
        std::memcpy(out + i * size, &v, size); // little-endian: the low bytes
      }
    }
    }
  }
  return data;
}

/// Converts a subgraph attribute; appends the outer-scope tensors it reads to \p captures.
using SubgraphImporter =
    std::function<std::shared_ptr<const ir::Graph>(const onnx::GraphProto &, std::vector<std::string> &captures)>;

TensorInfo infoFromType(const onnx::TypeProto &type, const std::string &name);

ir::Attributes convertAttributes(const onnx::NodeProto &node, const std::string &baseDir,
                                 const SubgraphImporter &subgraph, std::vector<std::string> &captures) {
  ir::Attributes attrs;
  for (const auto &a : node.attribute()) {
    // The runtime's own attributes (OpDef::internalAttributes) are never read from a model.
    if (a.name().rfind("popart_", 0) == 0)
      throw error("node '", node.name(), "' (", node.op_type(), "): attribute '", a.name(),
                  "' is reserved: names starting with popart_ are the runtime's internal attributes");
    switch (a.type()) {
    case onnx::AttributeProto::FLOAT: attrs.set(a.name(), a.f()); break;
    case onnx::AttributeProto::INT: attrs.set(a.name(), static_cast<int64_t>(a.i())); break;
    case onnx::AttributeProto::STRING: attrs.set(a.name(), a.s()); break;
    case onnx::AttributeProto::FLOATS:
      attrs.set(a.name(), std::vector<float>(a.floats().begin(), a.floats().end()));
      break;
    case onnx::AttributeProto::INTS: attrs.set(a.name(), std::vector<int64_t>(a.ints().begin(), a.ints().end())); break;
    case onnx::AttributeProto::STRINGS:
      attrs.set(a.name(), std::vector<std::string>(a.strings().begin(), a.strings().end()));
      break;
    case onnx::AttributeProto::TENSOR:
      attrs.set(a.name(), std::make_shared<TensorData>(tensorFromProto(a.t(), baseDir)));
      break;
    case onnx::AttributeProto::GRAPH: attrs.set(a.name(), subgraph(a.g(), captures)); break;
    case onnx::AttributeProto::TYPE_PROTO: {
      // Stored as ints {kind, element type, dims...} (Optional's "type").
      TensorInfo info = infoFromType(a.tp(), a.name());
      std::vector<int64_t> v{static_cast<int64_t>(info.valueKind()), static_cast<int64_t>(info.dataType())};
      v.insert(v.end(), info.shape().begin(), info.shape().end());
      attrs.set(a.name(), v);
      break;
    }
    case onnx::AttributeProto::GRAPHS:
      throw error("node '", node.name(), "' (", node.op_type(), "): attribute '", a.name(),
                  "' is a list of subgraphs, which is not supported");
    default:
      throw error("node '", node.name(), "' (", node.op_type(), "): attribute '", a.name(), "' has unsupported type ",
                  static_cast<int>(a.type()));
    }
  }
  return attrs;
}

/// Constant's value_float, value_ints, ... all become one tensor attribute "value".
void canonicalizeConstant(ir::Attributes &attrs, const std::string &nodeName) {
  if (attrs.has("value")) return;
  std::shared_ptr<TensorData> t;
  if (attrs.has("value_float"))
    t = std::make_shared<TensorData>(TensorData::fromDoubles(DataType::FLOAT, {}, {attrs.getFloat("value_float")}));
  else if (attrs.has("value_int"))
    t = std::make_shared<TensorData>(TensorData::fromInt64({}, {attrs.getInt("value_int")}));
  else if (attrs.has("value_floats")) {
    auto v = attrs.getFloats("value_floats");
    t = std::make_shared<TensorData>(TensorData::fromDoubles(DataType::FLOAT, {static_cast<int64_t>(v.size())},
                                                             std::vector<double>(v.begin(), v.end())));
  } else if (attrs.has("value_ints")) {
    auto v = attrs.getInts("value_ints");
    t = std::make_shared<TensorData>(TensorData::fromInt64({static_cast<int64_t>(v.size())}, v));
  } else {
    throw error("Constant '", nodeName, "': no supported value attribute (value, value_float(s), value_int(s))");
  }
  for (const char *k : {"value_float", "value_int", "value_floats", "value_ints"})
    attrs.erase(k);
  attrs.set("value", t);
}

TensorInfo infoFromTensorType(const onnx::TypeProto::Tensor &tt) {
  Shape shape;
  if (tt.has_shape())
    for (const auto &d : tt.shape().dim())
      shape.push_back(d.has_dim_value() ? d.dim_value() : -1);
  return TensorInfo(dataTypeFromOnnx(tt.elem_type()), shape);
}

TensorInfo infoFromType(const onnx::TypeProto &type, const std::string &name) {
  if (type.has_tensor_type()) return infoFromTensorType(type.tensor_type());
  auto sequenceOf = [&](const onnx::TypeProto &elem, ValueKind kind) {
    if (!elem.has_tensor_type()) throw error("'", name, "' is a sequence of non-tensors, which is not supported");
    TensorInfo e = infoFromTensorType(elem.tensor_type());
    return TensorInfo(kind, e.dataType(), e.shape());
  };
  if (type.has_sequence_type()) return sequenceOf(type.sequence_type().elem_type(), ValueKind::Sequence);
  if (type.has_optional_type()) {
    const auto &elem = type.optional_type().elem_type();
    if (elem.has_tensor_type()) {
      TensorInfo e = infoFromTensorType(elem.tensor_type());
      return TensorInfo(ValueKind::OptionalTensor, e.dataType(), e.shape());
    }
    if (elem.has_sequence_type()) return sequenceOf(elem.sequence_type().elem_type(), ValueKind::OptionalSequence);
  }
  throw error("'", name, "' is not a tensor, sequence or optional (maps are not supported)");
}

TensorInfo infoFromValueInfo(const onnx::ValueInfoProto &vi) { return infoFromType(vi.type(), vi.name()); }

/// Tensors visible to a subgraph: its enclosing graphs' (ONNX's outer scope), innermost first.
struct Scope {
  const ir::Graph *graph = nullptr;
  const Scope *outer = nullptr;
  const ir::Tensor *find(const std::string &name) const {
    for (const Scope *s = this; s && s->graph; s = s->outer)
      if (const ir::Tensor *t = s->graph->findTensor(name)) return t;
    return nullptr;
  }
};

/// Makes \p name usable in \p graph, a subgraph enclosed by \p outer: an outer constant is
/// shared, anything else becomes a captured input of the subgraph (listed in \p captures).
void resolveOuterName(ir::Graph &graph, const Scope *outer, const std::string &name, std::vector<std::string> &captures,
                      const std::string &where) {
  if (name.empty() || graph.hasTensor(name)) return;
  const ir::Tensor *t = outer ? outer->find(name) : nullptr;
  if (!t) throw error(where, ": tensor '", name, "' is not defined in its graph or an enclosing one");
  if (t->isConst()) {
    graph.addTensor(name, ir::TensorKind::Const, t->info()).setData(t->data());
    return;
  }
  graph.addTensor(name, ir::TensorKind::Stream, t->info());
  graph.addInput(name);
  captures.push_back(name);
}

/// Adds the nodes of \p g to \p graph. \p outer is null for the main graph; for a subgraph,
/// names from enclosing graphs are resolved through it and collected in \p captures.
void addNodes(const onnx::GraphProto &g, ir::Graph &graph, const Scope *outer, const std::string &baseDir,
              std::vector<std::string> &captures) {
  Scope here{&graph, outer};
  SubgraphImporter subgraph = [&](const onnx::GraphProto &sg, std::vector<std::string> &nodeCaptures) {
    auto sub = std::make_shared<ir::Graph>();
    sub->opsets() = graph.opsets();
    for (const auto &init : sg.initializer()) {
      auto data = std::make_shared<TensorData>(tensorFromProto(init, baseDir));
      sub->addTensor(init.name(), ir::TensorKind::Const, data->info()).setData(data);
    }
    for (const auto &input : sg.input()) {
      if (sub->hasTensor(input.name())) continue;
      sub->addTensor(input.name(), ir::TensorKind::Stream, infoFromValueInfo(input));
      sub->addInput(input.name());
    }
    std::vector<std::string> inner;
    addNodes(sg, *sub, &here, baseDir, inner);
    for (const auto &output : sg.output()) {
      resolveOuterName(*sub, &here, output.name(), inner, "subgraph '" + sg.name() + "' output");
      ir::Tensor &t = sub->tensor(output.name());
      // Declared types, used when the subgraph's shapes depend on values known only at run time.
      if (t.producer() && !t.info().isKnown() && output.has_type()) t.setInfo(infoFromValueInfo(output));
      sub->addOutput(output.name());
    }
    for (const auto &name : inner)
      if (std::find(nodeCaptures.begin(), nodeCaptures.end(), name) == nodeCaptures.end()) nodeCaptures.push_back(name);
    return std::shared_ptr<const ir::Graph>(std::move(sub));
  };
  for (const auto &node : g.node()) {
    std::string domain = ir::canonicalDomain(node.domain());
    auto it = graph.opsets().find(domain);
    if (it == graph.opsets().end())
      throw error("node '", node.name(), "' (", node.op_type(), ") uses domain '", domain,
                  "', which the model does not import");
    std::vector<std::string> nodeCaptures;
    ir::Attributes attrs = convertAttributes(node, baseDir, subgraph, nodeCaptures);
    if (node.op_type() == "Constant" && domain == "ai.onnx") canonicalizeConstant(attrs, node.name());
    std::vector<TensorId> ins(node.input().begin(), node.input().end());
    std::vector<TensorId> outs(node.output().begin(), node.output().end());
    std::string where = "node '" + node.name() + "' (" + node.op_type() + ")";
    if (!nodeCaptures.empty()) {
      // Outer-scope tensors the node's subgraphs read become inputs of the node, so that
      // scheduling, liveness and dead-code removal see them.
      attrs.set(ir::internal_attr::kCaptures, nodeCaptures);
      ins.insert(ins.end(), nodeCaptures.begin(), nodeCaptures.end());
    }
    if (outer)
      for (const auto &name : ins)
        resolveOuterName(graph, outer, name, captures, where);
    graph.addOp(node.op_type(), domain, it->second, node.name(), std::move(attrs), ins, outs);
  }
}

/// Calls \p f on every subgraph of the nodes of \p g (If branches, Loop and Scan bodies), nested ones too.
void forEachSubgraph(const onnx::GraphProto &g, const std::function<void(const onnx::GraphProto &)> &f) {
  for (const auto &node : g.node())
    for (const auto &a : node.attribute()) {
      if (a.has_g()) {
        f(a.g());
        forEachSubgraph(a.g(), f);
      }
      for (const auto &sg : a.graphs()) {
        f(sg);
        forEachSubgraph(sg, f);
      }
    }
}

/// True if a subgraph of \p g has an input or output without a declared type.
bool hasUntypedSubgraphValues(const onnx::GraphProto &g) {
  bool untyped = false;
  forEachSubgraph(g, [&](const onnx::GraphProto &sg) {
    for (const auto &v : sg.input())
      untyped = untyped || !v.has_type() || v.type().value_case() == onnx::TypeProto::VALUE_NOT_SET;
    for (const auto &v : sg.output())
      untyped = untyped || !v.has_type() || v.type().value_case() == onnx::TypeProto::VALUE_NOT_SET;
  });
  return untyped;
}

/// Refuses a ConvTranspose whose X and W have declared shapes (graph inputs, initializers,
/// value_info, in \p g and its subgraphs) of different ranks or W of rank below 3.
void checkConvTransposeRanks(const onnx::GraphProto &main) {
  std::map<std::string, int> ranks;
  auto collect = [&](const onnx::GraphProto &g) {
    for (const auto &t : g.initializer())
      ranks[t.name()] = t.dims_size();
    for (const auto *values : {&g.input(), &g.value_info(), &g.output()})
      for (const auto &v : *values)
        if (v.type().has_tensor_type() && v.type().tensor_type().has_shape())
          ranks[v.name()] = v.type().tensor_type().shape().dim_size();
  };
  auto check = [&](const onnx::GraphProto &g) {
    for (const auto &node : g.node()) {
      if (node.op_type() != "ConvTranspose" || ir::canonicalDomain(node.domain()) != "ai.onnx" || node.input_size() < 2)
        continue;
      auto x = ranks.find(node.input(0)), w = ranks.find(node.input(1));
      if (w == ranks.end()) continue;
      if (w->second < 3 || (x != ranks.end() && x->second != w->second))
        throw error(node.name().empty() ? std::string("a ConvTranspose node")
                                        : "node '" + node.name() + "' (ConvTranspose)",
                    ": weights '", node.input(1), "' have rank ", w->second,
                    x != ranks.end() ? ", X '" + node.input(0) + "' rank " + std::to_string(x->second) : std::string(),
                    "; expected the same rank of 3 or more");
    }
  };
  collect(main);
  forEachSubgraph(main, collect);
  check(main);
  forEachSubgraph(main, check);
}

/// Calls \p f on every TensorProto of \p g that may hold external data: initializers (dense and
/// sparse) and tensor attributes, in \p g and all its subgraphs. Only tensors that are present are
/// visited (never a field's shared default instance), so a caller that owns \p g may modify them.
void forEachTensor(const onnx::GraphProto &g, const std::function<void(const onnx::TensorProto &)> &f) {
  auto sparse = [&](const onnx::SparseTensorProto &s) {
    if (s.has_values()) f(s.values());
    if (s.has_indices()) f(s.indices());
  };
  for (const auto &t : g.initializer())
    f(t);
  for (const auto &s : g.sparse_initializer())
    sparse(s);
  for (const auto &node : g.node())
    for (const auto &a : node.attribute()) {
      if (a.has_t()) f(a.t());
      for (const auto &t : a.tensors())
        f(t);
      if (a.has_sparse_tensor()) sparse(a.sparse_tensor());
      if (a.has_g()) forEachTensor(a.g(), f);
      for (const auto &sg : a.graphs())
        forEachTensor(sg, f);
    }
}

/// True if a tensor of \p g (see forEachTensor) or of its subgraphs is stored externally.
bool hasExternalData(const onnx::GraphProto &g) {
  bool external = false;
  forEachTensor(
      g, [&](const onnx::TensorProto &t) { external = external || t.data_location() == onnx::TensorProto::EXTERNAL; });
  return external;
}

/// Runs the ONNX checker on \p model. The checker resolves external data files against the working
/// directory, so a model with external data is checked as a copy whose external tensors are empty
/// and inline: the import checks those files itself (inside the model's folder, present, large
/// enough) when it loads them, and the checker still checks every node. (Skipping the checker on
/// any error that mentioned "external" let through a Scan whose attribute name contained it, and
/// libonnx's Scan inference then dereferenced its missing num_scan_inputs: a fuzz finding.)
void checkModel(const onnx::ModelProto &model, const std::string &sourceName) {
  std::optional<onnx::ModelProto> inline_;
  if (hasExternalData(model.graph())) {
    inline_.emplace(model);
    forEachTensor(inline_->graph(), [](const onnx::TensorProto &present) {
      if (present.data_location() != onnx::TensorProto::EXTERNAL) return;
      // inline_ is this function's own copy and forEachTensor visits only present tensors.
      auto &t = const_cast<onnx::TensorProto &>(present);
      t.clear_data_location();
      t.clear_external_data();
      t.clear_dims();
      t.add_dims(0); // no elements, so no data field: the checker's other rules hold
    });
  }
  try {
    onnx::checker::check_model(inline_ ? *inline_ : model);
  } catch (const std::exception &e) {
    throw error("model '", sourceName, "' fails the ONNX checker: ", e.what());
  }
}

} // namespace

std::unique_ptr<ir::Graph> importModelBytes(const std::string &bytes, const std::string &baseDir,
                                            const ImportOptions &options, const std::string &sourceName) {
  ir::registerBuiltinOps();
  onnx::ModelProto model;
  if (bytes.empty()) throw error("model '", sourceName, "' is empty");
  if (!parseProto(model, bytes))
    throw error("model '", sourceName, "' is not a valid ONNX ModelProto (truncated or malformed protobuf)");
  if (!model.has_graph()) throw error("model '", sourceName, "' has no graph");
  if (options.check) checkModel(model, sourceName);
  // ONNX's own shape inference runs only for what the import reads from it: the types of subgraph
  // inputs and outputs that a model leaves undeclared (the IR infers and checks every op's shapes
  // itself when the session is prepared). libonnx 1.12's inference dereferences null on some
  // invalid models (a ConvTranspose whose weight has rank 2, found by the model fuzzer:
  // tests/fuzz/regressions/model/), so it is not run on models that do not need it, and the
  // ConvTranspose weights that it would crash on are refused before it.
  if (hasUntypedSubgraphValues(model.graph())) {
    checkConvTransposeRanks(model.graph());
    try {
      onnx::shape_inference::InferShapes(model);
    } catch (const std::exception &e) {
      logging::logger().info("ONNX shape inference failed on '{}': {}", sourceName, e.what());
    }
  }

  auto graph = std::make_unique<ir::Graph>();
  for (const auto &opset : model.opset_import())
    graph->opsets()[ir::canonicalDomain(opset.domain())] = static_cast<int>(opset.version());
  // A model of training-domain ops only may omit the default opset; its nodes are then checked
  // against the domains it does import.
  int defaultOpset = graph->opsets().count("ai.onnx") ? graph->opsets().at("ai.onnx") : 17;
  // Opsets 7-17 are the supported range; older models load as long as each op they use is
  // registered for their version (ops unchanged since opset 1 are).
  if (defaultOpset < 1 || defaultOpset > 17)
    throw error("model '", sourceName, "' uses ONNX opset ", defaultOpset, "; supported opsets are 7 to 17");

  ir::TensorKind initKind = options.initializersAsVariables ? ir::TensorKind::Variable : ir::TensorKind::Const;
  const auto &g = model.graph();
  for (const auto &init : g.initializer()) {
    std::shared_ptr<TensorData> data;
    if (const ir::Tensor *from = options.initializersFrom ? options.initializersFrom->findTensor(init.name()) : nullptr;
        from && initKind == ir::TensorKind::Const && from->kind() == ir::TensorKind::Const && from->data() &&
        from->info() == TensorInfo(dataTypeFromOnnx(init.data_type()), shapeFromDims(init.dims())))
      data = from->data();
    else
      data = std::make_shared<TensorData>(tensorFromProto(init, baseDir));
    ir::Tensor &t = graph->addTensor(init.name(), initKind, data->info());
    t.setData(std::move(data));
    graph->addInitializer(init.name());
  }
  for (const auto &input : g.input()) {
    if (graph->hasTensor(input.name())) continue; // an initializer listed as input (IR version < 4)
    graph->addTensor(input.name(), ir::TensorKind::Stream, infoFromValueInfo(input));
    graph->addInput(input.name());
  }
  std::vector<std::string> noCaptures;
  addNodes(g, *graph, nullptr, baseDir, noCaptures);
  for (const auto &output : g.output()) {
    if (!graph->hasTensor(output.name())) throw error("graph output '", output.name(), "' is not produced by any node");
    graph->addOutput(output.name());
  }
  graph->checkConnected();
  graph->schedule(); // rejects cycles now, with the tensor named
  ir::checkAnnotations(*graph);
  return graph;
}

std::unique_ptr<ir::Graph> importModelFile(const std::string &path, const ImportOptions &options) {
  std::string bytes = readFile(path, "model file");
  std::string dir = fs::path(path).parent_path().string();
  return importModelBytes(bytes, dir.empty() ? "." : dir, options, path);
}

TensorData readTensorProtoFile(const std::string &path) {
  std::string bytes = readFile(path, "tensor file");
  onnx::TensorProto t;
  if (!parseProto(t, bytes)) throw error("tensor file '", path, "' is not a valid serialized TensorProto");
  try {
    return tensorFromProto(t, fs::path(path).parent_path().string());
  } catch (const error &e) {
    throw error("tensor file '", path, "': ", e.what());
  }
}

namespace {
SequenceData sequenceFromProto(const onnx::SequenceProto &seq, const std::string &path) {
  if (seq.elem_type() != onnx::SequenceProto::TENSOR && seq.tensor_values_size() == 0 && seq.elem_type() != 0)
    throw error("sequence file '", path, "': only sequences of tensors are supported");
  SequenceData value;
  for (const auto &t : seq.tensor_values())
    value.items.push_back(tensorFromProto(t, fs::path(path).parent_path().string()));
  return value;
}
} // namespace

SequenceData readSequenceProtoFile(const std::string &path, ValueKind kind) {
  std::string bytes = readFile(path, "sequence file");
  if (kind == ValueKind::Sequence) {
    onnx::SequenceProto seq;
    if (!parseProto(seq, bytes)) throw error("file '", path, "' is not a valid serialized SequenceProto");
    return sequenceFromProto(seq, path);
  }
  onnx::OptionalProto opt;
  if (!parseProto(opt, bytes)) throw error("file '", path, "' is not a valid serialized OptionalProto");
  SequenceData value;
  if (opt.has_tensor_value()) {
    value.items.push_back(tensorFromProto(opt.tensor_value(), fs::path(path).parent_path().string()));
  } else if (opt.has_sequence_value()) {
    value = sequenceFromProto(opt.sequence_value(), path);
  } else {
    value.present = false;
  }
  return value;
}

std::string serializeTensorProto(const TensorData &data, const std::string &name) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(static_cast<int>(data.info().dataType()));
  for (int64_t d : data.info().shape())
    t.add_dims(d);
  if (data.info().dataType() == DataType::STRING) {
    for (const auto &s : data.strings())
      t.add_string_data(s);
  } else {
    t.set_raw_data(data.data(), static_cast<size_t>(data.byteCount()));
  }
  return t.SerializeAsString();
}

namespace {
/// "fp16", "bf16", "float"...: names the type of a weight stored apart from its declared one.
std::string typeSuffix(DataType t) {
  if (t == DataType::FLOAT16) return "fp16";
  if (t == DataType::BFLOAT16) return "bf16";
  std::string s = toString(t);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}
} // namespace

std::string withInitializers(const std::string &modelBytes, const std::map<TensorId, const TensorData *> &values,
                             bool keepValueTypes) {
  onnx::ModelProto m;
  if (!parseProto(m, modelBytes)) throw error("cannot parse the model to write its weights");
  onnx::GraphProto &g = *m.mutable_graph();
  std::set<std::string> graphInputs;
  for (const auto &in : g.input())
    graphInputs.insert(in.name());
  std::map<TensorId, const TensorData *> pending = values;
  std::vector<onnx::NodeProto> casts;
  for (auto &init : *g.mutable_initializer()) {
    auto it = pending.find(init.name());
    if (it == pending.end()) continue;
    const TensorData &value = *it->second;
    const auto declared = dataTypeFromOnnx(init.data_type());
    std::string name = init.name();
    TensorData widened;
    const TensorData *stored = &value;
    if (value.info().dataType() != declared) {
      // An initializer that is also a graph input must keep its declared type.
      if (keepValueTypes && !graphInputs.count(name)) {
        onnx::NodeProto cast;
        cast.set_op_type("Cast");
        cast.set_name(name + "_cast");
        name += "_" + typeSuffix(value.info().dataType());
        cast.add_input(name);
        cast.add_output(init.name());
        onnx::AttributeProto *to = cast.add_attribute();
        to->set_name("to");
        to->set_type(onnx::AttributeProto::INT);
        to->set_i(static_cast<int64_t>(declared));
        casts.push_back(std::move(cast));
      } else {
        widened = TensorData::fromDoubles(declared, value.info().shape(), value.toDoubleVector());
        stored = &widened;
      }
    }
    onnx::TensorProto t;
    if (!t.ParseFromString(serializeTensorProto(*stored, name)))
      throw error("cannot serialize initializer '", init.name(), "'");
    if (init.has_doc_string()) t.set_doc_string(init.doc_string());
    init = std::move(t);
    pending.erase(it);
  }
  if (!pending.empty()) throw error("'", pending.begin()->first, "' is not an initializer of the model");
  if (!casts.empty()) { // first, so that the nodes stay in topological order
    google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
    for (auto &c : casts)
      *nodes.Add() = std::move(c);
    for (auto &n : *g.mutable_node())
      *nodes.Add() = std::move(n);
    g.mutable_node()->Swap(&nodes);
  }
  return m.SerializeAsString();
}

bool looksLikeModelProto(const std::string &bytes) {
  onnx::ModelProto m;
  return parseProto(m, bytes) && m.has_graph();
}

} // namespace popart::onnx_import
