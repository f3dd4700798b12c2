// evalue_store._native.gather_located: a compressed file's batch of records, found as
// ds[i] finds each (``locate``, _native_zstd.cc: the locator, then the frame, each frame
// decompressed once while cached), copied into one buffer for the batch decoder. In Python
// this was a call, a tuple, a memoryview, a slice and two copies per record: twice the
// time of ds[i] itself (W1, batches of 256).
//
// Every record is located with all the frame layer's checks; its frame header and payload
// are checked by ``locate`` to lie inside its frame before they are copied, and the batch
// stops at ``limit`` bytes. A record that is not found so (any failed check, a record
// across frames) makes the whole answer None: the caller reads the batch record by record,
// and that path says what is wrong.
#include "_native_parts.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace evalue_store_native {
namespace {

struct Part {
  PyObject* buf;  // the frame (a reference held while the batch is made)
  int64_t position, length, place;
  uint64_t offset;
  uint32_t crc;
};

struct Parts {
  std::vector<Part> v;
  ~Parts() {
    for (Part& p : v) Py_DECREF(p.buf);
  }
};

// A batch's buffer of several MiB is fresh memory at every batch (the allocator hands
// blocks this large back to the system when they are freed), a page fault per 4 KiB as it
// is filled: asked for in huge pages, as numpy asks for its large arrays, it faults once
// per 2 MiB (W2's 150 KB images in batches of 64: 151 -> 75 us a record). Advice only.
void prefer_huge_pages(uint8_t* p, size_t n) {
#ifdef MADV_HUGEPAGE
  constexpr uintptr_t kPage = 4096;
  if (n < (size_t{4} << 20)) return;
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + kPage - 1) & ~(kPage - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + n) & ~(kPage - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#else
  (void)p;
  (void)n;
#endif
}

void store(uint8_t* p, uint64_t value, int n) {  // little-endian
  for (int k = 0; k < n; ++k) p[k] = static_cast<uint8_t>(value >> (8 * k));
}

// gather_located(zget, positions, alignment, limit)
//   -> (entries, buffer, shift, size, places) | None
PyObject* gather_located(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4)
    return PyErr_Format(PyExc_TypeError, "gather_located takes 4 arguments, not %zd", nargs);
  if (!is_zstd_get(args[0])) return PyErr_Format(PyExc_TypeError, "zget must be a ZstdGet");
  std::vector<int64_t> positions;
  int ndim = 0;
  if (!int64_values(args[1], "positions", &positions, &ndim)) return nullptr;
  if (ndim != 1) return PyErr_Format(PyExc_ValueError, "positions must be 1-D, not 0-D");
  const long long alignment = PyLong_AsLongLong(args[2]);
  const long long limit = PyLong_AsLongLong(args[3]);
  if (PyErr_Occurred()) return nullptr;
  if (alignment < 1 || alignment > (1 << 16) || (alignment & (alignment - 1)) || limit < 0)
    return PyErr_Format(PyExc_ValueError, "alignment must be a power of two up to 65536");
  const uint64_t mask = static_cast<uint64_t>(alignment - 1);
  Parts parts;
  parts.v.reserve(positions.size());
  int64_t end = 0;
  for (const int64_t i : positions) {
    Located found;
    const int got = locate(args[0], i, &found);
    if (got <= 0) return got < 0 ? nullptr : Py_NewRef(Py_None);
    parts.v.push_back(Part{found.buf, found.position, static_cast<int64_t>(found.length), 0,
                           found.logical, found.crc});
    // A place congruent to the record's offset modulo the alignment (its tensors keep
    // their file alignment); lengths are at most a frame's bytes (locate checked).
    const int64_t place = end + static_cast<int64_t>((found.logical - end) & mask);
    if (place > limit || static_cast<int64_t>(found.length) > limit - place - kFrameSize)
      return Py_NewRef(Py_None);
    parts.v.back().place = place;
    end = place + kFrameSize + static_cast<int64_t>(found.length);
  }
  const int64_t size = end + 8;  // 8 bytes to spare, as the general gather leaves them
  PyObject* out = PyByteArray_FromStringAndSize(nullptr, size + alignment);
  PyObject* entries = PyBytes_FromStringAndSize(nullptr, kEntrySize * parts.v.size());
  PyObject* places = PyBytes_FromStringAndSize(nullptr, 8 * parts.v.size());
  if (out == nullptr || entries == nullptr || places == nullptr) {
    Py_XDECREF(out);
    Py_XDECREF(entries);
    Py_XDECREF(places);
    return nullptr;
  }
  auto* base = reinterpret_cast<uint8_t*>(PyByteArray_AS_STRING(out));
  prefer_huge_pages(base, static_cast<size_t>(size + alignment));
  const int64_t shift = static_cast<int64_t>(-reinterpret_cast<uintptr_t>(base) & mask);
  auto* e = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(entries));
  auto* at = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(places));
  for (const Part& p : parts.v) {
    Buffer frame;
    if (!frame.get(p.buf, PyBUF_SIMPLE) || p.position > frame.b.len - kFrameSize - p.length) {
      Py_DECREF(out);  // (locate checked it: cannot happen)
      Py_DECREF(entries);
      Py_DECREF(places);
      if (PyErr_Occurred()) return nullptr;
      Py_RETURN_NONE;
    }
    std::memcpy(base + shift + p.place, static_cast<const uint8_t*>(frame.b.buf) + p.position,
                static_cast<size_t>(kFrameSize + p.length));
    store(e, p.offset, 8);
    store(e + 8, static_cast<uint64_t>(p.length), 8);
    store(e + 16, p.crc, 4);
    store(e + 20, 0, 4);
    store(at, static_cast<uint64_t>(p.place), 8);
    e += kEntrySize;
    at += 8;
  }
  return Py_BuildValue("(NNLLN)", entries, out, static_cast<long long>(shift),
                       static_cast<long long>(size), places);
}

PyMethodDef gather_methods[] = {
    {"gather_located",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(gather_located)),
     METH_FASTCALL,
     "gather_located(zget, positions, alignment, limit)\n"
     "    -> (entries, buffer, shift, size, places) | None\n\n"
     "Records ``positions`` (an int64 array, in file order) of a compressed file, each found\n"
     "as ds[i] finds it: their index entries (24 bytes each, from their frame headers), a\n"
     "bytearray holding their frames from ``shift`` on (``size`` bytes, each frame at\n"
     "``places[k]``, congruent to its offset modulo ``alignment``), or None if a record is\n"
     "not found so or the frames pass ``limit`` bytes."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int add_gather(PyObject* module) { return PyModule_AddFunctions(module, gather_methods); }

}  // namespace evalue_store_native
