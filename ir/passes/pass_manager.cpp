// The pass registry and the pipeline runner (see pass_manager.hpp).

#include "ir/passes/pass_manager.hpp"
#include "core/log.hpp"
#include "ir/verify.hpp"
#include <popart/error.hpp>

#include <chrono>

namespace popart::ir {

std::string stageNames(unsigned stages) {
  static const std::pair<Stage, const char *> names[] = {
      {ShapesInferred, "shapes inferred"},     {ControlFlowUnrolled, "control flow unrolled"},
      {TrainingPrepared, "training prepared"}, {GradientsBuilt, "gradients built"},
      {OptimizerApplied, "optimiser applied"}, {OutputsFixed, "outputs fixed"}};
  std::string s;
  for (const auto &[bit, name] : names)
    if (stages & bit) s += (s.empty() ? "" : ", ") + std::string(name);
  return s;
}

Pass optionalPass(std::string name, std::string purpose, unsigned needs,
                  std::function<int(Graph &, PassContext &)> run) {
  Pass p;
  p.name = std::move(name);
  p.purpose = std::move(purpose);
  p.needs = ShapesInferred | needs;
  p.optional = true;
  p.run = std::move(run);
  return p;
}

PassRegistry &PassRegistry::instance() {
  static PassRegistry registry;
  return registry;
}

void PassRegistry::add(Pass pass) {
  if (find(pass.name)) throw error("pass '", pass.name, "' is registered twice");
  if (!pass.run) throw error("pass '", pass.name, "' has no run function");
  passes_.push_back(std::move(pass));
}

const Pass *PassRegistry::find(const std::string &name) const {
  for (const Pass &p : passes_)
    if (p.name == name) return &p;
  return nullptr;
}

std::vector<std::string> PassRegistry::names() const {
  std::vector<std::string> names;
  for (const Pass &p : passes_)
    names.push_back(p.name);
  return names;
}

const Pass &PassRegistry::get(const std::string &name) const {
  if (const Pass *p = find(name)) return *p;
  std::string known;
  for (const Pass &p : passes_)
    known += (known.empty() ? "" : ", ") + p.name;
  throw error("unknown pass '", name, "' (known passes: ", known, ")");
}

unsigned stagesAfter(const std::vector<std::string> &pipeline) {
  unsigned stages = 0;
  for (const std::string &name : pipeline) {
    const Pass &pass = PassRegistry::instance().get(name);
    stages = (stages & ~pass.invalidates) | pass.establishes;
  }
  return stages;
}

void checkPipeline(const std::string &pipelineName, const std::vector<std::string> &pipeline,
                   const PipelineOptions &options) {
  const PassRegistry &registry = PassRegistry::instance();
  unsigned stages = options.entryStages;
  for (const std::string &name : pipeline) {
    const Pass &pass = registry.get(name);
    if (unsigned missing = pass.needs & ~stages)
      throw error("pipeline '", pipelineName, "': pass '", name, "' needs ", stageNames(missing),
                  ", which no pass before it establishes");
    if (unsigned early = pass.before & stages)
      throw error("pipeline '", pipelineName, "': pass '", name, "' must run before ", stageNames(early), " (",
                  pass.purpose, ")");
    stages = (stages & ~pass.invalidates) | pass.establishes;
  }
  for (const std::string &name : options.disabled) {
    const Pass &pass = registry.get(name);
    if (!pass.optional)
      throw error("pass '", name, "' cannot be disabled: the ", pipelineName, " pipeline needs it (", pass.purpose,
                  ")");
  }
  for (const std::string &name : options.dumpAfter)
    registry.get(name); // a pass of the other pipeline only dumps nothing here
}

std::vector<PassRecord> runPipeline(const std::string &pipelineName, const std::vector<std::string> &pipeline,
                                    Graph &graph, PassContext &context, const PipelineOptions &options) {
  checkPipeline(pipelineName, pipeline, options);
  const PassRegistry &registry = PassRegistry::instance();
  std::vector<PassRecord> records;
  unsigned stages = options.entryStages;
  for (const std::string &name : pipeline) {
    const Pass &pass = registry.get(name);
    PassRecord record;
    record.name = name;
    if (pass.optional && (options.skipOptional || options.disabled.count(name))) {
      record.skipped = true;
    } else {
      auto start = std::chrono::steady_clock::now();
      record.rewrites = pass.run(graph, context);
      record.milliseconds = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      logging::logger().debug("pass {}: {} rewrites in {:.3f} ms", name, record.rewrites, record.milliseconds);
    }
    stages = (stages & ~pass.invalidates) | pass.establishes;
    if (options.verify && !record.skipped) {
      VerifyOptions vo;
      vo.outputInfos = (stages & ShapesInferred) != 0;
      verifyGraph(graph, "after pass '" + name + "'", vo);
    }
    if (options.dumpAfter.count(name) && options.dump) options.dump(name, graph);
    records.push_back(std::move(record));
  }
  return records;
}

} // namespace popart::ir
