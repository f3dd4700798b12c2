// evs_bench FILE [ROUNDS]: nanoseconds per record for reading every record of FILE in order
// (random-access read(i), checksum on and off), the median of ROUNDS passes, in this
// thread's CPU time (a shared machine's load does not count). Prints JSON.
#include <algorithm>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "evalue_store/reader.h"

namespace evs = evalue_store;

static double cpu_ns() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e9 + static_cast<double>(t.tv_nsec);
}

static double pass_ns(const evs::Reader& reader, evs::Record* r, uint64_t* sink) {
  double start = cpu_ns();
  uint64_t n = reader.record_count();
  for (uint64_t i = 0; i < n; ++i) {
    if (reader.read(i, r)) std::abort();
    *sink += r->size() + static_cast<uint64_t>((*r)[0].kind);
  }
  return (cpu_ns() - start) / static_cast<double>(n ? n : 1);
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  int rounds = argc > 2 ? std::atoi(argv[2]) : 15;
  uint64_t sink = 0;
  evs::Reader readers[2];  // checksum on, off: passes alternate, so load hits both alike
  for (int verify = 0; verify < 2; ++verify) {
    evs::Options options;
    options.verify_checksums = verify == 0;
    evs::Error e = evs::Reader::open_file(argv[1], &readers[verify], options);
    if (e) {
      std::fprintf(stderr, "%s\n", e.message().c_str());
      return 1;
    }
  }
  evs::Record r;
  std::vector<double> times[2];
  for (int k = 0; k < rounds; ++k)
    for (int v = 0; v < 2; ++v) times[v].push_back(pass_ns(readers[v], &r, &sink));
  for (auto& t : times) std::sort(t.begin(), t.end());
  std::printf("{\"ns_per_record\": %.1f, \"ns_per_record_no_crc\": %.1f, \"sink\": %llu}\n",
              times[0][times[0].size() / 2], times[1][times[1].size() / 2],
              static_cast<unsigned long long>(sink % 10));
  return 0;
}
