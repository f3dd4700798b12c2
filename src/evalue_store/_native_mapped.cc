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
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL evalue_store_native_ARRAY_API
#include <numpy/arrayobject.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "_native_parts.h"
#include "evalue_store/reader.h"

namespace evs = evalue_store;
using namespace evalue_store_native;  // (_native_parts.h)

namespace {





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

// Shared by the State and every decode using it: a decode that allocates can run a finalizer
// that changes the layouts (Python code), and must not see its own freed.
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

struct State {
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

struct Mapped {
  PyObject_HEAD State* state;
};

void clear_layouts(State* s) {
  auto old = std::move(s->layouts);  // emptied before any reference is dropped
  s->layouts.clear();
}


// A tensor of ``step`` whose data starts at byte ``at`` of ``buf`` (a decompressed frame,
// checked to hold the whole frame), as np.frombuffer and codec/layout.py make it: its base
// ``buf`` itself when it is a ZstdFrame (whose bytes live as long as it does), else a
// memoryview of it (which holds its export); read-only if ``buf`` is.
PyObject* frame_tensor(const Step& step, PyObject* buf, int64_t at) {
  PyObject* base = is_zstd_frame(buf) ? Py_NewRef(buf) : PyMemoryView_FromObject(buf);
  if (base == nullptr) return nullptr;
  Buffer held;  // (a ZstdFrame's export only gives its address: the base keeps it)
  if (!held.get(base, PyBUF_SIMPLE)) {
    Py_DECREF(base);
    return nullptr;
  }
  const Py_buffer* view = &held.b;
  if (at < 0 || step.nbytes > view->len || at > view->len - step.nbytes) {
    Py_DECREF(base);
    return nullptr;  // (the caller checked the frame: cannot happen)
  }
  Py_INCREF(step.descr);  // (stolen by the constructor)
  PyObject* array = PyArray_NewFromDescr(
      &PyArray_Type, step.descr, static_cast<int>(step.dims.size()),
      const_cast<npy_intp*>(step.dims.data()),
      step.make == kStrided ? const_cast<npy_intp*>(step.strides.data()) : nullptr,
      static_cast<char*>(view->buf) + at, view->readonly ? 0 : NPY_ARRAY_WRITEABLE, nullptr);
  if (array == nullptr) {
    Py_DECREF(base);
    return nullptr;
  }
  if (PyArray_SetBaseObject(reinterpret_cast<PyArrayObject*>(array), base) < 0) {  // steals
    Py_DECREF(array);
    return nullptr;
  }
  return array;
}

// The record whose frame starts at ``pos`` in ``data`` (``size`` bytes), given its index
// entry: the mapping's (``frame_buf`` null: ``pos`` is the entry's offset, tensors are rows)
// or a decompressed frame's, exported from ``frame_buf``. A new reference, or nullptr with
// no error set when this path cannot serve it, or nullptr with an error set (memory; an
// exception raised by a value's construction is cleared).
PyObject* decode(State* s, const uint8_t* data, int64_t size, int64_t pos, PyObject* frame_buf,
                 uint64_t offset, uint64_t length, uint32_t crc, uint32_t reserved) {
  if (reserved != 0 || (offset & static_cast<uint64_t>(s->alignment - 1)) != 0 ||
      offset < static_cast<uint64_t>(s->data_start) || offset > static_cast<uint64_t>(s->reach) ||
      length > static_cast<uint64_t>(s->reach) - offset ||
      (s->limit >= 0 && length > static_cast<uint64_t>(s->limit)))
    return nullptr;
  const int64_t at = pos;
  if (at < 0 || at > size - kFrameSize || static_cast<int64_t>(length) > size - kFrameSize - at)
    return nullptr;
  const uint8_t* frame = data + at;
  if (load_u32(frame + kFrameCrcAt) != crc) return nullptr;
  if (s->checksum != nullptr) {  // before the layout is looked up: another thread may change
    uint32_t sum;                // the layouts while this one waits without the GIL
    if (static_cast<int64_t>(length) >= kReleaseGil) {
      Py_BEGIN_ALLOW_THREADS sum = s->checksum(frame + kFrameSize, length, 0);
      Py_END_ALLOW_THREADS
    } else {
      sum = s->checksum(frame + kFrameSize, length, 0);
    }
    if (sum != crc) return nullptr;
  }
  auto found = s->layouts.find(length);
  if (found == s->layouts.end()) return nullptr;
  const std::shared_ptr<const Layout> held = found->second;
  const Layout& layout = *held;  // its frame is the record's: kFrameSize + length
  const char* expected = layout.expected.data();
  for (const auto& run : layout.runs) {
    if (std::memcmp(frame + run.first, expected, static_cast<size_t>(run.second)) != 0)
      return nullptr;
    expected += run.second;
  }
  const Py_ssize_t n = static_cast<Py_ssize_t>(layout.steps.size());
  PyObject* values = PyList_New(n);
  if (values == nullptr) return nullptr;
  for (Py_ssize_t k = 0; k < n; ++k) {
    const Step& step = layout.steps[static_cast<size_t>(k)];
    const uint8_t* p = frame + step.at;
    PyObject* value;
    switch (step.kind) {
      case kTensor:
        if (frame_buf == nullptr ? step.rows == nullptr : step.descr == nullptr) {
          Py_DECREF(values);  // taught for the other kind of buffer
          return nullptr;
        }
        value = frame_buf == nullptr ? PySequence_GetItem(step.rows, (at + step.at) / s->alignment)
                                     : frame_tensor(step, frame_buf, at + step.at);
        break;
      case kScalar:
        if (step.code == 'q') {
          value = PyLong_FromLongLong(static_cast<int64_t>(load_u64(p)));
        } else {
          const uint64_t bits = load_u64(p);
          double d;
          std::memcpy(&d, &bits, 8);
          value = PyFloat_FromDouble(d);
        }
        break;
      case kText:
        value = PyUnicode_DecodeUTF8(reinterpret_cast<const char*>(p), step.size, "strict");
        break;
      case kBytes:
        value = PyBytes_FromStringAndSize(reinterpret_cast<const char*>(p), step.size);
        break;
      case kBool:
        if (*p > 1) {
          Py_DECREF(values);
          return nullptr;
        }
        value = *p ? Py_True : Py_False;
        Py_INCREF(value);
        break;
      default:
        value = Py_None;
        Py_INCREF(value);
    }
    if (value == nullptr) {  // bad UTF-8 or a row outside its array: the general path says
      Py_DECREF(values);
      if (PyErr_ExceptionMatches(PyExc_MemoryError)) return nullptr;
      PyErr_Clear();
      return nullptr;
    }
    PyList_SET_ITEM(values, k, value);
  }
  return values;
}

// Record i of a compressed file, found by the ZstdGet ``s->view``, or None.
PyObject* get_located(State* s, long long i) {
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
  State* s = reinterpret_cast<Mapped*>(self)->state;
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
  State* s = reinterpret_cast<Mapped*>(self)->state;
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
  State* s = reinterpret_cast<Mapped*>(self)->state;
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

bool as_int64(PyObject* obj, const char* name, int64_t* out) {
  *out = PyLong_AsLongLong(obj);
  if (*out == -1 && PyErr_Occurred()) {
    PyErr_Format(PyExc_ValueError, "%s must be an int64", name);
    return false;
  }
  return true;
}

// Reads a frame tensor's (make, dtype, count or bytes, shape, strides) into ``step`` (a new
// reference to the dtype): false, with or without an error set, if it is not one.
bool frame_spec(PyObject* detail, Step* step) {
  PyObject *dtype, *shape, *strides;
  long long size;
  if (!PyArg_ParseTuple(detail, "iOLO!O:tensor", &step->make, &dtype, &size, &PyTuple_Type,
                        &shape, &strides))
    return false;
  if (step->make < kFlat || step->make > kStrided || size < 0 || !PyArray_DescrCheck(dtype))
    return false;
  auto* descr = reinterpret_cast<PyArray_Descr*>(dtype);
  const int64_t itemsize = PyDataType_ELSIZE(descr);
  const Py_ssize_t nd = PyTuple_GET_SIZE(shape);
  if (itemsize <= 0 || nd > NPY_MAXDIMS) return false;
  int64_t count = 1;
  for (Py_ssize_t k = 0; k < nd; ++k) {
    const long long dim = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, k));
    if (dim < 0 || dim > (int64_t{1} << 40)) return false;
    count = dim == 0 || count == 0 ? 0 : (count > (int64_t{1} << 40) / dim ? -1 : count * dim);
    if (count < 0) return false;
    step->dims.push_back(static_cast<npy_intp>(dim));
  }
  if (step->make == kStrided) {  // its bytes, and strides within them
    if (!PyTuple_Check(strides) || PyTuple_GET_SIZE(strides) != nd) return false;
    int64_t last = 0;  // the offset of the last element
    for (Py_ssize_t k = 0; k < nd; ++k) {
      const long long stride = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, k));
      if (stride < 0 || stride > size) return false;
      last += stride * (step->dims[k] > 0 ? step->dims[k] - 1 : 0);
      step->strides.push_back(static_cast<npy_intp>(stride));
    }
    if (count > 0 && last + itemsize > size) return false;
    step->nbytes = size;
  } else {
    if (size != count) return false;
    step->nbytes = count * itemsize;
  }
  if (PyErr_Occurred()) return false;
  Py_INCREF(descr);
  step->descr = descr;
  return true;
}

// add(length, runs, steps): the layout of records of ``length`` payload bytes. runs:
// [(frame offset, bytes)] of the structure bytes every record repeats; steps: one
// (kind, frame offset, detail) per value: a tensor's rows array, a scalar's code
// ('q' or 'd'), a string's byte length, else None.
PyObject* add(PyObject* self, PyObject* args) {
  State* s = reinterpret_cast<Mapped*>(self)->state;
  if (s == nullptr) return PyErr_Format(PyExc_TypeError, "Mapped is not initialised");
  unsigned long long length;
  PyObject *runs, *steps;
  if (!PyArg_ParseTuple(args, "KO!O!:add", &length, &PyList_Type, &runs, &PyList_Type, &steps))
    return nullptr;
  if (length > static_cast<unsigned long long>(INT64_MAX - kFrameSize))
    return PyErr_Format(PyExc_ValueError, "length %llu is too large", length);
  auto made = std::make_shared<Layout>();
  Layout& layout = *made;
  layout.frame_size = kFrameSize + static_cast<int64_t>(length);
  auto inside = [&](int64_t at, int64_t n) {
    return at >= 0 && n >= 0 && at <= layout.frame_size && n <= layout.frame_size - at;
  };
  for (Py_ssize_t k = 0; k < PyList_GET_SIZE(runs); ++k) {
    long long at;
    const char* bytes;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(runs, k), "Ly#:run", &at, &bytes, &n)) return nullptr;
    if (!inside(at, n)) return PyErr_Format(PyExc_ValueError, "run %zd is outside the frame", k);
    layout.runs.emplace_back(at, n);
    layout.expected.append(bytes, static_cast<size_t>(n));
  }
  for (Py_ssize_t k = 0; k < PyList_GET_SIZE(steps); ++k) {
    int kind;
    long long at;
    PyObject* detail;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(steps, k), "iLO:step", &kind, &at, &detail))
      return nullptr;
    Step step{kind, at, 0, 0, nullptr, kFlat, nullptr, {}, {}, 0};
    bool ok = true;
    switch (kind) {
      case kTensor:
        if (PyTuple_Check(detail)) {  // a frame's: (make, dtype, count or bytes, shape, strides)
          ok = frame_spec(detail, &step) && inside(at, step.nbytes);
          if (!ok) Py_CLEAR(step.descr);
        } else {  // a mapping's: its rows
          ok = inside(at, 0);
          step.rows = detail;
        }
        break;
      case kScalar: {
        const char* code = PyUnicode_Check(detail) ? PyUnicode_AsUTF8(detail) : nullptr;
        ok = code != nullptr && (std::strcmp(code, "q") == 0 || std::strcmp(code, "d") == 0) &&
             inside(at, 8);
        step.code = ok ? code[0] : 0;
        break;
      }
      case kText:
      case kBytes:
        ok = PyLong_Check(detail) && as_int64(detail, "size", &step.size) &&
             inside(at, step.size);
        break;
      case kBool:
        ok = inside(at, 1);
        break;
      case kNone:
        break;
      default:
        ok = false;
    }
    if (!ok) {
      PyErr_Clear();
      return PyErr_Format(PyExc_ValueError, "step %zd (kind %d at %lld) is not valid", k, kind,
                          at);
    }
    Py_XINCREF(step.rows);
    layout.steps.push_back(step);
  }
  std::shared_ptr<const Layout> old = std::move(s->layouts[length]);
  s->layouts[length] = std::move(made);
  Py_RETURN_NONE;  // (the old one, if any, goes now, after the map no longer holds it)
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
  auto state = std::make_unique<State>();
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
  State* s = reinterpret_cast<Mapped*>(self)->state;
  if (s == nullptr) return 0;
  Py_VISIT(s->view);
  for (auto& item : s->layouts)
    for (const Step& step : item.second->steps) Py_VISIT(step.rows);
  return 0;
}

int clear_refs(PyObject* self) {
  State* s = reinterpret_cast<Mapped*>(self)->state;
  if (s != nullptr) {
    clear_layouts(s);
    Py_CLEAR(s->view);
  }
  return 0;
}

// The state of an initialised Mapped whose references were not cleared; else nullptr and
// an error (get and decode_entries answer None then: the general path reads the record).
bool usable(PyObject* self) {
  const State* s = reinterpret_cast<Mapped*>(self)->state;
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
