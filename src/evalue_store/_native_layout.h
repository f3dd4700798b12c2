// The record layouts of evalue_store._native.Mapped, shared by its two files: how a layout
// is held (the structure bytes every record of one payload length repeats, and a step per
// value), the state a Mapped holds, and what _native_layout.cc does with them (a layout
// learnt, a record decoded with one, all forgotten). The type itself: _native_mapped.cc.
//
// numpy's C API: _native_mapped.cc imports it; any other file including this header
// defines NO_IMPORT_ARRAY before it (they share one table, PY_ARRAY_UNIQUE_SYMBOL).
#pragma once

#include "_native_parts.h"
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL evalue_store_native_ARRAY_API
#include <numpy/arrayobject.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace evalue_store_native {

// How a tensor is made from a buffer other than the mapping (as codec/layout.py does): a
// 1-D np.frombuffer, the same reshaped, or an np.ndarray with strides over its bytes.
enum Make : int { kFlat = 0, kReshape = 1, kStrided = 2 };

struct Step {
  int kind;
  int64_t at;        // byte offset in the frame
  int64_t size;      // a string's length; a tensor's count (kFlat, kReshape) or bytes
  char code;         // a scalar's: 'q' int64, 'd' float64
  PyObject* rows;    // a mapping's tensor: an array whose row k starts at byte
                     // k * alignment + at % alignment
  int make;          // a frame's tensor (no mapping): how (its strides given or C order),
  PyArray_Descr* descr;        // its dtype,
  std::vector<npy_intp> dims;  // shape,
  std::vector<npy_intp> strides;  // strides (kStrided)
  int64_t nbytes;              // and the bytes from its start to its end
};

// Shared by the MappedState and every decode using it: a decode that allocates can run a
// finalizer that changes the layouts (Python code), and must not see its own freed.
struct Layout {
  int64_t frame_size = 0;                         // header and payload
  std::vector<std::pair<int64_t, int64_t>> runs;  // (frame offset, length) of structure bytes
  std::string expected;                           // their bytes, concatenated
  std::vector<Step> steps;                        // each holds a reference to its rows
  Layout() = default;
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
  ~Layout() {
    for (Step& step : steps) {
      Py_XDECREF(step.rows);
      Py_XDECREF(step.descr);
    }
  }
};

// What a Mapped holds.
struct MappedState {
  PyObject* view = nullptr;      // the mapping (a read-only memoryview); None: frames only
  std::vector<int64_t> starts;   // the index: each segment's first record
  std::vector<int64_t> offsets;  // and its file offset
  int64_t count = 0;             // records
  int64_t alignment = 64;
  int64_t data_start = 0;
  int64_t reach = 0;  // a frame at offset o has at most reach - o payload bytes
  int64_t limit = -1;  // max_record_bytes, or -1
  uint32_t (*checksum)(const void*, size_t, uint32_t) = nullptr;  // null: not verified
  std::unordered_map<uint64_t, std::shared_ptr<const Layout>> layouts;  // by payload length
};

// Forgets every layout of ``s``.
void clear_layouts(MappedState* s);

// The record whose frame starts at ``pos`` in ``data`` (``size`` bytes), given its index
// entry: the mapping's (``frame_buf`` null: ``pos`` is the entry's offset, tensors are rows)
// or a decompressed frame's, exported from ``frame_buf``. A new reference, or nullptr with
// no error set when this path cannot serve it, or nullptr with an error set (memory; an
// exception raised by a value's construction is cleared).
PyObject* decode(MappedState* s, const uint8_t* data, int64_t size, int64_t pos,
                 PyObject* frame_buf, uint64_t offset, uint64_t length, uint32_t crc,
                 uint32_t reserved);

// add(length, runs, steps): the layout of records of ``length`` payload bytes. runs:
// [(frame offset, bytes)] of the structure bytes every record repeats; steps: one
// (kind, frame offset, detail) per value: a tensor's rows array, a scalar's code
// ('q' or 'd'), a string's byte length, else None. A new reference to None, or nullptr with
// an error set.
PyObject* add_layout(MappedState* s, PyObject* args);

// ``obj`` as an int64 in ``out``; false with a ValueError naming it (``name``) if it is not.
bool as_int64(PyObject* obj, const char* name, int64_t* out);

}  // namespace evalue_store_native
