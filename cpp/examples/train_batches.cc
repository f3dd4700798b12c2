// Train a static-batch ExecuTorch training program (a joint forward-backward .pte whose
// "forward" takes float32 [B, ...] inputs and int64 [B] labels, e.g. the 32x32 MLP of
// tests/et_programs.py) on batches read from an evalue_store container: each record is
// [x float32 tensor (the input's per-example shape, or with a leading 1), label (an Int, or
// an int64 tensor of one element)]. Every epoch visits the records in a seeded shuffled
// order; a batch is B records' tensors copied into one [B, ...] buffer (the program wants one
// contiguous tensor), then "forward" and plain SGD on the parameters it returns.
//
//   train_batches MODEL.pte DATA.evs STEPS LR [memory]
//
// "memory" first copies every record into one in-memory array and gathers batches from
// there (the baseline: the same copies, no reading). Prints one loss per line, then
// "steps_per_s <n>" (the training loop, wall time), "cpu_steps_per_s <n>" (the same in this
// thread's CPU time: a shared machine's load does not count, nor ExecuTorch's kernel
// threads) and "feed_ns_per_record <n>" (gathering batches alone, reading included, in this
// thread's CPU time).
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr_maker.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "evalue_store/reader.h"
#include "training.h"

namespace evs = evalue_store;
using executorch::aten::ScalarType;
using executorch::extension::module::Module;
using executorch::runtime::EValue;
using Clock = std::chrono::steady_clock;

namespace {

double cpu_ns() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e9 + static_cast<double>(t.tv_nsec);
}

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::exit(1);
}

// What the program's "forward" wants: B examples of `shape` (float32), B int64 labels.
struct Inputs {
  int32_t batch = 0;
  std::vector<int32_t> shape;  // one example's
  size_t row = 1;              // elements per example
};

Inputs program_inputs(Module& module) {
  auto meta = module.method_meta("forward");
  if (!meta.ok() || meta->num_inputs() != 2) fail("the program's forward must take 2 inputs");
  auto x = meta->input_tensor_meta(0);
  auto y = meta->input_tensor_meta(1);
  if (!x.ok() || !y.ok() || x->scalar_type() != ScalarType::Float ||
      y->scalar_type() != ScalarType::Long || x->sizes().size() < 1 || y->sizes().size() != 1 ||
      y->sizes()[0] != x->sizes()[0])
    fail("the program's forward must take float32 [B, ...] and int64 [B]");
  Inputs in;
  in.batch = x->sizes()[0];
  if (in.batch < 1) fail("the program's batch size must be at least 1");
  for (size_t k = 1; k < x->sizes().size(); ++k) {
    in.shape.push_back(x->sizes()[k]);
    in.row *= static_cast<size_t>(x->sizes()[k]);
  }
  return in;
}

// Record i's example and label, checked against the program's inputs; exits naming the
// record and field that do not fit.
void example(const evs::Reader& reader, const Inputs& in, uint64_t i, evs::Record* r,
             const float** x, int64_t* y) {
  auto where = [i] { return "record " + std::to_string(i); };
  if (evs::Error e = reader.read(i, r)) fail(where() + ": " + e.message());
  if (r->size() != 2) fail(where() + ": " + std::to_string(r->size()) + " values, want 2");
  const evs::Value& v = (*r)[0];
  const evs::TensorView& t = v.tensor;
  bool lead = v.kind == evs::Kind::kTensor && t.rank == in.shape.size() + 1 && t.size(0) == 1;
  bool fits = v.kind == evs::Kind::kTensor && t.dtype == evs::Dtype::kFloat32 &&
              !t.has_dim_order() && (lead || t.rank == in.shape.size());
  for (size_t k = 0; fits && k < in.shape.size(); ++k)
    fits = t.size(static_cast<int>(k + lead)) == static_cast<uint64_t>(in.shape[k]);
  if (!fits) fail(where() + ", field 0: want a row-major float32 tensor of one example's shape");
  *x = static_cast<const float*>(t.data);
  const evs::Value& label = (*r)[1];
  if (label.kind == evs::Kind::kInt) {
    *y = label.i;
  } else if (label.kind == evs::Kind::kTensor && label.tensor.dtype == evs::Dtype::kInt64 &&
             label.tensor.numel == 1) {
    std::memcpy(y, label.tensor.data, sizeof *y);
  } else {
    fail(where() + ", field 1: want an Int or an int64 tensor of one element");
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: train_batches MODEL.pte DATA.evs STEPS LR [memory]\n");
    return 2;
  }
  char* end = nullptr;
  const long steps = std::strtol(argv[3], &end, 10);
  if (end == argv[3] || *end != '\0' || steps < 1 || steps > 1000000000L)
    fail(std::string("STEPS must be a whole number from 1 to 10^9, not '") + argv[3] + "'");
  const float lr = std::strtof(argv[4], &end);
  if (end == argv[4] || *end != '\0' || !std::isfinite(lr))
    fail(std::string("LR must be a finite number, not '") + argv[4] + "'");
  const bool from_memory = argc > 5 && std::strcmp(argv[5], "memory") == 0;

  evs::Reader reader;
  if (evs::Error e = evs::Reader::open_file(argv[2], &reader)) fail(argv[2] + (": " + e.message()));
  Module module(argv[1], Module::LoadMode::File);
  const Inputs in = program_inputs(module);
  const examples::Layout layout(module);
  const uint64_t n = reader.record_count();
  const auto batch = static_cast<uint64_t>(in.batch);
  if (n < batch) fail("fewer records than one batch");

  // The baseline's in-memory arrays: every example and label copied once.
  std::vector<float> xs;
  std::vector<int64_t> ys;
  evs::Record record;
  const float* x;
  int64_t y;
  if (from_memory) {
    xs.resize(n * in.row);
    ys.resize(n);
    for (uint64_t i = 0; i < n; ++i) {
      example(reader, in, i, &record, &x, &ys[i]);
      std::memcpy(&xs[i * in.row], x, in.row * sizeof(float));
    }
  }

  std::vector<float> bx(batch * in.row);
  std::vector<int64_t> by(batch);
  std::vector<int32_t> sizes{in.batch};
  sizes.insert(sizes.end(), in.shape.begin(), in.shape.end());
  auto tx = executorch::extension::from_blob(bx.data(), sizes);
  auto ty = executorch::extension::from_blob(by.data(), {in.batch}, ScalarType::Long);
  const std::vector<EValue> inputs{*tx, *ty};

  std::vector<uint64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  uint64_t at = n;  // position in the epoch's order
  std::mt19937_64 rng(0);
  std::vector<float> losses;
  losses.reserve(static_cast<size_t>(std::min(steps, 1L << 20)));  // grows past that
  double fed = 0;  // ns
  auto start = Clock::now();
  double cpu_start = cpu_ns();
  for (long step = 0; step < steps; ++step) {
    double begin = cpu_ns();
    if (at + batch > n) {  // a new epoch: drop the partial batch, reshuffle
      std::shuffle(order.begin(), order.end(), rng);
      at = 0;
    }
    for (uint64_t k = 0; k < batch; ++k, ++at) {
      uint64_t i = order[at];
      if (from_memory) {
        x = &xs[i * in.row];
        y = ys[i];
      } else {
        example(reader, in, i, &record, &x, &y);
      }
      std::memcpy(&bx[k * in.row], x, in.row * sizeof(float));
      by[k] = y;
    }
    fed += cpu_ns() - begin;
    auto out = module.execute("forward", inputs);
    if (!out.ok())
      fail("forward failed at step " + std::to_string(step) + ": error " +
           std::to_string(static_cast<int>(out.error())));
    losses.push_back(out->at(0).toTensor().const_data_ptr<float>()[0]);
    examples::sgd_step(*out, layout, lr);
  }
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  double cpu_seconds = (cpu_ns() - cpu_start) / 1e9;
  for (float loss : losses) std::printf("%.9g\n", loss);
  std::printf("steps_per_s %.2f\n", static_cast<double>(steps) / seconds);
  std::printf("cpu_steps_per_s %.2f\n", static_cast<double>(steps) / cpu_seconds);
  std::printf("feed_ns_per_record %.1f\n", fed / static_cast<double>(steps * in.batch));
  return 0;
}
