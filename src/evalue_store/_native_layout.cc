// The record layouts of evalue_store._native.Mapped (_native_layout.h): a layout learnt
// from what codec/layout.py captured (add_layout: the structure bytes every record of one
// payload length repeats, and a step per value, each checked to lie inside the frame), and
// a record decoded with one (decode) from the mapping or from a decompressed frame.
//
// Safety: every frame and value range is checked against its buffer's size before a byte
// of it is read, and a tensor is a row of an array numpy bounds-checks, or an array over
// a frame checked to hold it. The GIL is held except while a large payload is checksummed.
#define NO_IMPORT_ARRAY  // (_native_mapped.cc imports numpy's C API)
#include "_native_layout.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace evalue_store_native {

void clear_layouts(MappedState* s) {
  auto old = std::move(s->layouts);  // emptied before any reference is dropped
  s->layouts.clear();
}

namespace {

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

}  // namespace

PyObject* decode(MappedState* s, const uint8_t* data, int64_t size, int64_t pos,
                 PyObject* frame_buf, uint64_t offset, uint64_t length, uint32_t crc,
                 uint32_t reserved) {
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

PyObject* add_layout(MappedState* s, PyObject* args) {
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

bool as_int64(PyObject* obj, const char* name, int64_t* out) {
  *out = PyLong_AsLongLong(obj);
  if (*out == -1 && PyErr_Occurred()) {
    PyErr_Format(PyExc_ValueError, "%s must be an int64", name);
    return false;
  }
  return true;
}

}  // namespace evalue_store_native
