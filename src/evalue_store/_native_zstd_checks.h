// The checks of a zstd frame that need no decoding, which ZstdGet (_native_zstd.cc) makes
// before it decompresses a frame (FRAMES.md section 3; zframe.check_frame's rules), the
// format's constants they and ZstdGet read, and ``le``, the little-endian read of 1 to 8
// bytes. Functions of the bytes they are given only; their definitions: _native_zstd_checks.cc.
#pragma once

#include <cstdint>

namespace evalue_store_native {

constexpr uint32_t kZstdMagic = 0xFD2FB528;
constexpr uint8_t kOwnDescriptor = 0x64;  // 2-byte content size, single segment, checksum
constexpr uint64_t kBlockSizeMax = 128 * 1024;

inline uint64_t le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = v << 8 | p[k];
  return v;
}

// The content size of the zstd frame that fills exactly [p, p + n), after every check that
// needs no decoding (zframe.check_frame's rules: magic, a recorded content size no larger
// than ``cap`` nor than its blocks can produce, a content checksum, blocks within
// Block_Maximum_Size); -1 if it breaks one.
int64_t checked_size(const uint8_t* p, int64_t n, uint64_t cap);

// True if the compressed block [p, p + n) sets the reserved bits of its
// Symbol_Compression_Modes (RFC 8878 section 3.1.1.3.2.1: they must be zero). libzstd
// checks this from 1.5.6 on; an older system libzstd decodes such a block, while the
// general path's decoder (python-zstandard's, newer) rejects it: checked here so that both
// paths accept the same frames. Bytes a header claims beyond the block: not this check's
// (the decoder rejects them).
bool reserved_modes(const uint8_t* p, int64_t n);

// True if any compressed block of the zstd frame [p, p + n) with blocks from ``header``
// sets reserved mode bits (the frame has passed checked_size: its blocks lie inside it).
bool any_reserved_modes(const uint8_t* p, int64_t n, int64_t header);

// The header size of a frame checked_size accepted (its descriptor's fields).
int64_t header_size(const uint8_t* p);

}  // namespace evalue_store_native
