// What the training examples share: a joint forward-backward program's parameter and
// gradient positions among the outputs of "forward", and plain SGD over them. The wheel ships
// no training extension (no TrainingModule, no SGD), so the examples do this themselves.
#pragma once

#include <executorch/extension/module/module.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace examples {

// The Int returned by `method` (e.g. "__et_training_gradients_index_forward"); exits on error.
inline int64_t index_of(executorch::extension::module::Module& module, const char* method) {
  auto result = module.execute(method);
  if (!result.ok()) {
    std::fprintf(stderr, "%s failed: error 0x%x\n", method, static_cast<int>(result.error()));
    std::exit(1);
  }
  return result->at(0).toInt();
}

// The positions of the gradients and parameters among the outputs of "forward".
struct Layout {
  int64_t grads_at;
  int64_t params_at;
  explicit Layout(executorch::extension::module::Module& module)
      : grads_at(index_of(module, "__et_training_gradients_index_forward")),
        params_at(index_of(module, "__et_training_parameters_index_forward")) {}
};

// One SGD step in place: every float32 parameter -= lr * its gradient.
inline void sgd_step(const std::vector<executorch::runtime::EValue>& outputs,
                     const Layout& layout, float lr) {
  for (int64_t k = 0; k < layout.params_at - layout.grads_at; ++k) {
    auto param = outputs.at(static_cast<size_t>(layout.params_at + k)).toTensor();
    auto grad = outputs.at(static_cast<size_t>(layout.grads_at + k)).toTensor();
    float* p = param.mutable_data_ptr<float>();
    const float* g = grad.const_data_ptr<float>();
    for (ssize_t j = 0; j < param.numel(); ++j) p[j] -= lr * g[j];
  }
}

}  // namespace examples
