// The public optimiser classes: hyperparameter maps with defaults and per-weight overrides.

#include <popart/error.hpp>
#include <popart/optimizer.hpp>

#include <algorithm>

namespace popart {

namespace {
std::string joined(const std::vector<std::string> &names) {
  std::string s;
  for (const auto &n : names)
    s += (s.empty() ? "" : ", ") + n;
  return s;
}
} // namespace

void Optimizer::init(const Params &params, const std::map<std::string, OptimizerValue> &defaults,
                     std::vector<ClipNormSettings> clip, const std::vector<std::string> &extra) {
  defaults_ = defaults;
  clipNorms_ = std::move(clip);
  std::vector<std::string> known;
  known.reserve(defaults.size() + 1 + extra.size());
  for (const auto &[name, v] : defaults)
    known.push_back("default" + std::string(1, static_cast<char>(std::toupper(name[0]))) + name.substr(1));
  known.push_back("lossScaling");
  known.insert(known.end(), extra.begin(), extra.end());
  for (const auto &[key, value] : params) {
    if (key == "lossScaling") {
      lossScaling_ = OptimizerValue(value);
      continue;
    }
    if (std::find(extra.begin(), extra.end(), key) != extra.end()) {
      defaults_[key] = OptimizerValue(value);
      continue;
    }
    if (key.rfind("default", 0) != 0 || key.size() <= 7 || std::find(known.begin(), known.end(), key) == known.end())
      throw error(name(), " optimiser: unknown hyperparameter '", key, "' (accepted: ", joined(known), ")");
    std::string n = key.substr(7);
    n[0] = static_cast<char>(std::tolower(n[0]));
    defaults_[n] = OptimizerValue(value);
  }
  if (lossScaling_.val() <= 0.0f) throw error(name(), " optimiser: lossScaling must be positive");
  for (const auto &c : clipNorms_)
    if (!(c.maxNorm > 0.0f)) throw error(name(), " optimiser: the clipping norm must be positive, got ", c.maxNorm);
}

OptimizerValue Optimizer::get(const std::string &name, const TensorId &weight) const {
  if (!weight.empty()) {
    auto s = specific_.find(weight);
    if (s != specific_.end()) {
      auto v = s->second.find(name);
      if (v != s->second.end()) return v->second;
    }
  }
  auto d = defaults_.find(name);
  if (d == defaults_.end()) throw error(this->name(), " optimiser has no hyperparameter '", name, "'");
  return d->second;
}

void Optimizer::insertSpecific(const TensorId &weight, const Params &params) {
  for (const auto &[key, value] : params) {
    if (!defaults_.count(key)) {
      std::vector<std::string> names;
      for (const auto &[n, v] : defaults_)
        names.push_back(n);
      throw error(name(), " optimiser: insertSpecific('", weight, "'): unknown hyperparameter '", key,
                  "' (accepted: ", joined(names), ")");
    }
    specific_[weight][key] = OptimizerValue(value);
  }
}

SGD::SGD(const Params &params, std::vector<ClipNormSettings> clip) {
  init(params,
       {{"learningRate", {0.01f, false}},
        {"momentum", {0.0f, true}},
        {"dampening", {0.0f, true}},
        {"weightDecay", {0.0f, true}},
        {"velocityScaling", {1.0f, true}},
        {"nesterov", {0.0f, true}}},
       std::move(clip));
}

std::vector<std::string> SGD::hyperParameterNames() const {
  return {"learningRate", "momentum", "dampening", "weightDecay", "velocityScaling", "nesterov"};
}

ConstSGD::ConstSGD(float learningRate, float weightDecay, float lossScaling)
    : SGD({{"defaultLearningRate", {learningRate, true}},
           {"defaultWeightDecay", {weightDecay, true}},
           {"lossScaling", {lossScaling, true}}}) {}

Adam::Adam(const Params &params, AdamMode mode, WeightDecayMode decayMode, std::vector<ClipNormSettings> clip)
    : mode_(mode), decayMode_(decayMode) {
  init(params,
       {{"learningRate", {0.001f, false}},
        {"beta1", {0.9f, true}},
        {"beta2", {0.999f, true}},
        {"eps", {1e-8f, true}},
        {"weightDecay", {0.0f, true}},
        {"maxWeightNorm", {0.0f, true}}},
       std::move(clip), {"maxWeightNorm"});
}

std::string Adam::name() const {
  switch (mode_) {
  case AdamMode::Adam: return decayMode_ == WeightDecayMode::Decay ? "adamw" : "adam";
  case AdamMode::AdamNoBias: return "adamnobias";
  case AdamMode::AdaMax: return "adamax";
  case AdamMode::Lamb: return "lamb";
  case AdamMode::LambNoBias: return "lambnobias";
  }
  return "adam";
}

std::vector<std::string> Adam::hyperParameterNames() const {
  return {"learningRate", "beta1", "beta2", "eps", "weightDecay", "maxWeightNorm"};
}

Adaptive::Adaptive(const Params &params, AdaptiveMode mode, std::vector<ClipNormSettings> clip) : mode_(mode) {
  float eps = mode == AdaptiveMode::AdaGrad ? 1e-10f : 1e-8f;
  init(params,
       {{"learningRate", {0.01f, false}},
        {"alpha", {0.99f, true}},
        {"momentum", {0.0f, true}},
        {"eps", {eps, true}},
        {"weightDecay", {0.0f, true}},
        {"learningRateDecay", {0.0f, true}},
        {"initialAccumulator", {0.0f, true}}},
       std::move(clip));
}

std::string Adaptive::name() const {
  switch (mode_) {
  case AdaptiveMode::AdaGrad: return "adagrad";
  case AdaptiveMode::RMSProp: return "rmsprop";
  case AdaptiveMode::CenteredRMSProp: return "centeredrmsprop";
  }
  return "rmsprop";
}

std::vector<std::string> Adaptive::hyperParameterNames() const {
  return {"learningRate", "alpha", "momentum", "eps", "weightDecay", "learningRateDecay", "initialAccumulator"};
}

} // namespace popart
