// Kernels of the collective ops (ir/ops/collectives.hpp): each hands its buffers to the session's
// communicator (KernelContext::communicator) and waits for the result. They compute nothing
// themselves, so one kernel serves every provider; the communicator fixes the order of additions
// (docs/distributed.md, "Determinism"), so every replica gets the same bits.

#include "ir/ops/collectives.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "comm/communicator.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace popart::backend_cpu {

namespace {

comm::ReduceOp reduceOp(const std::string &name) {
  if (name == "Mean") return comm::ReduceOp::Mean;
  if (name == "And") return comm::ReduceOp::And;
  return comm::ReduceOp::Sum;
}

/// The session's communicator, or an error naming \p op: collectives need a replicated session.
std::shared_ptr<comm::Communicator> communicatorFor(const ir::Op &op, const KernelContext &context) {
  if (!context.communicator)
    throw error(op.debugName(), ": a collective op needs the session's communicator (SessionOptions::"
                                "enableReplicatedGraphs), and this session has none");
  return context.communicator;
}

/// Checks the op's `replicas` attribute, which decided its shapes, against the communicator.
void checkReplicas(const ir::Op &op, const comm::Communicator &communicator) {
  const int64_t replicas = op.attrs.getInt("replicas");
  if (replicas != communicator.size())
    throw error(op.debugName(), ": its shapes are for ", replicas, " replicas, but the communicator has ",
                communicator.size(), " ranks");
}

/// The plan's registry of collectives (a private one if the context has none, as in tests that
/// build a context by hand), where spans and requests in flight are kept.
std::shared_ptr<CollectiveRequests> collectivesFor(const KernelContext &context) {
  return context.collectives ? context.collectives : std::make_shared<CollectiveRequests>();
}

class AllReduceKernel : public Kernel {
public:
  AllReduceKernel(const ir::Op &op, const KernelContext &context)
      : communicator_(communicatorFor(op, context)), collectives_(collectivesFor(context)),
        id_(collectives_->add(op.debugName())), op_(reduceOp(ir::collectiveReduction(op))),
        type_(op.inInfo(0).dataType()), count_(op.inInfo(0).elementCount()),
        bytes_(static_cast<size_t>(op.inInfo(0).byteCount())) {}
  void run(const KernelArgs &a) override {
    if (a.outputs[0] != a.inputs[0]) std::memcpy(a.outputs[0], a.inputs[0], bytes_);
    const int64_t start = CollectiveRequests::nowNs();
    communicator_->allReduce(a.outputs[0], count_, type_, op_);
    collectives_->recordSpan(id_, start, CollectiveRequests::nowNs());
  }
  int inPlaceInput() const override { return 0; }

private:
  std::shared_ptr<comm::Communicator> communicator_;
  std::shared_ptr<CollectiveRequests> collectives_;
  int id_;
  comm::ReduceOp op_;
  DataType type_;
  int64_t count_;
  size_t bytes_;
};

/// Packs a bucket's gradients into its buffer and starts their all-reduce, which then advances
/// whenever the plan polls between kernels, until the AllReduceWait of the bucket.
class AllReduceStartKernel : public Kernel {
public:
  AllReduceStartKernel(const ir::Op &op, const KernelContext &context)
      : communicator_(communicatorFor(op, context)), collectives_(collectivesFor(context)),
        id_(collectives_->add(op.debugName())), op_(reduceOp(ir::collectiveReduction(op))),
        type_(op.outInfo(0).dataType()), count_(op.outInfo(0).elementCount()) {
    for (size_t i = 0; i < op.inputs.size(); ++i)
      bytes_.push_back(static_cast<size_t>(op.inInfo(i).byteCount()));
  }
  void run(const KernelArgs &a) override {
    auto *bucket = static_cast<uint8_t *>(a.outputs[0]);
    for (size_t i = 0; i < bytes_.size(); ++i) {
      if (bucket != a.inputs[i]) std::memcpy(bucket, a.inputs[i], bytes_[i]);
      bucket += bytes_[i];
    }
    collectives_->start(id_, a.outputs[0], communicator_->allReduceAsync(a.outputs[0], count_, type_, op_));
  }
  /// A bucket of one gradient is reduced in the gradient's bytes where the plan allows.
  int inPlaceInput() const override { return bytes_.size() == 1 ? 0 : -1; }

private:
  std::shared_ptr<comm::Communicator> communicator_;
  std::shared_ptr<CollectiveRequests> collectives_;
  int id_;
  comm::ReduceOp op_;
  DataType type_;
  int64_t count_;
  std::vector<size_t> bytes_;
};

/// Waits for a bucket's all-reduce and copies the reduced gradients out of it.
class AllReduceWaitKernel : public Kernel {
public:
  AllReduceWaitKernel(const ir::Op &op, const KernelContext &context) : collectives_(collectivesFor(context)) {
    const auto communicator = communicatorFor(op, context);
    name_ = op.debugName() + " on rank " + std::to_string(communicator->rank()) + " of " +
            std::to_string(communicator->size());
    for (size_t i = 0; i < op.outputs.size(); ++i)
      bytes_.push_back(static_cast<size_t>(op.outInfo(i).byteCount()));
  }
  void run(const KernelArgs &a) override {
    collectives_->wait(a.inputs[0], name_);
    const auto *bucket = static_cast<const uint8_t *>(a.inputs[0]);
    for (size_t i = 0; i < bytes_.size(); ++i) {
      if (a.outputs[i] && a.outputs[i] != bucket) std::memcpy(a.outputs[i], bucket, bytes_[i]);
      bucket += bytes_[i];
    }
  }
  /// A bucket of one gradient hands its bytes on as the reduced gradient where the plan allows.
  int inPlaceInput() const override { return bytes_.size() == 1 ? 0 : -1; }

private:
  std::shared_ptr<CollectiveRequests> collectives_;
  std::string name_;
  std::vector<size_t> bytes_;
};

class ReduceScatterKernel : public Kernel {
public:
  ReduceScatterKernel(const ir::Op &op, const KernelContext &context)
      : communicator_(communicatorFor(op, context)), op_(reduceOp(ir::collectiveReduction(op))),
        type_(op.inInfo(0).dataType()), count_(op.outInfo(0).elementCount()) {
    checkReplicas(op, *communicator_);
  }
  void run(const KernelArgs &a) override {
    communicator_->reduceScatter(a.inputs[0], a.outputs[0], count_, type_, op_);
  }

private:
  std::shared_ptr<comm::Communicator> communicator_;
  comm::ReduceOp op_;
  DataType type_;
  int64_t count_;
};

class AllGatherKernel : public Kernel {
public:
  AllGatherKernel(const ir::Op &op, const KernelContext &context)
      : communicator_(communicatorFor(op, context)), type_(op.inInfo(0).dataType()),
        count_(op.inInfo(0).elementCount()) {
    checkReplicas(op, *communicator_);
  }
  void run(const KernelArgs &a) override { communicator_->allGather(a.inputs[0], a.outputs[0], count_, type_); }

private:
  std::shared_ptr<comm::Communicator> communicator_;
  DataType type_;
  int64_t count_;
};

/// AllGatherInto: straight into the target when the shards fill it exactly; else through the
/// scratch (the padded size), of which the target takes the first elements.
class AllGatherIntoKernel : public Kernel {
public:
  AllGatherIntoKernel(const ir::Op &op, const KernelContext &context)
      : communicator_(communicatorFor(op, context)), type_(op.inInfo(1).dataType()),
        count_(op.inInfo(1).elementCount()), targetBytes_(static_cast<size_t>(op.inInfo(0).byteCount())),
        gatheredBytes_(static_cast<size_t>(op.inInfo(1).byteCount()) * static_cast<size_t>(communicator_->size())) {
    checkReplicas(op, *communicator_);
  }
  int64_t scratchBytes() const override { return padded() ? static_cast<int64_t>(gatheredBytes_) : 0; }
  void run(const KernelArgs &a) override {
    if (!padded()) {
      communicator_->allGather(a.inputs[1], a.outputs[0], count_, type_);
      return;
    }
    void *gathered = a.scratch;
    if (!gathered) { // outside a plan
      fallback_.resize(gatheredBytes_);
      gathered = fallback_.data();
    }
    communicator_->allGather(a.inputs[1], gathered, count_, type_);
    std::memcpy(a.outputs[0], gathered, targetBytes_);
  }

private:
  bool padded() const { return gatheredBytes_ != targetBytes_; }
  std::shared_ptr<comm::Communicator> communicator_;
  DataType type_;
  int64_t count_;
  size_t targetBytes_, gatheredBytes_;
  std::vector<uint8_t> fallback_;
};

/// CopyShardVar: the shard's elements of the whole, then zeros.
class CopyShardVarKernel : public Kernel {
public:
  explicit CopyShardVarKernel(const ir::Op &op)
      : element_(static_cast<size_t>(dataTypeSize(op.inInfo(0).dataType()))),
        begin_(static_cast<size_t>(op.attrs.getInt("begin"))),
        copied_(static_cast<size_t>(std::clamp(op.inInfo(1).elementCount() - op.attrs.getInt("begin"), int64_t{0},
                                               op.inInfo(0).elementCount()))),
        count_(static_cast<size_t>(op.inInfo(0).elementCount())) {}
  void run(const KernelArgs &a) override {
    auto *shard = static_cast<uint8_t *>(a.outputs[0]);
    if (copied_) std::memcpy(shard, static_cast<const uint8_t *>(a.inputs[1]) + begin_ * element_, copied_ * element_);
    std::memset(shard + copied_ * element_, 0, (count_ - copied_) * element_);
  }

private:
  size_t element_, begin_, copied_, count_;
};

} // namespace

void registerReferenceCollectiveKernels(KernelRegistry &r) {
  r.add({"ai.graphcore", "AllReduce", KernelProvider::Reference, nullptr, makeKernel<AllReduceKernel>});
  r.add({"ai.graphcore", "ReduceScatter", KernelProvider::Reference, nullptr, makeKernel<ReduceScatterKernel>});
  r.add({"ai.graphcore", "AllGather", KernelProvider::Reference, nullptr, makeKernel<AllGatherKernel>});
  r.add({"ai.graphcore", "AllReduceStart", KernelProvider::Reference, nullptr, makeKernel<AllReduceStartKernel>});
  r.add({"ai.graphcore", "AllReduceWait", KernelProvider::Reference, nullptr, makeKernel<AllReduceWaitKernel>});
  r.add({"ai.graphcore", "AllGatherInto", KernelProvider::Reference, nullptr, makeKernel<AllGatherIntoKernel>});
  r.add({"ai.graphcore", "CopyShardVar", KernelProvider::Reference, nullptr, makeKernel<CopyShardVarKernel>});
}

} // namespace popart::backend_cpu
