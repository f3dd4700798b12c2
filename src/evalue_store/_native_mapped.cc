// evalue_store._native.Mapped: ``ds[i]`` of a plain, memory-mapped file in one call, and the
// decoding of a record from a compressed file's decompressed frame (``decode_frame``).
//
// The Python per-record path (index entry, its checks, the checksum, the layout's struct
// unpack and structure check, a view per tensor) cost about twice the instructions of a
// numpy memmap row (benchmarks/results/instructions.md). This does the same steps for a
// record whose structure a layout (codec/layout.py) has already captured, and answers None
// for every record it cannot serve: one that fails any check, or whose structure it does
// not know. The caller then reads that record the general way, which learns the layout or
// says what is wrong, so errors are reported by one implementation only.
//
// Safety: the buffer is exported for the whole call; every index entry, frame and value
// range is checked against its size before a byte of it is read, and a tensor is a row of
// an array numpy bounds-checks. The GIL is held except while a large payload is checksummed.
//
// The layouts, and the decoding of a record with one: _native_layout.cc; this file is the
// Python type (its arguments, the index lookup, the methods).
#include "_native_layout.h"  // (first: it includes Python.h; numpy's C API is imported here)

#include <cstdint>
#include <cstring>
#include <memory>

#include "evalue_store/reader.h"

namespace evs = evalue_store;
using namespace evalue_store_native;  // (_native_parts.h, _native_layout.h)

namespace {

struct Mapped {
  PyObject_HEAD MappedState* state;
};

// Record i of a compressed file, found by the ZstdGet ``s->view``, or None.
PyObject* get_located(MappedState* s, long long i) {
  Located found;
  const int got = locate(s->view, i, &found);
  if (got <= 0) return got < 0 ? nullptr : Py_NewRef(Py_None);
  PyObject* record = nullptr;
  {
    Buffer buf;
    if (buf.get(found.buf, PyBUF_SIMPLE))
      record = decode(s, static_cast<const uint8_t*>(buf.b.buf), buf.b.len, found.position,
                      found.buf, found.logical, found.length, found.crc, 0);
  }
  Py_DECREF(found.buf);
  if (record == nullptr && !PyErr_Occurred()) Py_RETURN_NONE;
  return record;
}

// get(i): record i (an int; negative counts from the end) or None.
PyObject* get(PyObject* self, PyObject* index) {
  MappedState* s = reinterpret_cast<Mapped*>(self)->state;
  int overflow = 0;
  long long i = PyLong_AsLongLongAndOverflow(index, &overflow);
  if (i == -1 && PyErr_Occurred()) return nullptr;
  if (overflow != 0 || i < -s->count || i >= s->count) Py_RETURN_NONE;
  if (i < 0) i += s->count;
  if (is_zstd_get(s->view)) return get_located(s, i);
  size_t seg = 0;
  if (s->starts.size() > 1) {  // the last segment starting at or before i
    size_t lo = 0, hi = s->starts.size();
    while (hi - lo > 1) {
      const size_t mid = (lo + hi) / 2;
      if (s->starts[mid] <= i) lo = mid; else hi = mid;
    }
    seg = lo;
  }
  Buffer buf;
  if (PyObject_GetBuffer(s->view, &buf.b, PyBUF_SIMPLE) != 0) {  // released: closed
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  buf.held = true;
  const auto* data = static_cast<const uint8_t*>(buf.b.buf);
  const int64_t size = buf.b.len;
  const int64_t entry = s->offsets[seg] + (i - s->starts[seg]) * kEntrySize;
  if (entry < 0 || entry > size - kEntrySize) Py_RETURN_NONE;
  const uint8_t* e = data + entry;
  const uint64_t offset = load_u64(e);
  if (offset > static_cast<uint64_t>(size)) Py_RETURN_NONE;
  PyObject* record = decode(s, data, size, static_cast<int64_t>(offset), nullptr, offset,
                            load_u64(e + 8), load_u32(e + 16), load_u32(e + 20));
  if (record == nullptr && !PyErr_Occurred()) Py_RETURN_NONE;
  return record;
}

// decode_entries(entries): a list with, for each 24-byte index entry of ``entries`` (a
// bytes-like object), its record or None.
PyObject* decode_entries(PyObject* self, PyObject* entries) {
  MappedState* s = reinterpret_cast<Mapped*>(self)->state;
  Buffer index;
  if (PyObject_GetBuffer(entries, &index.b, PyBUF_SIMPLE) != 0) return nullptr;
  index.held = true;
  if (index.b.len % kEntrySize != 0)
    return PyErr_Format(PyExc_ValueError, "entries hold %zd bytes, not a multiple of %lld",
                        index.b.len, static_cast<long long>(kEntrySize));
  if (is_zstd_get(s->view))
    return PyErr_Format(PyExc_TypeError, "decode_entries reads a mapping, not frames");
  Buffer buf;
  if (PyObject_GetBuffer(s->view, &buf.b, PyBUF_SIMPLE) != 0) return nullptr;
  buf.held = true;
  const auto* data = static_cast<const uint8_t*>(buf.b.buf);
  const auto* e = static_cast<const uint8_t*>(index.b.buf);
  const Py_ssize_t n = index.b.len / kEntrySize;
  PyObject* records = PyList_New(n);
  if (records == nullptr) return nullptr;
  for (Py_ssize_t k = 0; k < n; ++k, e += kEntrySize) {
    const uint64_t offset = load_u64(e);
    PyObject* record =
        offset > static_cast<uint64_t>(buf.b.len)
            ? nullptr
            : decode(s, data, buf.b.len, static_cast<int64_t>(offset), nullptr, offset,
                     load_u64(e + 8), load_u32(e + 16), load_u32(e + 20));
    if (record == nullptr) {
      if (PyErr_Occurred()) {
        Py_DECREF(records);
        return nullptr;
      }
      record = Py_None;
      Py_INCREF(record);
    }
    PyList_SET_ITEM(records, k, record);
  }
  return records;
}

// decode_frame(buf, pos, offset, length, crc): the record whose frame header is at ``pos``
// of ``buf`` (a compressed file's decompressed frame), given its place ``offset`` in the
// container and its index entry's length and crc, or None.
PyObject* decode_frame(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  MappedState* s = reinterpret_cast<Mapped*>(self)->state;
  if (s == nullptr) return PyErr_Format(PyExc_TypeError, "Mapped is not initialised");
  if (nargs != 5)
    return PyErr_Format(PyExc_TypeError, "decode_frame takes 5 arguments, not %zd", nargs);
  long long pos = PyLong_AsLongLong(args[1]);
  unsigned long long offset = PyLong_AsUnsignedLongLong(args[2]);
  unsigned long long length = PyLong_AsUnsignedLongLong(args[3]);
  unsigned long crc = PyLong_AsUnsignedLong(args[4]);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    Py_RETURN_NONE;  // not a place or an entry this path reads: the general path says why
  }
  if (crc > 0xFFFFFFFFul) Py_RETURN_NONE;
  Buffer buf;
  if (PyObject_GetBuffer(args[0], &buf.b, PyBUF_SIMPLE) != 0) return nullptr;
  buf.held = true;
  PyObject* record = decode(s, static_cast<const uint8_t*>(buf.b.buf), buf.b.len, pos, args[0],
                            offset, length, static_cast<uint32_t>(crc), 0);
  if (record == nullptr && !PyErr_Occurred()) Py_RETURN_NONE;
  return record;
}

// add(length, runs, steps): learns a layout (add_layout, _native_layout.cc).
PyObject* add(PyObject* self, PyObject* args) {
  MappedState* s = reinterpret_cast<Mapped*>(self)->state;
  if (s == nullptr) return PyErr_Format(PyExc_TypeError, "Mapped is not initialised");
  return add_layout(s, args);
}

PyObject* clear(PyObject* self, PyObject*) {
  if (reinterpret_cast<Mapped*>(self)->state != nullptr)
    clear_layouts(reinterpret_cast<Mapped*>(self)->state);
  Py_RETURN_NONE;
}

int init(PyObject* self, PyObject* args, PyObject* kwargs) {
  static const char* keywords[] = {"view",  "starts", "offsets",  "count", "alignment",
                                   "data_start", "reach", "limit", "checksum", nullptr};
  PyObject *view, *starts, *offsets, *limit;
  long long count, alignment, data_start, reach;
  const char* checksum = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!O!LLLLOz:Mapped",
                                   const_cast<char**>(keywords), &view, &PyList_Type, &starts,
                                   &PyList_Type, &offsets, &count, &alignment, &data_start,
                                   &reach, &limit, &checksum))
    return -1;
  auto* m = reinterpret_cast<Mapped*>(self);
  if (m->state != nullptr) {
    PyErr_SetString(PyExc_TypeError, "Mapped is initialised once");
    return -1;
  }
  if ((view != Py_None && !PyObject_CheckBuffer(view) && !is_zstd_get(view)) || alignment <= 0 || (alignment & (alignment - 1)) != 0 ||
      count < 0 || data_start < 0 || PyList_GET_SIZE(starts) != PyList_GET_SIZE(offsets) ||
      (count > 0 && PyList_GET_SIZE(starts) == 0 && !is_zstd_get(view))) {
    PyErr_SetString(PyExc_ValueError, "Mapped: inconsistent arguments");
    return -1;
  }
  auto state = std::make_unique<MappedState>();
  for (Py_ssize_t k = 0; k < PyList_GET_SIZE(starts); ++k) {
    int64_t start, offset;
    if (!as_int64(PyList_GET_ITEM(starts, k), "start", &start) ||
        !as_int64(PyList_GET_ITEM(offsets, k), "offset", &offset))
      return -1;
    state->starts.push_back(start);
    state->offsets.push_back(offset);
  }
  state->count = count;
  state->alignment = alignment;
  state->data_start = data_start;
  state->reach = reach;
  if (limit != Py_None && !as_int64(limit, "limit", &state->limit)) return -1;
  if (checksum == nullptr) {
    state->checksum = nullptr;
  } else if (std::strcmp(checksum, "crc32c") == 0) {
    state->checksum = evs::crc32c;
  } else if (std::strcmp(checksum, "crc32") == 0) {
    state->checksum = evs::crc32;
  } else {
    PyErr_Format(PyExc_ValueError, "checksum must be 'crc32c', 'crc32' or None, not '%s'",
                 checksum);
    return -1;
  }
  if (view != Py_None) {
    Py_INCREF(view);
    state->view = view;
  }
  m->state = state.release();
  return 0;
}

void dealloc(PyObject* self) {
  auto* m = reinterpret_cast<Mapped*>(self);
  PyObject_GC_UnTrack(self);
  if (m->state != nullptr) {
    clear_layouts(m->state);
    Py_CLEAR(m->state->view);
    delete m->state;
    m->state = nullptr;
  }
  Py_TYPE(self)->tp_free(self);
}

int traverse(PyObject* self, visitproc visit, void* arg) {
  MappedState* s = reinterpret_cast<Mapped*>(self)->state;
  if (s == nullptr) return 0;
  Py_VISIT(s->view);
  for (auto& item : s->layouts)
    for (const Step& step : item.second->steps) Py_VISIT(step.rows);
  return 0;
}

int clear_refs(PyObject* self) {
  MappedState* s = reinterpret_cast<Mapped*>(self)->state;
  if (s != nullptr) {
    clear_layouts(s);
    Py_CLEAR(s->view);
  }
  return 0;
}

// The state of an initialised Mapped whose references were not cleared; else nullptr and
// an error (get and decode_entries answer None then: the general path reads the record).
bool usable(PyObject* self) {
  const MappedState* s = reinterpret_cast<Mapped*>(self)->state;
  if (s == nullptr) PyErr_SetString(PyExc_TypeError, "Mapped is not initialised");
  return s != nullptr && s->view != nullptr;
}

PyObject* get_or_none(PyObject* self, PyObject* index) {
  if (!usable(self)) {
    if (PyErr_Occurred()) return nullptr;
    Py_RETURN_NONE;
  }
  return get(self, index);
}

PyObject* entries_or_none(PyObject* self, PyObject* entries) {
  if (!usable(self)) {
    if (PyErr_Occurred()) return nullptr;
    Py_RETURN_NONE;
  }
  return decode_entries(self, entries);
}

PyMethodDef mapped_methods[] = {
    {"get", get_or_none, METH_O,
     "get(i) -> list | None: record i (negative: from the end) when its entry, frame,\n"
     "checksum and structure pass every check and its layout is known; else None."},
    {"decode_entries", entries_or_none, METH_O,
     "decode_entries(entries) -> list: for each 24-byte index entry of a bytes-like\n"
     "object, its record as get() gives it, or None."},
    {"decode_frame", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(decode_frame)),
     METH_FASTCALL,
     "decode_frame(buf, pos, offset, length, crc) -> list | None: the record whose frame\n"
     "header is at buf[pos] (a decompressed frame; ``offset``: its place in the container),\n"
     "when it passes every check and its layout is known; else None."},
    {"add", add, METH_VARARGS,
     "add(length, runs, steps): learn the layout of records of this payload length."},
    {"clear", clear, METH_NOARGS, "clear(): forget every layout."},
    {nullptr, nullptr, 0, nullptr}};

PyType_Slot mapped_slots[] = {
    {Py_tp_doc, const_cast<char*>(
                    "Mapped(view, starts, offsets, count, alignment, data_start, reach, limit,\n"
                    "checksum): ds[i] of a plain mapped file in one call (_native_mapped.cc).")},
    {Py_tp_new, reinterpret_cast<void*>(PyType_GenericNew)},
    {Py_tp_init, reinterpret_cast<void*>(init)},
    {Py_tp_dealloc, reinterpret_cast<void*>(dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(clear_refs)},
    {Py_tp_methods, mapped_methods},
    {0, nullptr}};

PyType_Spec mapped_spec = {"evalue_store._native.Mapped", sizeof(Mapped), 0,
                           Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, mapped_slots};

}  // namespace

int add_mapped_type(PyObject* module) {
  if (PyArray_API == nullptr && _import_array() < 0) return -1;  // numpy's C API
  PyObject* type = PyType_FromSpec(&mapped_spec);
  if (type == nullptr) return -1;
  if (PyModule_AddObject(module, "Mapped", type) != 0) {
    Py_DECREF(type);
    return -1;
  }
  return 0;
}
