// CRC-32 (zlib: reflected 0xEDB88320) and CRC-32C (Castagnoli: reflected 0x82F63B78), both
// with initial value and final xor 0xFFFFFFFF. Portable slicing-by-8 tables; CRC-32C uses the
// CPU's instruction (SSE4.2 crc32, ARMv8 crc32c) when the compiler can emit it.
#include <cstring>

#include "evalue_store/reader.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
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
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const uint8_t* p, size_t n,
                                                         uint32_t crc) {
  uint64_t c = ~crc;
  while (n && (reinterpret_cast<uintptr_t>(p) & 7)) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  while (n--) c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
  return ~static_cast<uint32_t>(c);
}

bool have_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
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
  return crc_tables(crc32_tables(), static_cast<const uint8_t*>(data), n, crc);
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

// Exposed for the test of the portable path on machines with the instruction.
uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc) {
  return crc_tables(crc32c_tables(), static_cast<const uint8_t*>(data), n, crc);
}

}  // namespace evalue_store
