// The parts of evalue_store._native defined outside _native.cc, which adds them to the
// module when it is imported (each add_ returns -1 with a Python error set on failure),
// and what they share: the container's structs as the compiled readers see them, the
// value kinds of a layout, and a held buffer export.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <cstring>
#include <vector>

// _native_mapped.cc: the type Mapped (ds[i] of a plain mapped file in one call; its record
// layouts: _native_layout.cc).
int add_mapped_type(PyObject* module);

// _native_batch.cc: the type BatchPlan (get_batch's records of one layout, one pass each).
int add_batch_type(PyObject* module);

namespace evalue_store_native {

// _native_zstd.cc: the ZstdGet and ZstdFrame types (ds[i] of a compressed file's frame;
// with _native_zstd_frame.cc and _native_zstd_checks.cc).
int add_zstd(PyObject* module);

// Where a ZstdGet found record i of a compressed file: its frame's decompressed bytes
// (``buf``, a new reference: a ZstdFrame, or a buffer the general path cached), the place
// of the record's frame header in them, its logical offset, and its payload length and crc
// as that header gives them; the file offset and span of the zstd frame.
struct Located {
  PyObject* buf;
  int64_t position;
  uint64_t logical, length, phys;
  uint32_t crc, span;
};

bool is_zstd_get(PyObject* obj);
bool is_zstd_frame(PyObject* obj);

// Record ``i`` of ``zget`` (a ZstdGet) through its locator: 1 and ``out`` set; 0 when it
// is not served so (a check fails, the record spans frames, the file is closed): the
// general path reads it or says why; -1 with a Python error set.
int locate(PyObject* zget, long long i, Located* out);

// _native.cc: the int64 values of ``obj`` (a 1-D or 0-D int64 buffer; ``name`` for errors)
// copied into ``out``, its dimensions into ``ndim``; false with a Python error set (TypeError
// for another buffer or element type, ValueError for more dimensions) if it is not one.
bool int64_values(PyObject* obj, const char* name, std::vector<int64_t>* out, int* ndim);

// _native_gather.cc: locate_batch (a compressed file's batch of records, in their frames).
int add_gather(PyObject* module);

// _native_readonly.cc: the types FileMap (a plain file's private mapping) and ReadOnly (a
// filled buffer), both exported read-only.
int add_read_only(PyObject* module);

// A record's frame header (docs/FORMAT.md): magic (4), crc32 (4), payload length (8); an
// index entry: offset (8), length (8), crc (4), reserved (4). Little-endian.
constexpr int64_t kFrameSize = 16;
constexpr int64_t kFrameCrcAt = 4;
constexpr int64_t kEntrySize = 24;

// Work on fewer bytes than this keeps the GIL: releasing and taking it back costs more,
// and under contention can wait a switch interval.
constexpr int64_t kReleaseGil = 32 << 10;

// Value kinds of a layout's slots, as codec/kinds.py numbers them.
enum Kind : int { kNone = 0, kTensor = 1, kText = 2, kBytes = 3, kScalar = 4, kBool = 5 };

inline uint64_t load_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
#if PY_BIG_ENDIAN
  v = __builtin_bswap64(v);
#endif
  return v;
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
#if PY_BIG_ENDIAN
  v = __builtin_bswap32(v);
#endif
  return v;
}

// A buffer export held for the lifetime of a call.
struct Buffer {
  Py_buffer b{};
  bool held = false;
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (held) PyBuffer_Release(&b);
  }
  bool get(PyObject* obj, int flags) {
    held = PyObject_GetBuffer(obj, &b, flags) == 0;
    return held;
  }
};

}  // namespace evalue_store_native
