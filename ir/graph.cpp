#include "ir/graph.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <deque>
#include <set>
#include <sstream>

namespace popart::ir {

Tensor &Graph::addTensor(const TensorId &id, TensorKind kind, const TensorInfo &info) {
  if (id.empty()) throw error("a tensor needs a non-empty name");
  auto [it, inserted] = tensors_.emplace(id, std::make_unique<Tensor>(id, kind, info));
  if (!inserted) throw error("tensor '", id, "' is defined twice");
  return *it->second;
}

Tensor &Graph::addConst(const TensorId &id, TensorData data) {
  Tensor &t = addTensor(id, TensorKind::Const, data.info());
  t.setData(std::make_shared<TensorData>(std::move(data)));
  return t;
}

Tensor &Graph::tensor(const TensorId &id) const {
  auto it = tensors_.find(id);
  if (it == tensors_.end()) throw error("tensor '", id, "' does not exist in the graph");
  return *it->second;
}

Tensor *Graph::findTensor(const TensorId &id) const {
  auto it = tensors_.find(id);
  return it == tensors_.end() ? nullptr : it->second.get();
}

void Graph::removeTensor(const TensorId &id) {
  Tensor &t = tensor(id);
  if (t.producer() || !t.consumers().empty()) throw error("cannot remove tensor '", id, "': it is still connected");
  tensors_.erase(id);
}

static std::string unsupportedMessage(const std::string &domain, const std::string &type, int version,
                                      const std::string &nodeName) {
  std::ostringstream os;
  os << "unsupported op " << domain << "::" << type << " at opset " << version;
  if (!nodeName.empty()) os << " (node '" << nodeName << "')";
  const auto &reg = OpRegistry::instance();
  if (reg.knowsType(domain, type)) {
    os << "; supported opsets:";
    for (const auto &d : reg.all())
      if (d.domain == canonicalDomain(domain) && d.type == type) os << " " << d.minVersion << "-" << d.maxVersion;
  }
  return os.str();
}

Op &Graph::addOp(const std::string &type, const std::string &domain, int version, const std::string &name,
                 Attributes attrs, const std::vector<TensorId> &inputs, const std::vector<TensorId> &outputs) {
  const OpDef *def = OpRegistry::instance().find(domain, type, version);
  if (!def) throw error(unsupportedMessage(canonicalDomain(domain), type, version, name));
  auto op = std::make_unique<Op>();
  op->id = nextOpId_++;
  op->type = type;
  op->domain = canonicalDomain(domain);
  op->version = version;
  op->name = name;
  op->attrs = std::move(attrs);
  op->def = def;
  op->graph = this;
  for (const auto &id : inputs) {
    if (id.empty()) {
      op->inputs.push_back(nullptr);
      continue;
    }
    Tensor *t = findTensor(id);
    if (!t)
      throw error(op->debugName(), ": input tensor '", id,
                  "' is not defined by any earlier node, initializer or graph input");
    op->inputs.push_back(t);
  }
  // Trailing omitted inputs carry no meaning; dropping them keeps inputCount() honest.
  while (!op->inputs.empty() && op->inputs.back() == nullptr)
    op->inputs.pop_back();
  for (const auto &id : outputs) {
    if (id.empty()) {
      op->outputs.push_back(nullptr);
      continue;
    }
    Tensor *existing = findTensor(id);
    if (existing && existing->producer())
      throw error(op->debugName(), ": output tensor '", id, "' is already produced by ",
                  existing->producer()->debugName());
    if (existing && (existing->kind() == TensorKind::Const || existing->kind() == TensorKind::Variable ||
                     std::find(inputs_.begin(), inputs_.end(), id) != inputs_.end()))
      throw error(op->debugName(), ": output tensor '", id, "' is also a graph input or initializer");
    Tensor &t = existing ? *existing : addTensor(id, TensorKind::ActGrad, TensorInfo());
    op->outputs.push_back(&t);
  }
  Op &ref = *op;
  ops_.push_back(std::move(op));
  for (Tensor *t : ref.inputs)
    if (t) t->addConsumer(&ref);
  for (Tensor *t : ref.outputs)
    if (t) t->setProducer(&ref);
  if (def->canonicalize) def->canonicalize(ref, *this);
  return ref;
}

void Graph::setOpInput(Op &op, size_t index, Tensor *t) {
  if (index >= op.inputs.size()) op.inputs.resize(index + 1, nullptr);
  if (op.inputs[index]) op.inputs[index]->removeConsumer(&op);
  op.inputs[index] = t;
  if (t) t->addConsumer(&op);
}

void Graph::setOpOutput(Op &op, size_t index, Tensor *t) {
  if (t && t->producer())
    throw error(op.debugName(), ": output tensor '", t->id(), "' is already produced by ", t->producer()->debugName());
  if (index >= op.outputs.size()) op.outputs.resize(index + 1, nullptr);
  if (op.outputs[index] && op.outputs[index]->producer() == &op) op.outputs[index]->setProducer(nullptr);
  op.outputs[index] = t;
  if (t) t->setProducer(&op);
}

void Graph::removeOp(Op &op) {
  for (Tensor *t : op.inputs)
    if (t) t->removeConsumer(&op);
  for (Tensor *t : op.outputs)
    if (t && t->producer() == &op) t->setProducer(nullptr);
  auto it = std::find_if(ops_.begin(), ops_.end(), [&](const auto &p) { return p.get() == &op; });
  if (it != ops_.end()) ops_.erase(it);
}

std::unique_ptr<Graph> Graph::clone() const {
  auto g = std::make_unique<Graph>();
  for (const auto &[id, t] : tensors_) {
    Tensor &c = g->addTensor(id, t->kind(), t->info());
    c.setData(t->data());
  }
  // addOp takes over the copied output tensors (no producer yet), keeping their infos.
  std::vector<Op *> order;
  try {
    order = schedule();
  } catch (const error &) {
    for (const auto &op : ops_)
      order.push_back(op.get());
  }
  for (const Op *op : order) {
    std::vector<TensorId> ins, outs;
    for (const Tensor *t : op->inputs)
      ins.push_back(t ? t->id() : "");
    for (const Tensor *t : op->outputs)
      outs.push_back(t ? t->id() : "");
    Op &c = g->addOp(op->type, op->domain, op->version, op->name, op->attrs, ins, outs);
    c.fusion = op->fusion;
    c.phase = op->phase;
  }
  g->inputs_ = inputs_;
  g->outputs_ = outputs_;
  g->initializers_ = initializers_;
  g->opsets_ = opsets_;
  g->nextUniqueId_ = nextUniqueId_;
  return g;
}

TensorId Graph::uniqueId(const std::string &prefix) {
  while (true) {
    TensorId id = prefix + "__" + std::to_string(nextUniqueId_++);
    if (!hasTensor(id)) return id;
  }
}

std::vector<Op *> Graph::schedule() const {
  // Edges: producer -> consumer, and reader -> op updating that input in place. Successors are
  // kept in the order the edges are found (ops in insertion order), not by address: the schedule,
  // and so the memory plan and the op numbering of passes, are the same in every run.
  std::map<const Op *, std::vector<Op *>> successors;
  std::set<std::pair<const Op *, const Op *>> edges;
  std::map<const Op *, size_t> pending;
  for (const auto &op : ops_)
    pending[op.get()] = 0;
  auto addEdge = [&](const Op *from, Op *to) {
    if (from != to && edges.emplace(from, to).second) {
      successors[from].push_back(to);
      ++pending[to];
    }
  };
  for (const auto &op : ops_) {
    for (Tensor *t : op->inputs)
      if (t && t->producer()) addEdge(t->producer(), op.get());
    for (const OpDef::InPlace &m : op->def ? op->def->modifies : std::vector<OpDef::InPlace>{})
      if (op->hasInput(static_cast<size_t>(m.input)))
        for (Op *reader : op->input(static_cast<size_t>(m.input)).consumers())
          addEdge(reader, op.get());
  }
  // Ops that depend on nothing (the Casts of weights and graph inputs, ops reading only
  // constants) would all be ready at the start, and their outputs would stay live from the first
  // step to their readers. They are left out of the ordering and placed afterwards just before
  // their first successor, so that a weight's 16-bit copy lives only while its layer runs.
  std::vector<Op *> sources;
  for (const auto &op : ops_)
    if (pending[op.get()] == 0) sources.push_back(op.get());
  for (const Op *source : sources)
    for (Op *c : successors[source])
      --pending[c];
  // Ready ops of the lowest phase first, in the order they became ready (OpDef::scheduleLate ops
  // after the others).
  std::set<const Op *> sourceSet(sources.begin(), sources.end());
  std::map<int, std::deque<Op *>> ready;
  // Keyed 2 · phase + late: a phase's OpDef::scheduleLate ops queue after its others.
  auto key = [](const Op *op) { return 2 * op->phase + (op->def && op->def->scheduleLate ? 1 : 0); };
  for (const auto &op : ops_)
    if (pending[op.get()] == 0 && !sourceSet.count(op.get())) ready[key(op.get())].push_back(op.get());
  std::vector<Op *> order;
  order.reserve(ops_.size());
  while (!ready.empty()) {
    auto first = ready.begin();
    Op *op = first->second.front();
    first->second.pop_front();
    if (first->second.empty()) ready.erase(first);
    if (!order.empty() && order.back()->phase > op->phase)
      throw error(op->debugName(), " of phase ", op->phase, " depends on ", order.back()->debugName(), " of phase ",
                  order.back()->phase);
    order.push_back(op);
    for (Op *c : successors[op])
      if (--pending[c] == 0) ready[key(c)].push_back(c);
  }
  if (order.size() + sources.size() != ops_.size()) {
    for (const auto &op : ops_)
      if (pending[op.get()] > 0)
        for (Tensor *t : op->inputs)
          if (t && t->producer() && pending[t->producer()] > 0)
            throw error("the graph has a cycle: ", op->debugName(), " consumes tensor '", t->id(),
                        "', which depends on its own output");
    throw error("the graph has a cycle");
  }
  // Each source goes before its first successor, and no later than the end of its own phase so
  // that the schedule stays phase-monotone; sources sharing a place keep their insertion order.
  std::map<const Op *, size_t> position;
  for (size_t i = 0; i < order.size(); ++i)
    position[order[i]] = i;
  std::vector<std::vector<Op *>> before(order.size() + 1);
  for (Op *source : sources) {
    auto phaseEnd =
        std::partition_point(order.begin(), order.end(), [&](const Op *op) { return op->phase <= source->phase; });
    size_t at = static_cast<size_t>(phaseEnd - order.begin());
    for (const Op *c : successors[source]) {
      if (c->phase < source->phase)
        throw error(c->debugName(), " of phase ", c->phase, " depends on ", source->debugName(), " of phase ",
                    source->phase);
      at = std::min(at, position.at(c));
    }
    before[at].push_back(source);
  }
  std::vector<Op *> result;
  result.reserve(ops_.size());
  for (size_t i = 0; i <= order.size(); ++i) {
    result.insert(result.end(), before[i].begin(), before[i].end());
    if (i < order.size()) result.push_back(order[i]);
  }
  return result;
}

void Graph::checkConnected() const {
  std::set<TensorId> graphInputs(inputs_.begin(), inputs_.end());
  for (const auto &op : ops_)
    for (Tensor *t : op->inputs)
      if (t && !t->producer() && t->kind() == TensorKind::ActGrad && !graphInputs.count(t->id()))
        throw error(op->debugName(), ": input tensor '", t->id(),
                    "' is dangling: no op produces it and it is not a graph input or initializer");
  for (const auto &id : outputs_) {
    Tensor *t = findTensor(id);
    if (!t) throw error("graph output '", id, "' is not produced by any node");
    if (!t->producer() && t->kind() == TensorKind::ActGrad && !graphInputs.count(id))
      throw error("graph output '", id, "' is dangling: no op produces it");
  }
}

std::string Graph::dump() const {
  std::ostringstream os;
  os << "graph (opsets:";
  for (const auto &[d, v] : opsets_)
    os << " " << d << "=" << v;
  os << ")\n";
  for (const auto &id : inputs_)
    os << "  input  " << id << " : " << tensor(id).info() << "\n";
  for (const auto &[id, t] : tensors_)
    if (t->kind() == TensorKind::Variable || t->kind() == TensorKind::Const)
      if (!t->consumers().empty())
        os << "  " << (t->kind() == TensorKind::Const ? "const  " : "weight ") << id << " : " << t->info() << "\n";
  for (const Op *op : schedule()) {
    os << "  %" << op->id << " " << op->domain << "::" << op->type << "-" << op->version;
    if (!op->name.empty()) os << " '" << op->name << "'";
    os << " (";
    for (size_t i = 0; i < op->inputs.size(); ++i)
      os << (i ? ", " : "") << (op->inputs[i] ? op->inputs[i]->id() : "-");
    os << ") -> (";
    for (size_t i = 0; i < op->outputs.size(); ++i) {
      os << (i ? ", " : "");
      if (op->outputs[i])
        os << op->outputs[i]->id() << " : " << op->outputs[i]->info();
      else
        os << "-";
    }
    os << ")";
    std::string attrs = op->attrs.toString();
    if (!attrs.empty()) os << " {" << attrs << "}";
    if (!op->fusion.empty()) os << " fused{" << op->fusion.toString() << "}";
    os << "\n";
  }
  for (const auto &id : outputs_)
    os << "  output " << id << " : " << tensor(id).info() << "\n";
  return os.str();
}

} // namespace popart::ir
