// Fuzz target of the C++ reader: any bytes, as a container image, must give only Error
// values, never a crash, a sanitizer report, a read outside the buffer or a hang.
//
// With clang:  clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined
//                -DEVS_LIBFUZZER -Iinclude src/*.cc fuzz/fuzz_reader.cc -o fuzz_reader
//              ./fuzz_reader -max_total_time=600 ../tests/fuzz_corpus/container
// Without -DEVS_LIBFUZZER it is a replay tool: fuzz_reader FILE... runs each file once
// (the first byte of a tests/fuzz_corpus input picks verify on/off, as in tools/fuzz.py).
#include <cstdio>
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
int main(int argc, char** argv) {
  for (int k = 1; k < argc; ++k) {
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
  }
  std::printf("replayed %d inputs\n", argc - 1);
  return 0;
}
#endif
