// evalue_store._native: the checksums of many byte ranges of one buffer in one call.
//
// Python checksummed records one call at a time (a Python-level call per record, 57% of a
// small-record batch); this computes a whole batch's with the C++ reader's CRC code
// (cpp/src/crc.cc), so both readers share one implementation. Everything it is handed is
// checked here: the buffer is held (exported) for the whole call, the starts and lengths
// are copied out before use (another thread cannot change one between its check and its
// use), and every range is checked against the buffer's size before a byte of it is read.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "_native_parts.h"
#include "evalue_store/reader.h"

namespace evs = evalue_store;
using evalue_store_native::Buffer;  // (_native_parts.h)
using evalue_store_native::kReleaseGil;

namespace {

PyObject* g_numpy_empty = nullptr;  // numpy.empty, for the result
PyObject* g_uint32 = nullptr;       // numpy.dtype("uint32")

// An int64 element format: numpy exports int64 as 'l' (LP64) or 'q', array('q') as 'q'.
bool is_int64(const Py_buffer& b) {
  if (b.itemsize != 8 || b.format == nullptr) return false;
  const char* f = b.format;
  if (*f == '@' || *f == '=') ++f;
#if PY_LITTLE_ENDIAN
  else if (*f == '<') ++f;
#else
  else if (*f == '>' || *f == '!') ++f;
#endif
  return (f[0] == 'q' || f[0] == 'l') && f[1] == '\0';
}

// Replaces the error of a failed buffer request by one naming the argument: TypeError for
// an object without the buffer protocol, ValueError for one whose memory is not contiguous.
void buffer_error(PyObject* obj, const char* name, const char* what) {
  if (PyErr_ExceptionMatches(PyExc_TypeError)) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "%s must be %s, not %.100s", name, what,
                 Py_TYPE(obj)->tp_name);
  } else if (PyErr_ExceptionMatches(PyExc_BufferError) ||
             PyErr_ExceptionMatches(PyExc_ValueError)) {
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError, "%s must be C-contiguous", name);
  }
}

}  // namespace

namespace evalue_store_native {  // (declared in _native_parts.h: _native_gather.cc uses it)

bool int64_values(PyObject* obj, const char* name, std::vector<int64_t>* out, int* ndim) {
  Buffer v;
  if (!v.get(obj, PyBUF_FORMAT | PyBUF_ND)) {
    buffer_error(obj, name, "an int64 array");
    return false;
  }
  if (!is_int64(v.b)) {
    PyErr_Format(PyExc_TypeError, "%s must be an int64 array (format '%s', %zd-byte items)",
                 name, v.b.format ? v.b.format : "B", v.b.itemsize);
    return false;
  }
  if (v.b.ndim > 1) {
    PyErr_Format(PyExc_ValueError, "%s must be 1-D, not %d-D", name, v.b.ndim);
    return false;
  }
  *ndim = v.b.ndim;
  out->resize(static_cast<size_t>(v.b.len / 8));
  if (v.b.len) std::memcpy(out->data(), v.b.buf, static_cast<size_t>(v.b.len));
  return true;
}

}  // namespace evalue_store_native

namespace {

using evalue_store_native::int64_values;

using CrcFn = uint32_t (*)(const void*, size_t, uint32_t);

PyObject* checksums(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* keywords[] = {"buffer", "starts", "lengths", "function", "hardware",
                                   nullptr};
  PyObject *buffer, *starts_obj, *lengths_obj;
  const char* function;
  int hardware = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOs|$p:checksums",
                                   const_cast<char**>(keywords), &buffer, &starts_obj,
                                   &lengths_obj, &function, &hardware))
    return nullptr;
  CrcFn fn;
  if (std::strcmp(function, "crc32c") == 0)
    fn = hardware ? evs::crc32c : evs::crc32c_portable;
  else if (std::strcmp(function, "crc32") == 0)
    fn = hardware ? evs::crc32 : evs::crc32_portable;
  else
    return PyErr_Format(PyExc_ValueError, "function must be 'crc32c' or 'crc32', not '%s'",
                        function);

  std::vector<int64_t> starts, lengths;
  int ndim = 0;
  if (!int64_values(starts_obj, "starts", &starts, &ndim)) return nullptr;
  if (ndim != 1) return PyErr_Format(PyExc_ValueError, "starts must be 1-D");
  const size_t n = starts.size();
  int64_t length = -1;  // one length for every range, or -1: ``lengths`` holds one each
  if (PyLong_Check(lengths_obj)) {
    length = PyLong_AsLongLong(lengths_obj);
    if (length == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return PyErr_Format(PyExc_ValueError, "length %R does not fit in int64", lengths_obj);
    }
    if (length < 0) return PyErr_Format(PyExc_ValueError, "length %lld is negative", length);
  } else {
    if (!int64_values(lengths_obj, "lengths", &lengths, &ndim)) return nullptr;
    if (ndim == 0) {  // a numpy int64 scalar
      length = lengths[0];
      if (length < 0) return PyErr_Format(PyExc_ValueError, "length %lld is negative", length);
    } else if (lengths.size() != n) {
      return PyErr_Format(PyExc_ValueError, "%zu starts but %zu lengths", n, lengths.size());
    }
  }

  Buffer data;
  if (!data.get(buffer, PyBUF_SIMPLE)) {
    buffer_error(buffer, "buffer", "a bytes-like object");
    return nullptr;
  }
  const int64_t size = data.b.len;
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {  // every range inside the buffer, before any is read
    const int64_t start = starts[i];
    const int64_t len = length >= 0 ? length : lengths[i];
    if (start < 0 || len < 0 || start > size || len > size - start)
      return PyErr_Format(PyExc_ValueError,
                          "range %zu (start %lld, length %lld) is outside the buffer "
                          "(%lld bytes)",
                          i, static_cast<long long>(start), static_cast<long long>(len),
                          static_cast<long long>(size));
    if (total < kReleaseGil) total += len;  // (stops growing: no overflow)
  }

  PyObject* count = PyLong_FromSize_t(n);
  if (count == nullptr) return nullptr;
  PyObject* result = PyObject_CallFunctionObjArgs(g_numpy_empty, count, g_uint32, nullptr);
  Py_DECREF(count);
  if (result == nullptr) return nullptr;
  Buffer out;
  if (!out.get(result, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)) {
    Py_DECREF(result);
    return nullptr;
  }
  auto* sums = static_cast<uint32_t*>(out.b.buf);
  const auto* base = static_cast<const uint8_t*>(data.b.buf);
  auto compute = [&] {
    for (size_t i = 0; i < n; ++i) {
      const int64_t len = length >= 0 ? length : lengths[i];
      sums[i] = fn(base + starts[i], static_cast<size_t>(len), 0);
    }
  };
  if (total >= kReleaseGil) {
    Py_BEGIN_ALLOW_THREADS compute();
    Py_END_ALLOW_THREADS
  } else {
    compute();
  }
  return result;
}

// crc32c(data, value=0) / crc32(data, value=0): one buffer, as crc32c.crc32c / zlib.crc32
// take it (``value``: the CRC of the bytes before ``data``, masked to 32 bits).
template <CrcFn fn>
PyObject* one(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || nargs > 2)
    return PyErr_Format(PyExc_TypeError, "expected (data, value=0), got %zd arguments", nargs);
  uint32_t value = 0;
  if (nargs == 2) {
    if (!PyLong_Check(args[1]))
      return PyErr_Format(PyExc_TypeError, "value must be an int, not %.100s",
                          Py_TYPE(args[1])->tp_name);
    value = static_cast<uint32_t>(PyLong_AsUnsignedLongMask(args[1]));
    if (PyErr_Occurred()) return nullptr;
  }
  Buffer data;
  if (!data.get(args[0], PyBUF_SIMPLE)) {
    buffer_error(args[0], "data", "a bytes-like object");
    return nullptr;
  }
  const size_t n = static_cast<size_t>(data.b.len);
  if (data.b.len >= kReleaseGil) {
    Py_BEGIN_ALLOW_THREADS value = fn(data.b.buf, n, value);
    Py_END_ALLOW_THREADS
  } else {
    value = fn(data.b.buf, n, value);
  }
  return PyLong_FromUnsignedLong(value);
}

PyObject* hardware(PyObject*, PyObject*) { return PyBool_FromLong(evs::crc32c_hardware()); }

PyMethodDef methods[] = {
    {"checksums", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(checksums)),
     METH_VARARGS | METH_KEYWORDS,
     "checksums(buffer, starts, lengths, function, *, hardware=True) -> numpy uint32 array\n\n"
     "The checksum of each range buffer[starts[i] : starts[i] + lengths[i]] (lengths: one\n"
     "int for every range, or an int64 array), as zlib.crc32 ('crc32') or crc32c.crc32c\n"
     "('crc32c') compute it. starts and lengths are int64 arrays; every range must lie\n"
     "inside the buffer (ValueError naming the first that does not). hardware=False\n"
     "computes with the portable tables even where the CPU has instructions (tests)."},
    {"crc32c", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(one<evs::crc32c>)),
     METH_FASTCALL,
     "crc32c(data, value=0) -> int: CRC-32C of a bytes-like object, continuing ``value``\n"
     "(as crc32c.crc32c computes it)."},
    {"crc32", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(one<evs::crc32>)),
     METH_FASTCALL,
     "crc32(data, value=0) -> int: zlib's CRC-32 of a bytes-like object, continuing\n"
     "``value`` (as zlib.crc32 computes it)."},
    {"crc32c_hardware", hardware, METH_NOARGS,
     "True when CRC-32C uses the CPU's instructions (SSE4.2 or ARMv8 CRC)."},
    {nullptr, nullptr, 0, nullptr}};

int exec_module(PyObject* module) {
  if (evalue_store_native::add_zstd(module) < 0) return -1;  // ZstdGet: _native_zstd.cc
  if (evalue_store_native::add_gather(module) < 0) return -1;  // _native_gather.cc
  if (evalue_store_native::add_read_only(module) < 0) return -1;  // _native_readonly.cc
  // Build the tables now, under the import lock, so that no thread (and no child forked
  // while another thread computes) ever waits on their one-time initialisation.
  static const uint8_t zeros[64] = {};
  evs::crc32(zeros, sizeof zeros, 0);  // (64 bytes: the instruction path's check as well)
  evs::crc32c(zeros, sizeof zeros, 0);
  evs::crc32_portable(zeros, sizeof zeros, 0);
  evs::crc32c_portable(zeros, sizeof zeros, 0);
  if (g_numpy_empty == nullptr) {
    PyObject* numpy = PyImport_ImportModule("numpy");
    if (numpy == nullptr) return -1;
    g_numpy_empty = PyObject_GetAttrString(numpy, "empty");
    if (g_numpy_empty == nullptr) {
      Py_DECREF(numpy);
      return -1;
    }
    PyObject* dtype = PyObject_GetAttrString(numpy, "dtype");
    if (dtype == nullptr) {
      Py_DECREF(numpy);
      return -1;
    }
    g_uint32 = PyObject_CallFunction(dtype, "s", "uint32");
    Py_DECREF(dtype);
    Py_DECREF(numpy);
    if (g_uint32 == nullptr) return -1;
  }
  if (add_batch_type(module) < 0) return -1;  // BatchPlan: _native_batch.cc
  return add_mapped_type(module);
}

PyModuleDef_Slot slots[] = {{Py_mod_exec, reinterpret_cast<void*>(exec_module)},
                            {0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT,
                      "evalue_store._native",
                      "Checksums of many ranges of one buffer in one call (see _native.cc).",
                      0,
                      methods,
                      slots,
                      nullptr,
                      nullptr,
                      nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__native() { return PyModuleDef_Init(&module); }
