#pragma once
/// \file Optimisers of a TrainingSession, with PopART's names: SGD, ConstSGD, Adam (Adam, AdamW,
/// AdaMax, LAMB, LambNoBias) and Adaptive (RMSprop, centered RMSprop, AdaGrad).
///
/// Hyperparameters are given as a map from name to {value, isConst}. Names starting with
/// "default" apply to every weight; insertSpecific() overrides them for one weight (names
/// without the prefix). A const hyperparameter is fixed when the session is created; the others
/// can be changed between runs with TrainingSession::updateOptimizerFromHost.

#include <popart/tensorinfo.hpp>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace popart {

/// One hyperparameter value and whether it is fixed at compile time.
class OptimizerValue {
public:
  OptimizerValue() = default;
  OptimizerValue(float value, bool isConst = true) : value_(value), isConst_(isConst) {}
  OptimizerValue(std::pair<float, bool> p) : value_(p.first), isConst_(p.second) {}
  float val() const { return value_; }
  bool isConst() const { return isConst_; }
  bool operator==(const OptimizerValue &o) const { return value_ == o.value_ && isConst_ == o.isConst_; }

private:
  float value_ = 0.0f;
  bool isConst_ = true;
};

/// How weight decay enters the update: decoupled (AdamW, w -= lr·wd·w) or as an L2 term added
/// to the gradient (torch.optim's weight_decay for SGD, Adam, RMSprop, AdaGrad).
enum class WeightDecayMode { Decay, L2Regularization };

/// The members of the Adam family.
enum class AdamMode { Adam, AdamNoBias, AdaMax, Lamb, LambNoBias };

/// The members of the adaptive family.
enum class AdaptiveMode { AdaGrad, RMSProp, CenteredRMSProp };

/// Clipping by the global L2 norm of the gradients of some weights (all when weightIds is empty),
/// as torch.nn.utils.clip_grad_norm_: g *= min(1, maxNorm / (‖g‖ + 1e-6)).
struct ClipNormSettings {
  std::vector<TensorId> weightIds;
  float maxNorm = 0.0f;
  static ClipNormSettings clipAllWeights(float maxNorm) { return {{}, maxNorm}; }
  static ClipNormSettings clipWeights(std::vector<TensorId> ids, float maxNorm) { return {std::move(ids), maxNorm}; }
};

/// Base of the optimisers: hyperparameters with per-weight overrides, loss scaling, clipping.
class Optimizer {
public:
  using Params = std::map<std::string, std::pair<float, bool>>;
  virtual ~Optimizer() = default;
  virtual std::unique_ptr<Optimizer> clone() const = 0;
  /// "sgd", "adam", "adamw", "adamax", "lamb", "lambnobias", "adamnobias", "rmsprop",
  /// "centeredrmsprop" or "adagrad".
  virtual std::string name() const = 0;
  /// Names of the per-weight hyperparameters this optimiser uses (without "default").
  virtual std::vector<std::string> hyperParameterNames() const = 0;

  /// The value of hyperparameter \p name ("learningRate", ...) for \p weight.
  OptimizerValue get(const std::string &name, const TensorId &weight = "") const;
  /// Overrides hyperparameters for one weight; names without the "default" prefix.
  void insertSpecific(const TensorId &weight, const Params &params);
  bool hasSpecific(const TensorId &weight) const { return specific_.count(weight) != 0; }
  const std::map<TensorId, std::map<std::string, OptimizerValue>> &specifics() const { return specific_; }
  /// The loss scaling factor (1 when absent): the loss gradient is multiplied by it and the
  /// update divides it out.
  OptimizerValue lossScaling() const { return lossScaling_; }
  const std::vector<ClipNormSettings> &clipNormSettings() const { return clipNorms_; }

protected:
  /// Reads \p params, accepting the names "default" + hyperParameterNames(), "lossScaling"
  /// and the extra global names of \p extra; throws naming an unknown one. Missing ones take
  /// \p defaults.
  void init(const Params &params, const std::map<std::string, OptimizerValue> &defaults,
            std::vector<ClipNormSettings> clip, const std::vector<std::string> &extra = {});
  std::map<std::string, OptimizerValue> defaults_;
  std::map<TensorId, std::map<std::string, OptimizerValue>> specific_;
  OptimizerValue lossScaling_{1.0f, true};
  std::vector<ClipNormSettings> clipNorms_;
};

/// Stochastic gradient descent as torch.optim.SGD: weight decay as L2, momentum with the first
/// step's velocity equal to the gradient, dampening, Nesterov. Names: defaultLearningRate
/// (0.01), defaultMomentum (0), defaultDampening (0), defaultWeightDecay (0),
/// defaultVelocityScaling (1: the velocity is stored multiplied by it), defaultNesterov (0/1),
/// lossScaling (1).
class SGD : public Optimizer {
public:
  explicit SGD(const Params &params = {}, std::vector<ClipNormSettings> clip = {});
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<SGD>(*this); }
  std::string name() const override { return "sgd"; }
  std::vector<std::string> hyperParameterNames() const override;
};

/// SGD whose learning rate, weight decay and loss scaling are all const.
class ConstSGD : public SGD {
public:
  explicit ConstSGD(float learningRate, float weightDecay = 0.0f, float lossScaling = 1.0f);
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<ConstSGD>(*this); }
};

/// The Adam family. Names: defaultLearningRate (0.001), defaultBeta1 (0.9), defaultBeta2
/// (0.999), defaultEps (1e-8), defaultWeightDecay (0), maxWeightNorm (0 = no clamp, LAMB only),
/// lossScaling (1). AdamMode::Adam with WeightDecayMode::L2Regularization is torch.optim.Adam,
/// with Decay torch.optim.AdamW; AdaMax is torch.optim.Adamax; Lamb/LambNoBias scale each
/// weight's update by the trust ratio ‖w‖/‖u‖.
class Adam : public Optimizer {
public:
  explicit Adam(const Params &params = {}, AdamMode mode = AdamMode::Adam,
                WeightDecayMode decayMode = WeightDecayMode::Decay, std::vector<ClipNormSettings> clip = {});
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<Adam>(*this); }
  std::string name() const override;
  std::vector<std::string> hyperParameterNames() const override;
  AdamMode mode() const { return mode_; }
  WeightDecayMode decayMode() const { return decayMode_; }

private:
  AdamMode mode_;
  WeightDecayMode decayMode_;
};

/// RMSprop (torch.optim.RMSprop, optionally centered) and AdaGrad (torch.optim.Adagrad). Names:
/// defaultLearningRate (0.01), defaultAlpha (0.99, RMSprop), defaultMomentum (0, RMSprop),
/// defaultEps (1e-8 RMSprop, 1e-10 AdaGrad), defaultWeightDecay (0, as L2),
/// defaultLearningRateDecay (0, AdaGrad), defaultInitialAccumulator (0, AdaGrad), lossScaling.
class Adaptive : public Optimizer {
public:
  explicit Adaptive(const Params &params = {}, AdaptiveMode mode = AdaptiveMode::RMSProp,
                    std::vector<ClipNormSettings> clip = {});
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<Adaptive>(*this); }
  std::string name() const override;
  std::vector<std::string> hyperParameterNames() const override;
  AdaptiveMode mode() const { return mode_; }

private:
  AdaptiveMode mode_;
};

} // namespace popart
