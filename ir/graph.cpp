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
    c.setRecomputed(t->recomputed());
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

namespace {

/// The ops with a Tensor::recomputed output, in an order where each comes after those of them it
/// reads (insertion order otherwise); throws on a cycle among them.
std::vector<Op *> recomputingOps(const Graph &graph, std::map<const Op *, std::vector<Op *>> &successors) {
  std::vector<Op *> late;
  std::map<const Op *, size_t> pending;
  for (const auto &op : graph.ops())
    if (std::any_of(op->outputs.begin(), op->outputs.end(), [](const Tensor *t) { return t && t->recomputed(); })) {
      late.push_back(op.get());
      pending[op.get()] = 0;
    }
  if (late.empty()) return late;
  for (const Op *l : late)
    for (const Op *c : successors[l])
      if (auto it = pending.find(c); it != pending.end()) ++it->second;
  std::deque<Op *> ready;
  for (Op *l : late)
    if (pending[l] == 0) ready.push_back(l);
  std::vector<Op *> ordered;
  while (!ready.empty()) {
    Op *l = ready.front();
    ready.pop_front();
    ordered.push_back(l);
    for (Op *c : successors[l])
      if (auto it = pending.find(c); it != pending.end() && --it->second == 0) ready.push_back(c);
  }
  if (ordered.size() != late.size()) throw error("the graph has a cycle among the ops recomputing tensors");
  return ordered;
}

} // namespace

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
  // Ops recomputing a value for the backward pass (an output Tensor::recomputed) would be ready as
  // soon as the forward tensors they read are, and their outputs would stay live from there to
  // the backward pass. They are left out of the ordering too and placed afterwards just before
  // their first successor; so that the ordering still runs everything they read before their
  // readers, each of their readers outside them depends on the ops outside them that they read
  // (through other recomputing ops).
  std::vector<Op *> late = recomputingOps(*this, successors);
  std::set<const Op *> lateSet(late.begin(), late.end());
  // Ops that depend on nothing (the Casts of weights and graph inputs, ops reading only
  // constants) would all be ready at the start, and their outputs would stay live from the first
  // step to their readers. They are left out of the ordering and placed afterwards just before
  // their first successor, so that a weight's 16-bit copy lives only while its layer runs.
  std::vector<Op *> sources;
  for (const auto &op : ops_)
    if (pending[op.get()] == 0 && !lateSet.count(op.get())) sources.push_back(op.get());
  if (!late.empty()) {
    // Per late op, the ops outside late it reads through late ops, in the order found (not by
    // address, so that the schedule is the same in every run).
    std::map<const Op *, std::vector<Op *>> outer;
    auto addOuter = [&](const Op *l, Op *p) {
      std::vector<Op *> &o = outer[l];
      if (std::find(o.begin(), o.end(), p) == o.end()) o.push_back(p);
    };
    std::map<const Op *, std::vector<Op *>> predecessors;
    for (const auto &op : ops_)
      for (Op *c : successors[op.get()])
        predecessors[c].push_back(op.get());
    for (const Op *l : late) // in topological order
      for (Op *p : predecessors[l])
        if (lateSet.count(p))
          for (Op *q : std::vector<Op *>(outer[p]))
            addOuter(l, q);
        else
          addOuter(l, p);
    for (const Op *l : late) {
      const std::vector<Op *> readers = successors[l]; // addEdge may grow successors
      for (Op *s : readers)
        if (!lateSet.count(s))
          for (Op *p : outer[l])
            addEdge(p, s);
    }
    for (const Op *l : late)
      for (Op *c : successors[l])
        --pending[c];
  }
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
    if (pending[op.get()] == 0 && !sourceSet.count(op.get()) && !lateSet.count(op.get()))
      ready[key(op.get())].push_back(op.get());
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
      if (--pending[c] == 0 && !lateSet.count(c)) ready[key(c)].push_back(c);
  }
  if (order.size() + sources.size() + late.size() != ops_.size()) {
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
  // Late ops are placed first, from the last (whose successors' places are known then), each in
  // the place of its first successor; sources go before the late ops of their place.
  std::map<const Op *, size_t> lateAt;
  auto placeOf = [&](const Op *op) {
    auto phaseEnd =
        std::partition_point(order.begin(), order.end(), [&](const Op *o) { return o->phase <= op->phase; });
    size_t at = static_cast<size_t>(phaseEnd - order.begin());
    for (const Op *c : successors[op]) {
      if (c->phase < op->phase)
        throw error(c->debugName(), " of phase ", c->phase, " depends on ", op->debugName(), " of phase ", op->phase);
      at = std::min(at, lateSet.count(c) ? lateAt.at(c) : position.at(c));
    }
    return at;
  };
  for (auto l = late.rbegin(); l != late.rend(); ++l)
    lateAt[*l] = placeOf(*l);
  std::vector<std::vector<Op *>> before(order.size() + 1), lateBefore(order.size() + 1);
  for (Op *source : sources)
    before[placeOf(source)].push_back(source);
  for (Op *l : late)
    lateBefore[lateAt.at(l)].push_back(l);
  std::vector<Op *> result;
  result.reserve(ops_.size());
  for (size_t i = 0; i <= order.size(); ++i) {
    result.insert(result.end(), before[i].begin(), before[i].end());
    result.insert(result.end(), lateBefore[i].begin(), lateBefore[i].end());
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
