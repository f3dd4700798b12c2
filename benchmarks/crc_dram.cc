// What a checksum read from memory can cost, single-threaded and with two threads: the
// experiments behind cpp/src/crc.cc's eight streams in prefetched 8 KiB blocks
// (benchmarks/results/crc_speed.md).
//
//   g++ -O2 -std=c++17 -Icpp/include benchmarks/crc_dram.cc cpp/src/crc.cc -o /tmp/crc_dram -lpthread
//   /tmp/crc_dram FILE   (FILE: >= 750 MB, in the page cache; e.g. a W2 file of 5,000 images)
//
// Per 150,528-byte record at 5,000 random places of the mapped file (out of the CPU caches),
// thread CPU time, median of 5: reads of the bytes (AVX2 sums: one stream, one stream with
// software prefetch D bytes ahead, eight streams an eighth apart), CRC-32C in one stream,
// three streams (the crc32c package's method), eight an eighth apart, and crc.cc's; then
// two threads (a thread started per call for the second half) against one, wall time, at
// 150 KB, 16 and 64 MiB.
#include <fcntl.h>
#include <immintrin.h>
#include <nmmintrin.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "evalue_store/reader.h"

namespace {

constexpr size_t kRecord = 150528;

__attribute__((target("sse4.2"))) uint32_t one_stream(const uint8_t* p, size_t n) {
  uint64_t c = ~0u;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
  }
  return ~static_cast<uint32_t>(c);
}

// Three streams 8 KiB apart, not joined (the joins cost nothing measurable here).
__attribute__((target("sse4.2"))) uint32_t three_streams(const uint8_t* p, size_t n) {
  constexpr size_t kLong = 8192;
  uint64_t c0 = ~0u, c1 = 0, c2 = 0;
  for (; n >= 3 * kLong; n -= 3 * kLong, p += 3 * kLong)
    for (size_t i = 0; i < kLong; i += 8) {
      uint64_t a, b, c;
      std::memcpy(&a, p + i, 8);
      std::memcpy(&b, p + i + kLong, 8);
      std::memcpy(&c, p + i + 2 * kLong, 8);
      c0 = _mm_crc32_u64(c0, a);
      c1 = _mm_crc32_u64(c1, b);
      c2 = _mm_crc32_u64(c2, c);
    }
  return static_cast<uint32_t>(c0 ^ c1 ^ c2) ^ one_stream(p, n);
}

// Eight streams an eighth of the buffer apart, not joined: crc.cc's method before its 8 KiB
// blocks (the read pattern of "read, eight streams").
__attribute__((target("sse4.2"))) uint32_t eighths(const uint8_t* p, size_t n) {
  const size_t q = n / 64 * 8;
  uint64_t c0 = ~0u, c1 = 0, c2 = 0, c3 = 0, c4 = 0, c5 = 0, c6 = 0, c7 = 0;
  auto word = [](const uint8_t* at) {
    uint64_t w;
    std::memcpy(&w, at, 8);
    return w;
  };
  for (const uint8_t* at = p; at < p + q; at += 8) {
    c0 = _mm_crc32_u64(c0, word(at));
    c1 = _mm_crc32_u64(c1, word(at + q));
    c2 = _mm_crc32_u64(c2, word(at + 2 * q));
    c3 = _mm_crc32_u64(c3, word(at + 3 * q));
    c4 = _mm_crc32_u64(c4, word(at + 4 * q));
    c5 = _mm_crc32_u64(c5, word(at + 5 * q));
    c6 = _mm_crc32_u64(c6, word(at + 6 * q));
    c7 = _mm_crc32_u64(c7, word(at + 7 * q));
  }
  const uint64_t all = c0 ^ c1 ^ c2 ^ c3 ^ c4 ^ c5 ^ c6 ^ c7;
  return static_cast<uint32_t>(all) ^ one_stream(p + 8 * q, n - 8 * q);
}

template <int D>
__attribute__((target("avx2"))) uint64_t read(const uint8_t* p, size_t n) {
  __m256i s = _mm256_setzero_si256();
  for (size_t i = 0; i + 64 <= n; i += 64) {
    if (D) _mm_prefetch(reinterpret_cast<const char*>(p + i + D), _MM_HINT_T0);
    s = _mm256_add_epi64(s, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    s = _mm256_add_epi64(s, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
  }
  return static_cast<uint64_t>(_mm256_extract_epi64(s, 0) + _mm256_extract_epi64(s, 1));
}

__attribute__((target("avx2"))) uint64_t read8(const uint8_t* p, size_t n) {
  __m256i s = _mm256_setzero_si256();
  const size_t q = n / 8 / 64 * 64;
  for (size_t i = 0; i < q; i += 64)
    for (int k = 0; k < 8; ++k) {
      const uint8_t* a = p + k * q + i;
      s = _mm256_add_epi64(s, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
      s = _mm256_add_epi64(s, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32)));
    }
  return static_cast<uint64_t>(_mm256_extract_epi64(s, 0) + _mm256_extract_epi64(s, 1));
}

double cpu_us() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return std::fprintf(stderr, "usage: %s FILE\n", argv[0]), 2;
  const int fd = open(argv[1], O_RDONLY);
  const size_t size = static_cast<size_t>(lseek(fd, 0, SEEK_END));
  const auto* base = static_cast<const uint8_t*>(mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0));
  if (fd < 0 || base == MAP_FAILED || size < (64u << 20) + 4096) return std::perror(argv[1]), 1;
  const size_t stride = kRecord + 64, count = std::min<size_t>(5000, (size - 4096) / stride);
  std::vector<const uint8_t*> at(count);
  for (size_t i = 0; i < count; ++i) at[i] = base + 4096 + i * stride;
  std::shuffle(at.begin(), at.end(), std::mt19937(3));
  volatile uint64_t sink = 0;
  for (const uint8_t* p : at) sink = sink + read<0>(p, kRecord);  // map every page
  auto run = [&](const char* name, auto fn) {
    std::vector<double> t;
    for (int rep = 0; rep < 5; ++rep) {
      const double start = cpu_us();
      for (const uint8_t* p : at) sink = sink + fn(p);
      t.push_back((cpu_us() - start) / count);
    }
    std::sort(t.begin(), t.end());
    std::printf("%-34s %6.2f us per record (thread CPU, median of 5)\n", name, t[2]);
  };
  run("read, one stream", [](const uint8_t* p) { return read<0>(p, kRecord); });
  run("read, prefetch 512 B ahead", [](const uint8_t* p) { return read<512>(p, kRecord); });
  run("read, prefetch 4 KiB ahead", [](const uint8_t* p) { return read<4096>(p, kRecord); });
  run("read, eight streams", [](const uint8_t* p) { return read8(p, kRecord); });
  run("CRC-32C, one stream", [](const uint8_t* p) { return one_stream(p, kRecord); });
  run("CRC-32C, three streams (8 KiB)", [](const uint8_t* p) { return three_streams(p, kRecord); });
  run("CRC-32C, eight streams (eighths)", [](const uint8_t* p) { return eighths(p, kRecord); });
  run("CRC-32C, crc.cc (8 KiB blocks)",
      [](const uint8_t* p) { return evalue_store::crc32c(p, kRecord); });
  for (size_t n : {kRecord, size_t{16} << 20, size_t{64} << 20}) {
    for (int threads = 1; threads <= 2; ++threads) {
      std::vector<double> t;
      for (int rep = 0; rep < 9; ++rep) {
        const uint8_t* p = base + 4096 + (rep * 7919 * 4096) % (size - n - 8192);
        const auto start = std::chrono::steady_clock::now();
        if (threads == 1) {
          sink = sink + evalue_store::crc32c(p, n);
        } else {  // (the halves' CRCs are not joined: the join costs nothing measurable)
          uint32_t half = 0;
          std::thread second([&] { half = evalue_store::crc32c(p + n / 2, n - n / 2); });
          sink = sink + evalue_store::crc32c(p, n / 2);
          second.join();
          sink = sink + half;
        }
        t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() -
                                                              start).count());
      }
      std::sort(t.begin(), t.end());
      std::printf("%9zu bytes, %d thread(s): %9.1f us wall (median of 9)\n", n, threads, t[4]);
    }
  }
  return 0;
}
