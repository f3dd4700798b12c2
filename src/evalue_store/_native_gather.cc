// evalue_store._native.locate_batch: a compressed file's batch of records, found as ds[i]
// finds each (``locate``, _native_zstd.cc: the locator, then the frame, each frame
// decompressed once while cached), handed to the batch decoder where they lie: its index
// entries, and for each record its decompressed frame and the place of its frame header in
// it. In Python this was a call, a tuple, a memoryview and a slice per record; copying the
// records into one buffer first cost a third of a batch of W2's 150 KB images (and a page
// fault per 4 KiB of that buffer at every batch).
//
// Every record is located with all the frame layer's checks; ``locate`` checks its frame
// header and payload to lie inside its frame, and the batch stops at ``limit`` bytes of
// records (the frames are held together). A record that is not found so (any failed check,
// a record across frames) makes the whole answer None: the caller reads the batch record by
// record, and that path says what is wrong.
#include "_native_parts.h"

#include <cstdint>
#include <vector>

namespace evalue_store_native {
namespace {

void store(uint8_t* p, uint64_t value, int n) {  // little-endian
  for (int k = 0; k < n; ++k) p[k] = static_cast<uint8_t>(value >> (8 * k));
}

// locate_batch(zget, positions, limit) -> (entries, frames, places) | None
PyObject* locate_batch(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3)
    return PyErr_Format(PyExc_TypeError, "locate_batch takes 3 arguments, not %zd", nargs);
  if (!is_zstd_get(args[0])) return PyErr_Format(PyExc_TypeError, "zget must be a ZstdGet");
  std::vector<int64_t> positions;
  int ndim = 0;
  if (!int64_values(args[1], "positions", &positions, &ndim)) return nullptr;
  if (ndim != 1) return PyErr_Format(PyExc_ValueError, "positions must be 1-D, not 0-D");
  const long long limit = PyLong_AsLongLong(args[2]);
  if (limit == -1 && PyErr_Occurred()) return nullptr;
  if (limit < 0) return PyErr_Format(PyExc_ValueError, "limit must not be negative");
  const auto count = static_cast<Py_ssize_t>(positions.size());
  PyObject* frames = PyList_New(count);
  PyObject* entries = PyBytes_FromStringAndSize(nullptr, kEntrySize * count);
  PyObject* places = PyBytes_FromStringAndSize(nullptr, 8 * count);
  auto done = [&](PyObject* result) {
    Py_XDECREF(frames);
    Py_XDECREF(entries);
    Py_XDECREF(places);
    return result;
  };
  if (frames == nullptr || entries == nullptr || places == nullptr) return done(nullptr);
  auto* e = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(entries));
  auto* at = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(places));
  long long held = 0;  // bytes of the records located so far (each at most a frame's)
  for (Py_ssize_t k = 0; k < count; ++k) {
    Located found;
    const int got = locate(args[0], positions[static_cast<size_t>(k)], &found);
    if (got <= 0) return done(got < 0 ? nullptr : Py_NewRef(Py_None));
    PyList_SET_ITEM(frames, k, found.buf);  // (takes the reference)
    held += kFrameSize + static_cast<long long>(found.length);
    if (held > limit) return done(Py_NewRef(Py_None));
    store(e, found.logical, 8);
    store(e + 8, found.length, 8);
    store(e + 16, found.crc, 4);
    store(e + 20, 0, 4);
    store(at, static_cast<uint64_t>(found.position), 8);
    e += kEntrySize;
    at += 8;
  }
  PyObject* result = Py_BuildValue("(OOO)", entries, frames, places);
  return done(result);
}

PyMethodDef gather_methods[] = {
    {"locate_batch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(locate_batch)),
     METH_FASTCALL,
     "locate_batch(zget, positions, limit) -> (entries, frames, places) | None\n\n"
     "Records ``positions`` (an int64 array, in file order) of a compressed file, each found\n"
     "as ds[i] finds it: their index entries (24 bytes each, from their frame headers), the\n"
     "decompressed frame holding each (a list), and the place of each record's frame header\n"
     "in it (int64 bytes); None if a record is not found so or the records pass ``limit``\n"
     "bytes."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int add_gather(PyObject* module) { return PyModule_AddFunctions(module, gather_methods); }

}  // namespace evalue_store_native
