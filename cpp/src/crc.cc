// CRC-32 (zlib: reflected 0xEDB88320) and CRC-32C (Castagnoli: reflected 0x82F63B78), both
// with initial value and final xor 0xFFFFFFFF. Portable slicing-by-8 tables; CRC-32C uses the
// CPU's instruction (SSE4.2 crc32, ARMv8 crc32c) when the compiler can emit it. On x86-64 it
// runs eight independent streams (the instruction's latency is three times its issue rate),
// in blocks of 8 KiB prefetched a block ahead on long buffers, and joins them by shifting a
// CRC over the bytes after it (a GF(2) operator, as tables). CRC-32 uses PCLMULQDQ where the
// CPU has it.
// The Python extension evalue_store._native is built from this file too.
#include <cstring>

#include "evalue_store/reader.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#include <xmmintrin.h>
#include <smmintrin.h>
#include <wmmintrin.h>
#define EVS_CRC32C_X86 1
#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
#define EVS_CRC32C_ARM 1
#endif

namespace evalue_store {
namespace {

struct Tables {
  uint32_t t[8][256];
  explicit Tables(uint32_t poly) {
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? poly ^ (c >> 1) : c >> 1;
      t[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; ++n)
      for (int s = 1; s < 8; ++s) t[s][n] = (t[s - 1][n] >> 8) ^ t[0][t[s - 1][n] & 0xFF];
  }
};

uint32_t crc_tables(const Tables& tb, const uint8_t* p, size_t n, uint32_t crc) {
  uint32_t c = ~crc;
  while (n && (reinterpret_cast<uintptr_t>(p) & 7)) {
    c = tb.t[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    --n;
  }
  for (; n >= 8; n -= 8, p += 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = tb.t[7][lo & 0xFF] ^ tb.t[6][(lo >> 8) & 0xFF] ^ tb.t[5][(lo >> 16) & 0xFF] ^
        tb.t[4][lo >> 24] ^ tb.t[3][hi & 0xFF] ^ tb.t[2][(hi >> 8) & 0xFF] ^
        tb.t[1][(hi >> 16) & 0xFF] ^ tb.t[0][hi >> 24];
  }
  while (n--) c = tb.t[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
  return ~c;
}

const Tables& crc32_tables() {
  static const Tables tables(0xEDB88320u);
  return tables;
}

const Tables& crc32c_tables() {
  static const Tables tables(0x82F63B78u);
  return tables;
}

#if defined(EVS_CRC32C_X86)
// The operator that appends ``bytes`` zero bytes to a CRC-32C register (no pre/post
// inversion), as four tables of 256: shift(c) = CRC register after c, then ``bytes`` zeros.
struct Shift {
  uint32_t t[4][256];
  void build(size_t bytes) {
    uint32_t op[32], out[32], next[32];
    op[0] = 0x82F63B78u;  // one zero bit: x -> x * x^1 mod P, as a matrix over GF(2)
    for (int k = 1; k < 32; ++k) op[k] = 1u << (k - 1);
    for (int k = 0; k < 32; ++k) out[k] = 1u << k;  // the identity
    for (size_t bits = 8 * bytes; bits; bits >>= 1) {  // out = op^bits, by squaring
      if (bits & 1) {
        for (int k = 0; k < 32; ++k) next[k] = times(op, out[k]);
        std::memcpy(out, next, sizeof out);
      }
      for (int k = 0; k < 32; ++k) next[k] = times(op, op[k]);
      std::memcpy(op, next, sizeof op);
    }
    for (uint32_t b = 0; b < 256; ++b)
      for (int k = 0; k < 4; ++k) t[k][b] = times(out, b << (8 * k));
  }
  static uint32_t times(const uint32_t* m, uint32_t v) {
    uint32_t r = 0;
    for (int k = 0; v; v >>= 1, ++k)
      if (v & 1) r ^= m[k];
    return r;
  }
  uint32_t operator()(uint64_t c) const {
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^
           t[3][(c >> 24) & 0xFF];
  }
};

// Below 8 * kBlock bytes: eight streams of stream(k) bytes each, k in [kMinShift,
// kMaxShift] (192 B to 576 B), and the shift over each length (built once). A stream is 2^k
// bytes and one cache line more: streams 2^k apart would all fall in the same L1 cache sets;
// a line apart they are in 8 sets.
constexpr int kMinShift = 7, kMaxShift = 9;

constexpr size_t stream(int k) { return (size_t{1} << k) + 64; }

// From 8 * kBlock bytes on: blocks of eight streams of kBlock bytes, one after the other,
// each line of the next block prefetched while the same line of this one is read. Eight
// streams an eighth of the buffer apart (this file's method before) read a 150 KB record
// from memory at 8.1 us on an AMD EPYC where one sequential read takes 5.8: the hardware
// prefetcher follows one stream well and eight far apart poorly; 8 KiB blocks with the
// prefetch one block ahead take 6.3 us (benchmarks/crc_dram.cc; 512 B and 2 KiB streams,
// prefetches 4 to 24 KiB ahead: 6.6-7.4 us). In cache they cost ~25% more than the far
// streams did (3.3 us against 2.7 at 150 KB), still several times memory's speed.
constexpr size_t kBlock = 1024;

struct Shifts {
  Shift by[kMaxShift - kMinShift + 1];
  Shift block;
  Shifts() {
    for (int k = kMinShift; k <= kMaxShift; ++k) by[k - kMinShift].build(stream(k));
    block.build(kBlock);
  }
};

const Shifts& shifts() {
  static const Shifts table;
  return table;
}

// The CRC register after c0, then 8 * Q bytes at p (Q a multiple of 64): eight streams over
// consecutive eighths, joined by shifting the CRC so far over one eighth and xoring the next
// stream's (eight, not the three the instruction's latency needs: more streams keep more
// loads in flight). ``kAhead``: each line of a stream is preceded by a prefetch of the same
// line of the next 8 * Q bytes (a prefetch past the buffer is harmless).
template <size_t Q, bool kAhead = false>
__attribute__((target("sse4.2"))) uint64_t crc32c_8way(const uint8_t* p, uint64_t c0,
                                                        const Shift& shift) {
  static_assert(Q % 64 == 0, "streams of whole lines");
  uint64_t c1 = 0, c2 = 0, c3 = 0, c4 = 0, c5 = 0, c6 = 0, c7 = 0;
  auto word = [](const uint8_t* q) {
    uint64_t w;
    std::memcpy(&w, q, 8);
    return w;
  };
  for (const uint8_t* line = p; line < p + Q; line += 64) {
    if constexpr (kAhead)
      for (size_t s = 0; s < 8; ++s)
        _mm_prefetch(reinterpret_cast<const char*>(line + (8 + s) * Q), _MM_HINT_T0);
    for (const uint8_t* q = line; q < line + 64; q += 8) {  // (an array of words went
      c0 = _mm_crc32_u64(c0, word(q));                      // through the stack: 4x slower)
      c1 = _mm_crc32_u64(c1, word(q + Q));
      c2 = _mm_crc32_u64(c2, word(q + 2 * Q));
      c3 = _mm_crc32_u64(c3, word(q + 3 * Q));
      c4 = _mm_crc32_u64(c4, word(q + 4 * Q));
      c5 = _mm_crc32_u64(c5, word(q + 5 * Q));
      c6 = _mm_crc32_u64(c6, word(q + 6 * Q));
      c7 = _mm_crc32_u64(c7, word(q + 7 * Q));
    }
  }
  for (uint64_t next : {c1, c2, c3, c4, c5, c6, c7}) c0 = shift(c0) ^ next;
  return c0;
}

using Streams = uint64_t (*)(const uint8_t*, uint64_t, const Shift&);
constexpr Streams kStreams[] = {crc32c_8way<stream(7)>, crc32c_8way<stream(8)>,
                                crc32c_8way<stream(9)>};
static_assert(sizeof kStreams / sizeof kStreams[0] == kMaxShift - kMinShift + 1, "");

__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const uint8_t* p, size_t n,
                                                         uint32_t crc) {
  uint64_t c = ~crc;
  while (n && (reinterpret_cast<uintptr_t>(p) & 7)) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  const Shifts& table = shifts();
  for (; n >= 8 * kBlock; p += 8 * kBlock, n -= 8 * kBlock)
    c = crc32c_8way<kBlock, true>(p, c, table.block);
  while (n >= 8 * stream(kMinShift)) {  // eight streams as long as fit
    int k = 63 - __builtin_clzll(n / 8);
    if (k > kMaxShift) k = kMaxShift;
    if (8 * stream(k) > n) --k;
    c = kStreams[k - kMinShift](p, c, table.by[k - kMinShift]);
    p += 8 * stream(k);
    n -= 8 * stream(k);
  }
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  while (n--) c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
  return ~static_cast<uint32_t>(c);
}

__attribute__((target("sse4.1,pclmul"))) inline __m128i load(const uint8_t* q) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
}

// x's two halves carried ``k``'s distances further, onto ``next``.
__attribute__((target("sse4.1,pclmul"))) inline __m128i fold(__m128i x, __m128i k,
                                                            __m128i next) {
  return _mm_xor_si128(
      _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

// CRC-32 (zlib's) by carry-less multiplication (PCLMULQDQ): four 128-bit lanes folded 64
// bytes at a time, then into one lane, then a Barrett reduction to 32 bits. The constants
// are x^k mod P for the fold distances, bit-reflected, as in Intel's white paper "Fast CRC
// Computation for Generic Polynomials Using PCLMULQDQ" and Linux's crc32-pclmul. Takes and
// returns the CRC register (no inversion); n >= 64 and a multiple of 16.
__attribute__((target("sse4.1,pclmul"))) uint32_t crc32_fold(const uint8_t* p, size_t n,
                                                             uint32_t c) {
  const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);  // fold by 512 bits
  const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);  // fold by 128 bits
  const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124);              // 64 -> 32 bits
  const __m128i poly = _mm_set_epi64x(0x1f7011641, 0x1db710641);  // mu, P (Barrett)
  const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
  __m128i x1 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(c)));
  __m128i x2 = load(p + 16), x3 = load(p + 32), x4 = load(p + 48);
  for (p += 64, n -= 64; n >= 64; p += 64, n -= 64) {
    x1 = fold(x1, k1k2, load(p));
    x2 = fold(x2, k1k2, load(p + 16));
    x3 = fold(x3, k1k2, load(p + 32));
    x4 = fold(x4, k1k2, load(p + 48));
  }
  x1 = fold(fold(fold(x1, k3k4, x2), k3k4, x3), k3k4, x4);
  for (; n >= 16; p += 16, n -= 16) x1 = fold(x1, k3k4, load(p));
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), _mm_clmulepi64_si128(x1, k3k4, 0x10));
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k5, 0x00),
                     _mm_srli_si128(x1, 4));
  __m128i t = _mm_and_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask32), poly, 0x10), mask32);
  t = _mm_xor_si128(_mm_clmulepi64_si128(t, poly, 0x00), x1);
  return static_cast<uint32_t>(_mm_extract_epi32(t, 1));
}

bool have_pclmul() {
  static const bool yes = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return yes;
}

bool have_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2") && (shifts(), true);
  return yes;
}
#elif defined(EVS_CRC32C_ARM)
uint32_t crc32c_arm(const uint8_t* p, size_t n, uint32_t crc) {
  uint32_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = __crc32cd(c, word);
  }
  while (n--) c = __crc32cb(c, *p++);
  return ~c;
}
#endif

}  // namespace

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
#if defined(EVS_CRC32C_X86)
  if (n >= 64 && have_pclmul()) {
    const size_t body = n & ~size_t{15};
    crc = ~crc32_fold(p, body, ~crc);
    p += body;
    n -= body;
  }
#endif
  return crc_tables(crc32_tables(), p, n, crc);
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
#if defined(EVS_CRC32C_X86)
  if (have_sse42()) return crc32c_sse42(p, n, crc);
#elif defined(EVS_CRC32C_ARM)
  return crc32c_arm(p, n, crc);
#endif
  return crc_tables(crc32c_tables(), p, n, crc);
}

bool crc32c_hardware() {
#if defined(EVS_CRC32C_X86)
  return have_sse42();
#elif defined(EVS_CRC32C_ARM)
  return true;
#else
  return false;
#endif
}

// Exposed for the tests of the portable paths on machines with the instructions.
uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc) {
  return crc_tables(crc32c_tables(), static_cast<const uint8_t*>(data), n, crc);
}

uint32_t crc32_portable(const void* data, size_t n, uint32_t crc) {
  return crc_tables(crc32_tables(), static_cast<const uint8_t*>(data), n, crc);
}

}  // namespace evalue_store
