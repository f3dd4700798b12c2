// Helpers shared by the reader's translation units (not part of the public API).
#pragma once

#include <cstddef>
#include <cstdint>

#include "evalue_store/reader.h"

namespace evalue_store {
namespace internal {

// True when [p, p + n) is valid UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF); else false, with *bad the offset of the first invalid sequence.
bool valid_utf8(const uint8_t* p, size_t n, size_t* bad);

// Decode the payload of the frame at base[frame] (length payload bytes; docs/FORMAT.md
// sections 4-5) into *out; offsets in errors count from base.
Error decode_record(const uint8_t* base, uint64_t frame, uint64_t length, uint32_t alignment,
                    Record* out);

}  // namespace internal
}  // namespace evalue_store
