// evalue_store._native.ZstdGet: the random read of a layout-2 compressed file
// (docs/FRAMES.md), compiled: a record's locator group read and checked, its locator
// checked, its frame read, checked (FRAMES.md section 3) and decompressed with the file's
// dictionary, kept in an LRU cache of decompressed frames, and the record's frame header
// found in it. In Python this was ~45k instructions a get around a 4-8 us decoder call.
//
// It answers only what it can serve whole; anything else (a damaged group or frame, a
// record across frames, a frame it cannot read) is None, and the caller's general path
// reads the record or says what is wrong, as before. Every byte range is checked against
// what was read before it is touched; a frame's content size is capped as the Python
// reader caps it (``cap``; a one-block frame by the block maximum) before anything is
// allocated.
//
// Threads: every method runs with the GIL held, which serialises the object's state (the
// cache, the GIL-held decoder). A frame of 32 KiB or more is decompressed without the GIL:
// from a private copy of its bytes (a mapping's export is never held while other threads
// run: it would stop the file from being closed), with a decoder taken from a pool (one
// per concurrent call; a zstd context must never be shared) and given back after.
//
// Its files: this one, the type (its arguments, the locator's lookup, the cache's methods);
// _native_zstd.h, its state and cache; _native_zstd_frame.cc, the ZstdFrame type and the
// decompression; _native_zstd_checks.cc, the frame checks that need no decoding.
#include "_native_zstd.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <new>
#include <vector>

#include "_native_zstd_checks.h"
#include "evalue_store/reader.h"

namespace evs = evalue_store;

namespace evalue_store_native {
namespace {

constexpr int64_t kSmallFrame = 256 << 10;  // frames up to this span are read here
constexpr int64_t kGroup = 16;  // locators per checksummed group
constexpr int64_t kLocatorSize = 24;  // logical u64, physical u64, span u32, position u32
constexpr int64_t kGroupBytes = kGroup * kLocatorSize + 4;
constexpr int64_t kSkippableHeader = 8;
constexpr int64_t kRunLimit = int64_t{1} << 48;  // run fields beyond this: not served here

uint32_t g_crc_residue = 0;  // CRC-32C of bytes followed by their CRC

PyTypeObject GetType = {PyVarObject_HEAD_INIT(nullptr, 0)};

struct Get {
  PyObject_HEAD ZstdState* s;
};

// 1: ``out`` holds the n bytes at ``at``; 0: they cannot be read so (short, a closed
// mapping, a pread that raised FormatError): the general path says why; -1: an error.
int read_bytes(ZstdState& s, int64_t at, int64_t n, Bytes* out) {
  if (s.map != nullptr) {
    if (PyObject_GetBuffer(s.map, &out->view, PyBUF_SIMPLE) != 0) {
      PyErr_Clear();  // a mapping closed by close(): the general path raises
      return 0;
    }
    out->held = true;
    if (at > out->view.len || n > out->view.len - at) return 0;
    out->p = static_cast<const uint8_t*>(out->view.buf) + at;
    return 1;
  }
  if (s.pread == nullptr) return 0;
  PyObject* pread = Py_NewRef(s.pread);  // (held: another thread may close() meanwhile)
  PyObject* data = PyObject_CallFunction(pread, "LL", static_cast<long long>(at),
                                         static_cast<long long>(n));
  Py_DECREF(pread);
  if (data == nullptr) {
    if (PyErr_ExceptionMatches(s.format_error)) {
      PyErr_Clear();
      return 0;
    }
    return -1;
  }
  int got = PyObject_GetBuffer(data, &out->view, PyBUF_SIMPLE);
  Py_DECREF(data);  // (the export holds it)
  if (got != 0) return -1;
  out->held = true;
  if (out->view.len != n) return 0;
  out->p = static_cast<const uint8_t*>(out->view.buf);
  return 1;
}

PyObject* get_new(PyTypeObject* type, PyObject*, PyObject*) {
  Get* self = reinterpret_cast<Get*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->s = new (std::nothrow) ZstdState();
  if (self->s == nullptr) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  return reinterpret_cast<PyObject*>(self);
}

void get_dealloc(PyObject* self) {
  delete reinterpret_cast<Get*>(self)->s;
  Py_TYPE(self)->tp_free(self);
}

bool set_alignment(ZstdState& s, long long alignment) {
  if (alignment < 1 || alignment > (1 << 16) || (alignment & (alignment - 1))) {
    PyErr_Format(PyExc_ValueError, "alignment %lld is not a power of two in [1, 65536]",
                 alignment);
    return false;
  }
  s.alignment = alignment;
  return true;
}

int get_init(PyObject* self, PyObject* args, PyObject* kwargs) {
  static const char* keywords[] = {"dictionary", "runs",      "layout_end", "cap",
                                   "cache_bytes", "alignment", "format_error", nullptr};
  ZstdState& s = *reinterpret_cast<Get*>(self)->s;
  PyObject *dictionary, *runs, *format_error;
  long long layout_end, cap, cache_bytes, alignment;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOLLLLO:ZstdGet", const_cast<char**>(keywords),
                                   &dictionary, &runs, &layout_end, &cap, &cache_bytes,
                                   &alignment, &format_error))
    return -1;
  if (s.dctx != nullptr) {  // (a decoder may be in use without the GIL: never replaced)
    PyErr_SetString(PyExc_TypeError, "ZstdGet is initialised once");
    return -1;
  }
  if (layout_end < 0 || cap < 0 || cache_bytes < 0) {
    PyErr_SetString(PyExc_ValueError, "layout_end, cap and cache_bytes must be >= 0");
    return -1;
  }
  if (!PyType_Check(format_error) ||
      !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(format_error),
                        reinterpret_cast<PyTypeObject*>(PyExc_Exception))) {
    PyErr_SetString(PyExc_TypeError, "format_error must be an exception class");
    return -1;
  }
  if (!set_alignment(s, alignment)) return -1;
  PyObject* seq = PySequence_Fast(runs, "runs must be a sequence of (offset, first, count)");
  if (seq == nullptr) return -1;
  std::vector<Run> parsed;
  for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq); ++k) {
    long long v[3];
    PyObject* run = PySequence_Fast_GET_ITEM(seq, k);
    if (!PyArg_ParseTuple(run, "LLL:run", &v[0], &v[1], &v[2])) {
      if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
        Py_DECREF(seq);
        return -1;
      }
      PyErr_Clear();  // (a value past int64: never served here)
      v[0] = -1;
      v[1] = parsed.empty() ? 0 : parsed.back().first;
      v[2] = 0;
    }
    bool usable = true;
    for (long long x : v) usable = usable && x >= 0 && x < kRunLimit;
    if (!usable) v[0] = -1;
    if (!parsed.empty() && v[1] < parsed.back().first) {  // bisect needs them sorted
      Py_DECREF(seq);
      PyErr_SetString(PyExc_ValueError, "runs must be sorted by their first record");
      return -1;
    }
    parsed.push_back(Run{v[0], v[1], v[2]});
  }
  Py_DECREF(seq);
  ZSTD_DDict* ddict = nullptr;
  if (dictionary != Py_None) {
    Py_buffer d;
    if (PyObject_GetBuffer(dictionary, &d, PyBUF_SIMPLE) != 0) return -1;
    if (d.len) ddict = ZSTD_createDDict(d.buf, static_cast<size_t>(d.len));
    PyBuffer_Release(&d);
    if (d.len && ddict == nullptr) {
      PyErr_SetString(PyExc_ValueError, "the dictionary cannot be loaded");
      return -1;
    }
  }
  s.ddict = ddict;
  s.dctx = s.new_dctx();
  if (s.dctx == nullptr) {
    PyErr_NoMemory();
    return -1;
  }
  s.runs = std::move(parsed);
  s.layout_end = layout_end;
  s.cap = cap;
  s.small_cap = std::min<long long>(cap, kBlockSizeMax);
  s.cache_bytes = cache_bytes;
  s.set_seen(std::clamp<long long>(cache_bytes >> 10, 16, 1 << 16));
  Py_INCREF(format_error);
  Py_XSETREF(s.format_error, format_error);
  s.clear();
  return 0;
}

}  // namespace


bool is_zstd_get(PyObject* obj) { return Py_TYPE(obj) == &GetType; }

int locate(PyObject* zget, long long i, Located* out) {
  ZstdState& s = *reinterpret_cast<Get*>(zget)->s;
  auto run_at = std::upper_bound(s.runs.begin(), s.runs.end(), i,
                                 [](long long v, const Run& r) { return v < r.first; });
  if (i < 0 || run_at == s.runs.begin()) return 0;
  const Run run = *std::prev(run_at);
  const int64_t j = i - run.first;
  if (run.offset < 0 || j >= run.count) return 0;
  // The locator group, checked (FRAMES.md section 6 rule 3): its locators, then their CRC.
  const int64_t g = j / kGroup, slot = j % kGroup;
  const int64_t in_group = std::min(kGroup, run.count - g * kGroup);
  const int64_t group_at = run.offset + kSkippableHeader + g * kGroupBytes;
  uint64_t logical, phys;
  uint32_t span, position;
  {
    Bytes group;
    const int got = read_bytes(s, group_at, in_group * kLocatorSize + 4, &group);
    if (got <= 0) return got;
    if (evs::crc32c(group.p, in_group * kLocatorSize + 4, 0) != g_crc_residue) return 0;
    const uint8_t* loc = group.p + slot * kLocatorSize;
    logical = le(loc, 8);
    phys = le(loc + 8, 8);
    span = static_cast<uint32_t>(le(loc + 16, 4));
    position = static_cast<uint32_t>(le(loc + 20, 4));
  }
  // Section 9 rule 1: a usable locator (a span of a few frames' bytes, not SPAN_UNKNOWN),
  // whose frames lie between the layout frame and its run.
  if (span > kSmallFrame || position > logical || phys < static_cast<uint64_t>(s.layout_end) ||
      phys > static_cast<uint64_t>(run.offset) ||
      span > static_cast<uint64_t>(run.offset) - phys)
    return 0;
  const Cached* hit = s.find(static_cast<int64_t>(phys));
  PyObject* buf = hit == nullptr ? nullptr : Py_NewRef(hit->buf);
  int64_t size = -1;  // of a frame decompressed now
  if (buf == nullptr) {
    Bytes data;
    const int got = read_bytes(s, static_cast<int64_t>(phys), span, &data);
    if (got <= 0) return got;
    // FRAMES.md section 3 rule 3 for the frame a writer makes of a record or a few: its
    // own descriptor, one compressed block, the last, filling the span (so the content
    // size, the window, is at least the block); any other frame is walked.
    const uint8_t* p = data.p;
    if (span > 14 && le(p, 4) == kZstdMagic && p[4] == kOwnDescriptor) {
      const int64_t own = static_cast<int64_t>(le(p + 5, 2)) + 256;
      if (own <= s.small_cap && le(p + 7, 3) == ((uint64_t{span} - 14) << 3 | 5) &&
          span - 14 <= own)
        size = own;
    }
    if (size < 0) {
      size = checked_size(p, span, static_cast<uint64_t>(s.cap));
      if (size < 0 || any_reserved_modes(p, span, header_size(p))) return 0;
    } else if (reserved_modes(p + 10, span - 14)) {
      return 0;
    }
    buf = decompress(s, data, span, size, logical - position);
    if (buf == nullptr) return PyErr_Occurred() ? -1 : 0;
  }
  // The record's container frame header inside the frame (FORMAT.md section 4).
  Buffer v;
  if (!v.get(buf, PyBUF_SIMPLE)) {
    Py_DECREF(buf);
    return -1;
  }
  const auto* b = static_cast<const uint8_t*>(v.b.buf);
  const int64_t n = v.b.len;
  if (position > n || n - position < kFrameSize) {
    Py_DECREF(buf);
    return 0;
  }
  const uint8_t* head = b + position;
  const uint64_t length = le(head + 8, 8);
  if (std::memcmp(head, "EVR1", 4) != 0 ||
      length > static_cast<uint64_t>(n - position - kFrameSize)) {
    Py_DECREF(buf);
    return 0;
  }
  if (size >= 0) {  // decompressed now: cached (the LRU's or the last lone frame)
    PyObject* span_object = PyLong_FromUnsignedLong(span);
    if (span_object == nullptr) {
      Py_DECREF(buf);
      return -1;
    }
    const uint64_t mask = static_cast<uint64_t>(s.alignment - 1);
    const uint64_t record_end = (kFrameSize + length + mask) & ~mask;  // the next record's
    const Cached entry{static_cast<int64_t>(phys), span_object, buf, size};
    if ((position == 0 && static_cast<uint64_t>(size) <= record_end) || !s.admit(entry.key))
      s.set_last(entry);
    else
      s.remember(entry.key, span_object, buf, size);
    Py_DECREF(span_object);
  }
  *out = Located{buf, position, logical, length, phys, static_cast<uint32_t>(le(head + 4, 4)),
                 span};
  return 1;
}

namespace {

// A frame as Python code reads it: a memoryview (of a ZstdFrame; a cached buffer as given).
PyObject* as_view(PyObject* buf) {
  return is_zstd_frame(buf) ? PyMemoryView_FromObject(buf) : Py_NewRef(buf);
}

PyObject* record_frame(PyObject* self, PyObject* arg) {
  const long long i = PyLong_AsLongLong(arg);
  if (i == -1 && PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return nullptr;
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  Located found;
  const int got = locate(self, i, &found);
  if (got <= 0) return got < 0 ? nullptr : Py_NewRef(Py_None);
  PyObject* view = as_view(found.buf);
  Py_DECREF(found.buf);
  if (view == nullptr) return nullptr;
  return Py_BuildValue("(NLKKIKI)", view, static_cast<long long>(found.position),
                       static_cast<unsigned long long>(found.logical),
                       static_cast<unsigned long long>(found.length), found.crc,
                       static_cast<unsigned long long>(found.phys), found.span);
}

// cached(phys) -> (length, buffer) | None: the frame at file offset ``phys`` if cached
// (then the most recently used).
PyObject* cached(PyObject* self, PyObject* arg) {
  ZstdState& s = *reinterpret_cast<Get*>(self)->s;
  const long long key = PyLong_AsLongLong(arg);
  if (key == -1 && PyErr_Occurred()) return nullptr;
  const Cached* found = s.find(key);
  if (found == nullptr) Py_RETURN_NONE;
  PyObject* view = as_view(found->buf);
  if (view == nullptr) return nullptr;
  return Py_BuildValue("(ON)", found->length, view);
}

// remember(phys, length, buffer): keeps a frame the general path decompressed.
PyObject* remember(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  ZstdState& s = *reinterpret_cast<Get*>(self)->s;
  if (nargs != 3)
    return PyErr_Format(PyExc_TypeError, "remember(phys, length, buffer): %zd arguments", nargs);
  const long long key = PyLong_AsLongLong(args[0]);
  if (key == -1 && PyErr_Occurred()) return nullptr;
  Py_buffer v;
  if (PyObject_GetBuffer(args[2], &v, PyBUF_SIMPLE) != 0) return nullptr;
  const int64_t nbytes = v.len;
  PyBuffer_Release(&v);
  s.remember(key, args[1], args[2], nbytes);
  Py_RETURN_NONE;
}

// reset(alignment): empties the cache and places later frames for ``alignment``.
PyObject* reset(PyObject* self, PyObject* arg) {
  ZstdState& s = *reinterpret_cast<Get*>(self)->s;
  const long long alignment = PyLong_AsLongLong(arg);
  if (alignment == -1 && PyErr_Occurred()) return nullptr;
  if (!set_alignment(s, alignment)) return nullptr;
  s.clear();
  Py_RETURN_NONE;
}

// read_from(map, pread): the file's bytes, from a mapping (a buffer; None: none) or else
// through pread(offset, n).
PyObject* read_from(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  ZstdState& s = *reinterpret_cast<Get*>(self)->s;
  if (nargs != 2)
    return PyErr_Format(PyExc_TypeError, "read_from(map, pread): %zd arguments", nargs);
  if (args[0] != Py_None && !PyObject_CheckBuffer(args[0]))
    return PyErr_Format(PyExc_TypeError, "map must be a buffer or None");
  if (!PyCallable_Check(args[1])) return PyErr_Format(PyExc_TypeError, "pread must be callable");
  PyObject* map = args[0] == Py_None ? nullptr : args[0];
  Py_XINCREF(map);
  Py_XSETREF(s.map, map);
  Py_INCREF(args[1]);
  Py_XSETREF(s.pread, args[1]);
  Py_RETURN_NONE;
}

// close(): forgets the file and the cache; record_frame is None from then on.
PyObject* close(PyObject* self, PyObject*) {
  ZstdState& s = *reinterpret_cast<Get*>(self)->s;
  Py_CLEAR(s.map);
  Py_CLEAR(s.pread);
  s.clear();
  Py_RETURN_NONE;
}

PyObject* cached_bytes(PyObject* self, void*) {
  const ZstdState& s = *reinterpret_cast<Get*>(self)->s;
  return PyLong_FromLongLong(s.cached + s.last.nbytes);
}

PyObject* cached_frames(PyObject* self, void*) {
  const ZstdState& s = *reinterpret_cast<Get*>(self)->s;
  return PyLong_FromSize_t(s.lru.size() + (s.last.buf != nullptr));
}

PyMethodDef get_methods[] = {
    {"record_frame", record_frame, METH_O,
     "record_frame(i) -> (buffer, position, logical, length, crc, phys, span) | None\n\n"
     "Record i found through its locator, when it lies in one data frame and every check\n"
     "of the frame layer passes: the frame's bytes, where the record's frame header is in\n"
     "them, its logical offset, payload length and crc (from the frame header), and the\n"
     "file offset and span of its frame. None otherwise: the general path reads it."},
    {"cached", cached, METH_O,
     "cached(phys) -> (length, buffer) | None: a cached frame (made the most recent)."},
    {"remember", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(remember)),
     METH_FASTCALL, "remember(phys, length, buffer): caches a frame, evicting the oldest."},
    {"reset", reset, METH_O, "reset(alignment): empties the cache; frames placed anew."},
    {"read_from", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(read_from)),
     METH_FASTCALL, "read_from(map, pread): where the file's bytes are read from."},
    {"close", close, METH_NOARGS, "close(): forgets the file and the cache."},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef get_getset[] = {
    {"cached_bytes", cached_bytes, nullptr, "decompressed bytes in the cache", nullptr},
    {"cached_frames", cached_frames, nullptr, "frames in the cache", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

}  // namespace

int add_zstd(PyObject* module) {
  static const uint8_t zeros[4] = {};
  g_crc_residue = evs::crc32c(zeros, sizeof zeros, 0);
  if (add_zstd_frame(module) < 0) return -1;  // ZstdFrame: _native_zstd_frame.cc
  if (GetType.tp_name == nullptr) {
    GetType.tp_name = "evalue_store._native.ZstdGet";
    GetType.tp_doc =
        "ZstdGet(dictionary, runs, layout_end, cap, cache_bytes, alignment, format_error)\n\n"
        "The random read of a layout-2 compressed file and its cache of decompressed frames\n"
        "(see _native_zstd.cc); read_from(map, pread) says where its bytes are.";
    GetType.tp_basicsize = sizeof(Get);
    GetType.tp_flags = Py_TPFLAGS_DEFAULT;
    GetType.tp_new = get_new;
    GetType.tp_init = get_init;
    GetType.tp_dealloc = get_dealloc;
    GetType.tp_methods = get_methods;
    GetType.tp_getset = get_getset;
    if (PyType_Ready(&GetType) < 0) return -1;
  }
  return PyModule_AddObjectRef(module, "ZstdGet", reinterpret_cast<PyObject*>(&GetType));
}

}  // namespace evalue_store_native
