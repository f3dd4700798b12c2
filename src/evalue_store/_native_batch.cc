// evalue_store._native.BatchPlan: a batch of records that share one layout, checked and
// copied into stacked columns in one pass per record.
//
// get_batch's numpy decoder (codec/batch_decode.py before this) read each record's bytes
// from memory three times: the checksum, a gather of whole frames into one block, and the
// copy of each value out of it, with a few dozen numpy calls per batch besides. Records of a
// batch are at random places in the file, so each of those reads came from DRAM. This does,
// for each record in turn, what that decoder did for the batch: the frame header's checksum
// field against the index's, the structure bytes (codec/layout.py) against the layout's, the
// payload's checksum when verifying, each Bool byte (0 or 1), then each tensor, scalar and
// Bool value copied straight into its row of the column it goes in. A record that fails any
// check is handed back by its position (and none of its values are used): the caller then
// reads the batch the general way, which says what is wrong, so errors are reported by one
// implementation only. Strings (UTF-8, strict) and bytes become lists of Python objects.
//
// Safety: the plan's steps are checked against its frame size when it is made; the buffer
// (or each record's buffer) and every column are exported for the whole call, each column
// must hold exactly one row per record, and each frame is checked to lie inside its buffer
// before a byte of it is read. The
// frames and checksums are copied out before use. The GIL is released while the records are
// checked and copied (only exported memory is touched then), and held while strings are made.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "_native_parts.h"
#include "evalue_store/reader.h"

namespace evs = evalue_store;
using namespace evalue_store_native;  // (_native_parts.h)

namespace {

constexpr int64_t kPrefetchBytes = 4 << 10;  // of the next frame, asked for ahead of its turn




struct Step {
  int kind;
  int64_t at;    // byte offset in the frame
  int64_t size;  // bytes of the value (a row of its column for a copied value)
};

struct Plan {
  PyObject_HEAD int64_t frame_size;               // header and payload
  std::vector<std::pair<int64_t, int64_t>>* runs;  // (frame offset, length) of structure bytes
  std::string* expected;                          // their bytes, concatenated
  std::vector<Step>* steps;
};

bool copied(int kind) { return kind == kTensor || kind == kScalar || kind == kBool; }

// The 1-D integer array ``obj`` (any stride) as int64 values: ``itemsize`` 8 for a signed
// int64 array, 4 for a uint32 one. False with an error naming it if it is not one.
bool integers(PyObject* obj, const char* name, Py_ssize_t itemsize, std::vector<int64_t>* out) {
  Buffer v;
  if (!v.get(obj, PyBUF_FORMAT | PyBUF_STRIDES)) return false;
  const char* f = v.b.format != nullptr ? v.b.format : "B";
  if (*f == '@' || *f == '=' || *f == '<') ++f;
  const bool ok = v.b.ndim == 1 && v.b.itemsize == itemsize && f[1] == '\0' &&
                  (itemsize == 8 ? (f[0] == 'q' || f[0] == 'l') : f[0] == 'I');
  if (!ok) {
    PyErr_Format(PyExc_TypeError, "%s must be a 1-D %s array", name,
                 itemsize == 8 ? "int64" : "uint32");
    return false;
  }
  const Py_ssize_t n = v.b.shape[0];
  out->resize(static_cast<size_t>(n));
  const auto* p = static_cast<const char*>(v.b.buf);
  for (Py_ssize_t k = 0; k < n; ++k, p += v.b.strides[0]) {
    if (itemsize == 8) {
      int64_t x;
      std::memcpy(&x, p, 8);
      (*out)[static_cast<size_t>(k)] = x;
    } else {
      uint32_t x;
      std::memcpy(&x, p, 4);
      (*out)[static_cast<size_t>(k)] = x;
    }
  }
  return true;
}

// decode(buffer, frames, crcs, checksum, outs) -> (bad, lists)
PyObject* decode(PyObject* self, PyObject* args) {
  const Plan* plan = reinterpret_cast<Plan*>(self);
  if (plan->steps == nullptr) return PyErr_Format(PyExc_TypeError, "BatchPlan is not initialised");
  PyObject *buffer, *frames_obj, *crcs_obj, *outs;
  const char* checksum = nullptr;
  if (!PyArg_ParseTuple(args, "OOOzO!:decode", &buffer, &frames_obj, &crcs_obj, &checksum,
                        &PyList_Type, &outs))
    return nullptr;
  uint32_t (*sum)(const void*, size_t, uint32_t) = nullptr;
  if (checksum == nullptr) {
  } else if (std::strcmp(checksum, "crc32c") == 0) {
    sum = evs::crc32c;
  } else if (std::strcmp(checksum, "crc32") == 0) {
    sum = evs::crc32;
  } else {
    return PyErr_Format(PyExc_ValueError, "checksum must be 'crc32c', 'crc32' or None, not '%s'",
                        checksum);
  }
  std::vector<int64_t> frames, crcs;
  if (!integers(frames_obj, "frames", 8, &frames) || !integers(crcs_obj, "crcs", 4, &crcs))
    return nullptr;
  const size_t count = frames.size();
  if (crcs.size() != count)
    return PyErr_Format(PyExc_ValueError, "%zu frames but %zu crcs", count, crcs.size());
  const std::vector<Step>& steps = *plan->steps;
  if (PyList_GET_SIZE(outs) != static_cast<Py_ssize_t>(steps.size()))
    return PyErr_Format(PyExc_ValueError, "%zd outs for %zu values", PyList_GET_SIZE(outs),
                        steps.size());
  // Every column exported (writable, C-contiguous) and exactly one row per record.
  std::vector<std::unique_ptr<Buffer>> columns(steps.size());
  std::vector<uint8_t*> rows(steps.size(), nullptr);
  for (size_t s = 0; s < steps.size(); ++s) {
    PyObject* out = PyList_GET_ITEM(outs, static_cast<Py_ssize_t>(s));
    if (!copied(steps[s].kind)) {
      if (out != Py_None) return PyErr_Format(PyExc_ValueError, "out %zu must be None", s);
      continue;
    }
    columns[s] = std::make_unique<Buffer>();
    if (!columns[s]->get(out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)) return nullptr;
    int64_t want;
    if (__builtin_mul_overflow(static_cast<int64_t>(count), steps[s].size, &want) ||
        columns[s]->b.len != want)
      return PyErr_Format(PyExc_ValueError, "out %zu holds %zd bytes, not %zu rows of %lld", s,
                          columns[s]->b.len, count, static_cast<long long>(steps[s].size));
    rows[s] = static_cast<uint8_t*>(columns[s]->b.buf);
  }
  // One buffer holding every frame, or a list of one buffer per record (a compressed
  // file's decompressed frames, read where they lie).
  const bool listed = PyList_Check(buffer);
  if (listed && PyList_GET_SIZE(buffer) != static_cast<Py_ssize_t>(count))
    return PyErr_Format(PyExc_ValueError, "%zd buffers for %zu frames", PyList_GET_SIZE(buffer),
                        count);
  std::vector<Buffer> data(listed ? count : 1);
  std::vector<const uint8_t*> bases(count);
  std::vector<int64_t> sizes(count);
  for (size_t k = 0; k < data.size(); ++k) {
    PyObject* obj = listed ? PyList_GET_ITEM(buffer, static_cast<Py_ssize_t>(k)) : buffer;
    if (!data[k].get(obj, PyBUF_SIMPLE)) return nullptr;
  }
  for (size_t k = 0; k < count; ++k) {
    const Py_buffer& b = data[listed ? k : 0].b;
    bases[k] = static_cast<const uint8_t*>(b.buf);
    sizes[k] = b.len;
  }
  const int64_t frame_size = plan->frame_size;
  const auto& runs = *plan->runs;
  const std::string& expected = *plan->expected;
  std::vector<char> good(count, 0);

  // A frame's place if it lies inside its buffer, else nullptr.
  auto frame_at = [&](size_t k) -> const uint8_t* {
    const int64_t f = frames[k];
    return f >= 0 && f <= sizes[k] - frame_size ? bases[k] + f : nullptr;
  };
  auto one = [&](size_t k) {
    const uint8_t* frame = frame_at(k);
    if (frame == nullptr) return;
    const uint32_t crc = static_cast<uint32_t>(crcs[k]);
    if (load_u32(frame + kFrameCrcAt) != crc) return;
    const char* want = expected.data();
    for (const auto& run : runs) {
      if (std::memcmp(frame + run.first, want, static_cast<size_t>(run.second)) != 0) return;
      want += run.second;
    }
    if (sum != nullptr &&
        sum(frame + kFrameSize, static_cast<size_t>(frame_size - kFrameSize), 0) != crc)
      return;
    for (const Step& step : steps)
      if (step.kind == kBool && frame[step.at] > 1) return;
    for (size_t s = 0; s < steps.size(); ++s) {
      const Step& step = steps[s];
      if (rows[s] != nullptr && step.size > 0)
        std::memcpy(rows[s] + static_cast<int64_t>(k) * step.size, frame + step.at,
                    static_cast<size_t>(step.size));
    }
    good[k] = 1;
  };
  auto all = [&] {
    const int64_t ahead = frame_size < kPrefetchBytes ? frame_size : kPrefetchBytes;
    for (size_t k = 0; k < count; ++k) {
      if (k + 1 < count) {  // the next frame's lines: its DRAM reads overlap this one's work
        if (const uint8_t* next = frame_at(k + 1))
          for (int64_t b = 0; b < ahead; b += 64) __builtin_prefetch(next + b);
      }
      one(k);
    }
  };
  int64_t work;
  if (__builtin_mul_overflow(static_cast<int64_t>(count), frame_size, &work) ||
      work >= kReleaseGil) {
    Py_BEGIN_ALLOW_THREADS all();
    Py_END_ALLOW_THREADS
  } else {
    all();
  }

  PyObject* bad = PyList_New(0);
  if (bad == nullptr) return nullptr;
  PyObject* lists = PyList_New(static_cast<Py_ssize_t>(steps.size()));
  if (lists == nullptr) {
    Py_DECREF(bad);
    return nullptr;
  }
  auto fail = [&]() -> PyObject* {
    Py_DECREF(bad);
    Py_DECREF(lists);
    return nullptr;
  };
  for (size_t s = 0; s < steps.size(); ++s) {
    Py_INCREF(Py_None);
    PyList_SET_ITEM(lists, static_cast<Py_ssize_t>(s), Py_None);
  }
  for (size_t s = 0; s < steps.size(); ++s) {  // strings: only where the records are good
    const Step& step = steps[s];
    if (step.kind != kText && step.kind != kBytes) continue;
    PyObject* values = PyList_New(static_cast<Py_ssize_t>(count));
    if (values == nullptr) return fail();
    PyList_SetItem(lists, static_cast<Py_ssize_t>(s), values);  // (drops the None)
    for (size_t k = 0; k < count; ++k) {
      PyObject* value = Py_None;
      if (good[k]) {
        const char* p = reinterpret_cast<const char*>(bases[k] + frames[k] + step.at);
        value = step.kind == kText ? PyUnicode_DecodeUTF8(p, step.size, "strict")
                                   : PyBytes_FromStringAndSize(p, step.size);
        if (value == nullptr) {
          if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return fail();
          PyErr_Clear();  // not UTF-8: the general path says where
          good[k] = 0;
          value = Py_None;
          Py_INCREF(value);
        }
      } else {
        Py_INCREF(value);
      }
      PyList_SET_ITEM(values, static_cast<Py_ssize_t>(k), value);
    }
  }
  for (size_t k = 0; k < count; ++k) {
    if (good[k]) continue;
    PyObject* position = PyLong_FromSize_t(k);
    if (position == nullptr || PyList_Append(bad, position) != 0) {
      Py_XDECREF(position);
      return fail();
    }
    Py_DECREF(position);
  }
  return Py_BuildValue("(NN)", bad, lists);
}

// BatchPlan(frame_size, runs, steps): runs [(frame offset, bytes)] of the structure bytes
// every record repeats; steps one (kind, frame offset, bytes) per value.
int init(PyObject* self, PyObject* args, PyObject* kwargs) {
  static const char* keywords[] = {"frame_size", "runs", "steps", nullptr};
  long long frame_size;
  PyObject *runs, *steps;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LO!O!:BatchPlan", const_cast<char**>(keywords),
                                   &frame_size, &PyList_Type, &runs, &PyList_Type, &steps))
    return -1;
  auto* plan = reinterpret_cast<Plan*>(self);
  if (plan->steps != nullptr) {
    PyErr_SetString(PyExc_TypeError, "BatchPlan is initialised once");
    return -1;
  }
  if (frame_size < kFrameSize) {
    PyErr_Format(PyExc_ValueError, "frame size %lld is below %lld", frame_size,
                 static_cast<long long>(kFrameSize));
    return -1;
  }
  auto inside = [&](long long at, long long n) {
    return at >= 0 && n >= 0 && at <= frame_size && n <= frame_size - at;
  };
  auto made_runs = std::make_unique<std::vector<std::pair<int64_t, int64_t>>>();
  auto made_expected = std::make_unique<std::string>();
  auto made_steps = std::make_unique<std::vector<Step>>();
  for (Py_ssize_t k = 0; k < PyList_GET_SIZE(runs); ++k) {
    long long at;
    const char* bytes;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(runs, k), "Ly#:run", &at, &bytes, &n)) return -1;
    if (!inside(at, n)) {
      PyErr_Format(PyExc_ValueError, "run %zd is outside the frame", k);
      return -1;
    }
    made_runs->emplace_back(at, n);
    made_expected->append(bytes, static_cast<size_t>(n));
  }
  for (Py_ssize_t k = 0; k < PyList_GET_SIZE(steps); ++k) {
    int kind;
    long long at, n;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(steps, k), "iLL:step", &kind, &at, &n)) return -1;
    const bool ok = kind >= kNone && kind <= kBool && inside(at, n) &&
                    (kind != kScalar || n == 8) && (kind != kBool || n == 1);
    if (!ok) {
      PyErr_Format(PyExc_ValueError, "step %zd (kind %d at %lld, %lld bytes) is not valid", k,
                   kind, at, n);
      return -1;
    }
    made_steps->push_back(Step{kind, at, n});
  }
  plan->frame_size = frame_size;
  plan->runs = made_runs.release();
  plan->expected = made_expected.release();
  plan->steps = made_steps.release();
  return 0;
}

void dealloc(PyObject* self) {
  auto* plan = reinterpret_cast<Plan*>(self);
  delete plan->runs;
  delete plan->expected;
  delete plan->steps;
  PyTypeObject* type = Py_TYPE(self);
  type->tp_free(self);
  Py_DECREF(type);
}

PyMethodDef plan_methods[] = {
    {"decode", decode, METH_VARARGS,
     "decode(buffer, frames, crcs, checksum, outs) -> (bad, lists)\n\n"
     "Check each record whose frame starts at buffer[frames[k]] (int64; buffer: one buffer,\n"
     "or a list of one per record, frames[k] then in buffer[k]) against crcs[k]\n"
     "(uint32; checksum: 'crc32c', 'crc32' or None: not verified) and the plan, and copy\n"
     "its tensor, scalar and Bool values into row k of their outs (one writable C-contiguous\n"
     "buffer per such value of exactly len(frames) rows, None for the others). bad: the\n"
     "positions of the records that fail a check; lists: per value, a list of the strings\n"
     "or bytes of every record (None at a bad one), None for other values."},
    {nullptr, nullptr, 0, nullptr}};

PyType_Slot plan_slots[] = {
    {Py_tp_doc, const_cast<char*>("BatchPlan(frame_size, runs, steps): a layout's batch "
                                  "decoder (_native_batch.cc).")},
    {Py_tp_new, reinterpret_cast<void*>(PyType_GenericNew)},
    {Py_tp_init, reinterpret_cast<void*>(init)},
    {Py_tp_dealloc, reinterpret_cast<void*>(dealloc)},
    {Py_tp_methods, plan_methods},
    {0, nullptr}};

PyType_Spec plan_spec = {"evalue_store._native.BatchPlan", sizeof(Plan), 0, Py_TPFLAGS_DEFAULT,
                         plan_slots};

}  // namespace

int add_batch_type(PyObject* module) {
  PyObject* type = PyType_FromSpec(&plan_spec);
  if (type == nullptr) return -1;
  if (PyModule_AddObject(module, "BatchPlan", type) != 0) {
    Py_DECREF(type);
    return -1;
  }
  return 0;
}
