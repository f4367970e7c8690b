// Gradient rules of elementwise ops.

#include "autodiff/grad_rules.hpp"

namespace popart::autodiff {

void registerElementwiseRules(std::map<std::string, GradRule> &r) {
  std::map<std::string, GradRule> rules{
      {"Identity", [](GradContext &c) { c.setInGrad(0, c.outGrad(0)); }},
      {"Add",
       [](GradContext &c) {
         c.setInGrad(0, c.outGrad(0));
         c.setInGrad(1, c.outGrad(0));
       }},
      {"Sub",
       [](GradContext &c) {
         c.setInGrad(0, c.outGrad(0));
         c.setInGrad(1, c.add("Neg", {c.outGrad(0)}));
       }},
      {"Mul",
       [](GradContext &c) {
         c.setInGrad(0, c.add("Mul", {c.outGrad(0), c.in(1)}));
         c.setInGrad(1, c.add("Mul", {c.outGrad(0), c.in(0)}));
       }},
      {"Div",
       [](GradContext &c) { // d(a/b) = g/b, -g·a/b²
         c.setInGrad(0, c.add("Div", {c.outGrad(0), c.in(1)}));
         TensorId q = c.add("Div", {c.out(0), c.in(1)});
         c.setInGrad(1, c.add("Neg", {c.add("Mul", {c.outGrad(0), q})}));
       }},
      {"Neg", [](GradContext &c) { c.setInGrad(0, c.add("Neg", {c.outGrad(0)})); }},
      {"Exp", [](GradContext &c) { c.setInGrad(0, c.add("Mul", {c.outGrad(0), c.out(0)})); }},
      {"Tanh",
       [](GradContext &c) { // g·(1 − y²)
         TensorId y2 = c.add("Mul", {c.out(0), c.out(0)});
         c.setInGrad(0, c.add("Mul", {c.outGrad(0), c.add("Sub", {c.scalar(1), y2})}));
       }},
      {"Sigmoid",
       [](GradContext &c) { // g·y·(1 − y)
         TensorId oneMinus = c.add("Sub", {c.scalar(1), c.out(0)});
         c.setInGrad(0, c.add("Mul", {c.outGrad(0), c.add("Mul", {c.out(0), oneMinus})}));
       }},
      {"Relu",
       [](GradContext &c) { // g where x > 0
         TensorId positive = c.add("Greater", {c.in(0), c.scalar(0)});
         c.setInGrad(0, c.add("Where", {positive, c.outGrad(0), c.scalar(0)}));
       }},
  };
  r.insert(rules.begin(), rules.end());
}

} // namespace popart::autodiff
