// Optimisers arrive with the training issue; this library exists so the module layout and
// its link rules are in place from the start.
namespace popart::optimizer {
int placeholderVersion() { return 0; }
} // namespace popart::optimizer
