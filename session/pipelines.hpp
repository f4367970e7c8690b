#pragma once
// The inference and training pipelines: each a list of pass names, written once here, and how a
// session runs one (options, per-pass times, IR dumps).

#include "ir/passes/pass_manager.hpp"
#include <popart/sessionoptions.hpp>

#include <string>
#include <vector>

namespace popart::session {

/// Passes from import to lowering for InferenceSession.
const std::vector<std::string> &inferencePipeline();
/// Passes from import to lowering for TrainingSession.
const std::vector<std::string> &trainingPipeline();

/// Registers every pass of every library (ir, autodiff, optimizer); safe to call more than once.
void registerAllPasses();

/// The pipeline options \p options asks for: disabled passes, all optional ones off with
/// fuseOps = false, IR dumps on standard output, verification.
ir::PipelineOptions pipelineOptions(const SessionOptions &options);

/// Checks that the pass names in \p options exist and fit \p pipeline (called at session creation,
/// so that a misspelt name fails before anything compiles).
void checkPassOptions(const std::string &pipelineName, const std::vector<std::string> &pipeline,
                      const SessionOptions &options);

/// Both pipelines with each pass's purpose and needs, for popart-run --passes.
std::string describePipelines();

} // namespace popart::session
