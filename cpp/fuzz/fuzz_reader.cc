// Fuzz target of the C++ reader: any bytes, as a container image, must give only Error
// values, never a crash, a sanitizer report, a read outside the buffer or a hang.
//
// With clang:  clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined
//                -DEVS_LIBFUZZER -Iinclude src/*.cc fuzz/fuzz_reader.cc -o fuzz_reader
//              ./fuzz_reader -max_total_time=600 ../tests/fuzz_corpus/container
// Without -DEVS_LIBFUZZER it is a replay tool: fuzz_reader [--mutate N] FILE... runs each
// file once (the first byte of a tests/fuzz_corpus input picks verify on/off, as in
// tools/fuzz.py) and, with --mutate, N random mutations of it too (a poor man's fuzzer for
// machines without clang: byte flips, sets, cuts, duplications and huge u64 fields).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "evalue_store/reader.h"

namespace evs = evalue_store;

namespace {

volatile uint64_t sink;  // keeps the reads of every handed-out byte

void touch(const evs::Record& r, const evs::Value& v) {
  uint64_t sum = 0;
  if (v.kind == evs::Kind::kTensor) {
    const uint8_t* p = static_cast<const uint8_t*>(v.tensor.data);
    for (uint64_t k = 0; k < v.tensor.nbytes; ++k) sum += p[k];
    for (int k = 0; k < v.tensor.rank; ++k) sum += v.tensor.size(k) + v.tensor.stride(k);
  } else if (v.kind == evs::Kind::kString) {
    for (uint64_t k = 0; k < v.count; ++k) sum += v.bytes[k];
  } else if (v.kind == evs::Kind::kListInt || v.kind == evs::Kind::kListDouble) {
    for (uint64_t k = 0; k < v.count; ++k) sum += static_cast<uint64_t>(v.int_at(k));
  } else if (v.kind == evs::Kind::kListBool) {
    for (uint64_t k = 0; k < v.count; ++k) sum += v.bool_at(k);
  } else if (v.kind == evs::Kind::kListTensor || v.kind == evs::Kind::kListOptionalTensor) {
    for (uint64_t k = 0; k < v.count; ++k) touch(r, r.item(v, k));
  }
  sink = sink + sum;
}

void run(const uint8_t* data, size_t size, bool verify) {
  evs::Reader reader;
  evs::Options options;
  options.verify_checksums = verify;
  if (evs::Reader::open_buffer(data, size, &reader, options)) return;
  std::string_view meta;
  (void)reader.metadata(&meta);
  evs::Record r;
  uint64_t n = reader.record_count() < 10000 ? reader.record_count() : 10000;
  for (uint64_t i = 0; i < n; ++i) {
    if (reader.read(i, &r)) continue;
    for (size_t k = 0; k < r.size(); ++k) touch(r, r[k]);
    const uint8_t* payload;
    uint64_t length;
    (void)reader.raw(i, &payload, &length);
  }
  evs::Scan scan(reader);
  while (scan.position() < n && scan.next(&r)) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The rest of the input, copied so that reads past it are caught by the sanitizer.
  std::vector<uint8_t> body(data + 1, data + size);
  run(body.data(), body.size(), !(data[0] & 8));
  return 0;
}

#ifndef EVS_LIBFUZZER
namespace {

void mutate(std::vector<uint8_t>* data, std::mt19937_64* rng) {
  static const uint64_t big[] = {0, 1, 0x7FFFFFFF, 0xFFFFFFFF, 1ull << 40, 1ull << 62, ~0ull};
  int ops = 1 + static_cast<int>((*rng)() % 4);
  for (int k = 0; k < ops && data->size() > 1; ++k) {
    size_t at = 1 + (*rng)() % (data->size() - 1);  // byte 0 is the mode
    switch ((*rng)() % 5) {
      case 0: (*data)[at] ^= static_cast<uint8_t>(1u << ((*rng)() % 8)); break;
      case 1: (*data)[at] = static_cast<uint8_t>((*rng)()); break;
      case 2: data->resize(at); break;
      case 3: {
        size_t n = std::min<size_t>(1 + (*rng)() % 64, data->size() - at);
        std::vector<uint8_t> piece(data->begin() + at, data->begin() + at + n);
        data->insert(data->begin() + at, piece.begin(), piece.end());
        break;
      }
      default:
        if (at + 8 <= data->size()) std::memcpy(data->data() + at, &big[(*rng)() % 7], 8);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int mutations = 0, inputs = 0;
  std::mt19937_64 rng(15);
  for (int k = 1; k < argc; ++k) {
    if (std::strcmp(argv[k], "--mutate") == 0 && k + 1 < argc) {
      mutations = std::atoi(argv[++k]);
      continue;
    }
    FILE* f = std::fopen(argv[k], "rb");
    if (f == nullptr) {
      std::perror(argv[k]);
      return 2;
    }
    std::vector<uint8_t> data;
    uint8_t buf[65536];
    size_t got;
    while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) data.insert(data.end(), buf, buf + got);
    std::fclose(f);
    LLVMFuzzerTestOneInput(data.data(), data.size());
    ++inputs;
    for (int m = 0; m < mutations; ++m) {
      std::vector<uint8_t> mutant = data;
      mutate(&mutant, &rng);
      LLVMFuzzerTestOneInput(mutant.data(), mutant.size());
    }
  }
  std::printf("replayed %d inputs, %d mutants\n", inputs, inputs * mutations);
  return 0;
}
#endif
