// Train ExecuTorch's XOR training program (a joint forward-backward .pte) on records read
// from an evalue_store container, as an app on device would: each record is [x float32 [1, 2],
// y int64 [1]], wrapped in place as ExecuTorch tensors (no copy) and fed to the program's
// "forward" method, whose outputs are the loss, the gradients and the parameters; plain SGD
// updates the parameters in place.
//
//   train_xor MODEL.pte DATA.evs STEPS LR [memory]
//
// "memory" copies every record into process memory first and feeds from there (the
// baseline). Prints one loss per line, then "steps_per_s <n>" (the training loop only).
#include <executorch/extension/module/module.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "evalue_store/executorch.h"
#include "evalue_store/reader.h"
#include "training.h"

namespace evs = evalue_store;
using executorch::extension::TensorPtr;
using executorch::extension::module::Module;
using executorch::runtime::EValue;

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: train_xor MODEL.pte DATA.evs STEPS LR [memory]\n");
    return 2;
  }
  const long steps = std::atol(argv[3]);
  const float lr = static_cast<float>(std::atof(argv[4]));
  const bool from_memory = argc > 5 && std::strcmp(argv[5], "memory") == 0;

  evs::Reader reader;
  evs::Error e = evs::Reader::open_file(argv[2], &reader);
  if (e || reader.record_count() == 0) {
    std::fprintf(stderr, "%s: %s\n", argv[2], e ? e.message().c_str() : "no records");
    return 1;
  }
  Module module(argv[1], Module::LoadMode::File);
  const examples::Layout layout(module);

  // The baseline: every record's tensors copied into memory once, then wrapped from there.
  std::vector<std::vector<float>> xs;
  std::vector<std::vector<int64_t>> ys;
  evs::Record record;
  if (from_memory) {
    for (uint64_t i = 0; i < reader.record_count(); ++i) {
      if ((e = reader.read(i, &record))) break;
      auto x = static_cast<const float*>(record[0].tensor.data);
      auto y = static_cast<const int64_t*>(record[1].tensor.data);
      xs.emplace_back(x, x + record[0].tensor.numel);
      ys.emplace_back(y, y + record[1].tensor.numel);
    }
  }
  evs::et::EValues inputs;
  std::vector<EValue> memory_inputs(2);
  std::vector<float> losses;
  losses.reserve(static_cast<size_t>(steps));
  auto start = std::chrono::steady_clock::now();
  for (long step = 0; step < steps && !e; ++step) {
    uint64_t i = static_cast<uint64_t>(step) % reader.record_count();
    const std::vector<EValue>* feed;
    TensorPtr x, y;
    if (from_memory) {
      x = executorch::extension::from_blob(xs[i].data(), {1, 2});
      y = executorch::extension::from_blob(ys[i].data(), {1}, executorch::aten::ScalarType::Long);
      memory_inputs[0] = *x;
      memory_inputs[1] = *y;
      feed = &memory_inputs;
    } else {
      if ((e = reader.read(i, &record)) || (e = inputs.set(record))) break;
      feed = &inputs.values();
    }
    auto out = module.execute("forward", *feed);
    if (!out.ok()) {
      std::fprintf(stderr, "forward failed at step %ld: error 0x%x\n", step,
                   static_cast<int>(out.error()));
      return 1;
    }
    losses.push_back(out->at(0).toTensor().const_data_ptr<float>()[0]);
    examples::sgd_step(*out, layout, lr);
  }
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (e) {
    std::fprintf(stderr, "%s\n", e.message().c_str());
    return 1;
  }
  for (float loss : losses) std::printf("%.9g\n", loss);
  std::printf("steps_per_s %.1f\n", static_cast<double>(steps) / seconds);
  return 0;
}
