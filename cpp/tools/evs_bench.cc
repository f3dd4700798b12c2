// evs_bench FILE [ROUNDS]: what the C++ reader costs, the median of ROUNDS passes, in this
// thread's CPU time (a shared machine's load does not count). Prints JSON:
//   open_us               Reader::open_file (map, header, last commit, index checks)
//   ns_per_record         read(i) of every record in order, checksum on, each tensor touched
//   ns_per_record_no_crc  the same, checksum off
//   ns_per_record_random  read(i) in a shuffled order (what training does), checksum on
#include <algorithm>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "evalue_store/reader.h"

namespace evs = evalue_store;

static double cpu_ns() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e9 + static_cast<double>(t.tv_nsec);
}

static double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// ns per record of reading the records at `order`, and the first byte of every tensor.
static double pass_ns(const evs::Reader& reader, const std::vector<uint64_t>& order,
                      evs::Record* r, uint64_t* sink) {
  double start = cpu_ns();
  for (uint64_t i : order) {
    if (reader.read(i, r)) std::abort();
    for (size_t k = 0; k < r->size(); ++k) {
      const evs::Value& v = (*r)[k];
      *sink += v.kind == evs::Kind::kTensor && v.tensor.nbytes
                   ? *static_cast<const uint8_t*>(v.tensor.data)
                   : static_cast<uint64_t>(v.kind);
    }
  }
  return (cpu_ns() - start) / static_cast<double>(order.empty() ? 1 : order.size());
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  int rounds = argc > 2 ? std::atoi(argv[2]) : 15;
  if (rounds < 1) return 2;
  uint64_t sink = 0;
  std::vector<double> opens;
  for (int k = 0; k < rounds; ++k) {
    evs::Reader reader;
    double start = cpu_ns();
    evs::Error e = evs::Reader::open_file(argv[1], &reader);
    opens.push_back((cpu_ns() - start) / 1e3);
    if (e) {
      std::fprintf(stderr, "%s\n", e.message().c_str());
      return 1;
    }
  }
  evs::Reader readers[2];  // checksum on, off: passes alternate, so load hits both alike
  for (int verify = 0; verify < 2; ++verify) {
    evs::Options options;
    options.verify_checksums = verify == 0;
    if (evs::Reader::open_file(argv[1], &readers[verify], options)) return 1;
  }
  std::vector<uint64_t> in_order(readers[0].record_count());
  std::iota(in_order.begin(), in_order.end(), 0);
  std::vector<uint64_t> shuffled = in_order;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937_64(0));
  evs::Record r;
  std::vector<double> times[3];
  for (int k = 0; k < rounds; ++k) {
    times[0].push_back(pass_ns(readers[0], in_order, &r, &sink));
    times[1].push_back(pass_ns(readers[1], in_order, &r, &sink));
    times[2].push_back(pass_ns(readers[0], shuffled, &r, &sink));
  }
  std::printf(
      "{\"open_us\": %.1f, \"ns_per_record\": %.1f, \"ns_per_record_no_crc\": %.1f, "
      "\"ns_per_record_random\": %.1f, \"sink\": %llu}\n",
      median(opens), median(times[0]), median(times[1]), median(times[2]),
      static_cast<unsigned long long>(sink % 10));
  return 0;
}
