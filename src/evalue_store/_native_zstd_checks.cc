// The checks of a zstd frame that need no decoding (_native_zstd_checks.h): its header and
// block sizes against what it claims and what its bytes hold, and the reserved mode bits of
// its compressed blocks. Reads stay within the bytes they are given (header_size's: a frame
// checked_size accepted).
#include "_native_zstd_checks.h"

#include <algorithm>
#include <cstdint>

namespace evalue_store_native {
namespace {

constexpr int kWindowLogMax = 31;

}  // namespace

int64_t checked_size(const uint8_t* p, int64_t n, uint64_t cap) {
  if (n < 9 || le(p, 4) != kZstdMagic) return -1;
  int64_t header;
  uint64_t size, window;
  if (p[4] == kOwnDescriptor) {
    header = 7;
    size = le(p + 5, 2) + 256;
    window = size;
  } else {
    static const int did_sizes[] = {0, 1, 2, 4}, fcs_sizes[] = {0, 2, 4, 8};
    const uint8_t fhd = p[4];
    if (fhd & 0x08) return -1;  // reserved bit
    const bool single = fhd & 0x20;
    const int64_t pos = single ? 5 : 6;
    const int did = did_sizes[fhd & 3], fcs_flag = fhd >> 6;
    const int fcs = single && !fcs_flag ? 1 : fcs_sizes[fcs_flag];
    header = pos + did + fcs;
    if (n < header || fcs == 0 || !(fhd & 0x04)) return -1;  // no content size, no checksum
    const uint8_t* at = p + pos + did;
    size = fcs == 2 ? le(at, 2) + 256 : le(at, fcs);
    if (single) {
      window = size;
    } else {
      const int log = 10 + (p[5] >> 3);
      if (log > kWindowLogMax) return -1;
      const uint64_t base = uint64_t{1} << log;
      window = base + (base >> 3) * (p[5] & 7);
    }
  }
  if (size > cap) return -1;
  const uint64_t block_max = std::min(window, kBlockSizeMax);
  if (header + 3 <= n) {  // one compressed block, the last: a small frame's usual form
    const uint64_t block = le(p + header, 3);
    if ((block & 7) == 5 && block >> 3 <= block_max && size <= block_max &&
        header + 7 + static_cast<int64_t>(block >> 3) == n)
      return static_cast<int64_t>(size);
  }
  int64_t pos = header;  // walk the blocks (each at least 3 bytes: bounded by n)
  uint64_t lo = 0, hi = 0;
  while (true) {
    if (pos + 3 > n) return -1;
    const uint64_t block = le(p + pos, 3);
    pos += 3;
    const uint64_t type = (block >> 1) & 3, block_size = block >> 3;
    if (block_size > block_max || type == 3) return -1;
    if (type == 0) {
      pos += static_cast<int64_t>(block_size);
      lo += block_size;
      hi += block_size;
    } else if (type == 1) {
      pos += 1;
      lo += block_size;
      hi += block_size;
    } else {
      pos += static_cast<int64_t>(block_size);
      hi += block_max;
    }
    if (block & 1) break;
  }
  if (pos + 4 != n || size < lo || size > hi) return -1;
  return static_cast<int64_t>(size);
}

bool reserved_modes(const uint8_t* p, int64_t n) {
  if (n < 1) return false;
  const int type = p[0] & 3, format = (p[0] >> 2) & 3;
  int64_t header, content;  // the literals section's header and content sizes
  if (type < 2) {  // raw or RLE literals
    header = format == 1 ? 2 : format == 3 ? 3 : 1;
    if (n < header) return false;
    const int64_t regenerated = format == 1   ? le(p, 2) >> 4
                                : format == 3 ? le(p, 3) >> 4
                                              : p[0] >> 3;
    content = type == 0 ? regenerated : 1;
  } else {  // compressed or treeless: 10, 14 or 18-bit sizes
    header = format < 2 ? 3 : format == 2 ? 4 : 5;
    if (n < header) return false;
    const int bits = format < 2 ? 10 : format == 2 ? 14 : 18;
    content = static_cast<int64_t>((le(p, static_cast<int>(header)) >> (4 + bits)) &
                                   ((uint64_t{1} << bits) - 1));
  }
  int64_t at = header + content;  // Number_of_Sequences
  if (at >= n) return false;
  const uint8_t b = p[at];
  if (b == 0) return false;  // no sequences: no modes byte
  at += b < 128 ? 1 : b < 255 ? 2 : 3;
  return at < n && (p[at] & 3) != 0;
}

bool any_reserved_modes(const uint8_t* p, int64_t n, int64_t header) {
  int64_t pos = header;
  while (pos + 3 <= n) {
    const uint64_t block = le(p + pos, 3);
    const int64_t type = (block >> 1) & 3, size = static_cast<int64_t>(block >> 3);
    pos += 3;
    if (type == 2 && reserved_modes(p + pos, std::min(size, n - pos))) return true;
    pos += type == 1 ? 1 : size;
    if (block & 1) break;
  }
  return false;
}

int64_t header_size(const uint8_t* p) {
  if (p[4] == kOwnDescriptor) return 7;
  static const int did_sizes[] = {0, 1, 2, 4}, fcs_sizes[] = {0, 2, 4, 8};
  const uint8_t fhd = p[4];
  const bool single = fhd & 0x20;
  const int fcs_flag = fhd >> 6;
  return (single ? 5 : 6) + did_sizes[fhd & 3] + (single && !fcs_flag ? 1 : fcs_sizes[fcs_flag]);
}

}  // namespace evalue_store_native
