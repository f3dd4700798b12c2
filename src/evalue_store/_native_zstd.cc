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
#include "_native_parts.h"

#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <list>
#include <new>
#include <unordered_map>
#include <vector>

#include "evalue_store/reader.h"

namespace evs = evalue_store;

namespace evalue_store_native {
namespace {

constexpr uint32_t kZstdMagic = 0xFD2FB528;
constexpr uint8_t kOwnDescriptor = 0x64;  // 2-byte content size, single segment, checksum
constexpr uint64_t kBlockSizeMax = 128 * 1024;
constexpr int64_t kSmallFrame = 256 << 10;  // frames up to this span are read here
constexpr int kWindowLogMax = 31;
constexpr int64_t kGroup = 16;  // locators per checksummed group
constexpr int64_t kLocatorSize = 24;  // logical u64, physical u64, span u32, position u32
constexpr int64_t kGroupBytes = kGroup * kLocatorSize + 4;
constexpr int64_t kSkippableHeader = 8;
constexpr int64_t kRunLimit = int64_t{1} << 48;  // run fields beyond this: not served here
constexpr size_t kPoolMax = 8;

uint32_t g_crc_residue = 0;  // CRC-32C of bytes followed by their CRC

uint64_t le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = v << 8 | p[k];
  return v;
}

// The content size of the zstd frame that fills exactly [p, p + n), after every check that
// needs no decoding (zframe.check_frame's rules: magic, a recorded content size no larger
// than ``cap`` nor than its blocks can produce, a content checksum, blocks within
// Block_Maximum_Size); -1 if it breaks one.
int64_t checked_size(const uint8_t* p, int64_t n, uint64_t cap) {
  if (n < 9 || le(p, 4) != kZstdMagic) return -1;
  int64_t header;
  uint64_t size, window;
  if (p[4] == kOwnDescriptor) {
    header = 7;
    size = le(p + 5, 2) + 256;
    window = size;
  } else {
    static const int did_sizes[] = {0, 1, 2, 4}, fcs_sizes[] = {0, 2, 4, 8};
    const uint8_t fhd = p[4];
    if (fhd & 0x08) return -1;  // reserved bit
    const bool single = fhd & 0x20;
    const int64_t pos = single ? 5 : 6;
    const int did = did_sizes[fhd & 3], fcs_flag = fhd >> 6;
    const int fcs = single && !fcs_flag ? 1 : fcs_sizes[fcs_flag];
    header = pos + did + fcs;
    if (n < header || fcs == 0 || !(fhd & 0x04)) return -1;  // no content size, no checksum
    const uint8_t* at = p + pos + did;
    size = fcs == 2 ? le(at, 2) + 256 : le(at, fcs);
    if (single) {
      window = size;
    } else {
      const int log = 10 + (p[5] >> 3);
      if (log > kWindowLogMax) return -1;
      const uint64_t base = uint64_t{1} << log;
      window = base + (base >> 3) * (p[5] & 7);
    }
  }
  if (size > cap) return -1;
  const uint64_t block_max = std::min(window, kBlockSizeMax);
  if (header + 3 <= n) {  // one compressed block, the last: a small frame's usual form
    const uint64_t block = le(p + header, 3);
    if ((block & 7) == 5 && block >> 3 <= block_max && size <= block_max &&
        header + 7 + static_cast<int64_t>(block >> 3) == n)
      return static_cast<int64_t>(size);
  }
  int64_t pos = header;  // walk the blocks (each at least 3 bytes: bounded by n)
  uint64_t lo = 0, hi = 0;
  while (true) {
    if (pos + 3 > n) return -1;
    const uint64_t block = le(p + pos, 3);
    pos += 3;
    const uint64_t type = (block >> 1) & 3, block_size = block >> 3;
    if (block_size > block_max || type == 3) return -1;
    if (type == 0) {
      pos += static_cast<int64_t>(block_size);
      lo += block_size;
      hi += block_size;
    } else if (type == 1) {
      pos += 1;
      lo += block_size;
      hi += block_size;
    } else {
      pos += static_cast<int64_t>(block_size);
      hi += block_max;
    }
    if (block & 1) break;
  }
  if (pos + 4 != n || size < lo || size > hi) return -1;
  return static_cast<int64_t>(size);
}

// True if the compressed block [p, p + n) sets the reserved bits of its
// Symbol_Compression_Modes (RFC 8878 section 3.1.1.3.2.1: they must be zero). libzstd
// checks this from 1.5.6 on; an older system libzstd decodes such a block, while the
// general path's decoder (python-zstandard's, newer) rejects it: checked here so that both
// paths accept the same frames. Bytes a header claims beyond the block: not this check's
// (the decoder rejects them).
bool reserved_modes(const uint8_t* p, int64_t n) {
  if (n < 1) return false;
  const int type = p[0] & 3, format = (p[0] >> 2) & 3;
  int64_t header, content;  // the literals section's header and content sizes
  if (type < 2) {  // raw or RLE literals
    header = format == 1 ? 2 : format == 3 ? 3 : 1;
    if (n < header) return false;
    const int64_t regenerated = format == 1   ? le(p, 2) >> 4
                                : format == 3 ? le(p, 3) >> 4
                                              : p[0] >> 3;
    content = type == 0 ? regenerated : 1;
  } else {  // compressed or treeless: 10, 14 or 18-bit sizes
    header = format < 2 ? 3 : format == 2 ? 4 : 5;
    if (n < header) return false;
    const int bits = format < 2 ? 10 : format == 2 ? 14 : 18;
    content = static_cast<int64_t>((le(p, static_cast<int>(header)) >> (4 + bits)) &
                                   ((uint64_t{1} << bits) - 1));
  }
  int64_t at = header + content;  // Number_of_Sequences
  if (at >= n) return false;
  const uint8_t b = p[at];
  if (b == 0) return false;  // no sequences: no modes byte
  at += b < 128 ? 1 : b < 255 ? 2 : 3;
  return at < n && (p[at] & 3) != 0;
}

// True if any compressed block of the zstd frame [p, p + n) with blocks from ``header``
// sets reserved mode bits (the frame has passed checked_size: its blocks lie inside it).
bool any_reserved_modes(const uint8_t* p, int64_t n, int64_t header) {
  int64_t pos = header;
  while (pos + 3 <= n) {
    const uint64_t block = le(p + pos, 3);
    const int64_t type = (block >> 1) & 3, size = static_cast<int64_t>(block >> 3);
    pos += 3;
    if (type == 2 && reserved_modes(p + pos, std::min(size, n - pos))) return true;
    pos += type == 1 ? 1 : size;
    if (block & 1) break;
  }
  return false;
}

// The header size of a frame checked_size accepted (its descriptor's fields).
int64_t header_size(const uint8_t* p) {
  if (p[4] == kOwnDescriptor) return 7;
  static const int did_sizes[] = {0, 1, 2, 4}, fcs_sizes[] = {0, 2, 4, 8};
  const uint8_t fhd = p[4];
  const bool single = fhd & 0x20;
  const int fcs_flag = fhd >> 6;
  return (single ? 5 : 6) + did_sizes[fhd & 3] + (single && !fcs_flag ? 1 : fcs_sizes[fcs_flag]);
}

// ------------------------------------------------------------------ ZstdFrame

// A decompressed frame: its bytes placed so that a logical offset that is a multiple of the
// alignment is an aligned address (tensors keep their file alignment); exported read-only.
struct Frame {
  PyObject_VAR_HEAD Py_ssize_t shift;
  Py_ssize_t size;
  char bytes[1];
};

int frame_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  auto* f = reinterpret_cast<Frame*>(self);
  return PyBuffer_FillInfo(view, self, f->bytes + f->shift, f->size, 1, flags);
}

PyBufferProcs frame_buffer = {frame_getbuffer, nullptr};
PyTypeObject FrameType = {PyVarObject_HEAD_INIT(nullptr, 0)};
PyTypeObject GetType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ------------------------------------------------------------------ ZstdGet

struct Run {
  int64_t offset, first, count;  // offset -1: beyond kRunLimit, never served here
};

struct Cached {
  int64_t key;     // the frame's file offset
  PyObject* length;  // its compressed length, as given
  PyObject* buf;   // its decompressed bytes (a buffer)
  int64_t nbytes;
};

struct State {
  PyObject* map = nullptr;    // the file's mapping, or None-equivalent nullptr
  PyObject* pread = nullptr;  // reader.pread(offset, n), used when there is no mapping
  PyObject* format_error = nullptr;  // what pread raises for a changed remote object
  std::vector<Run> runs;
  int64_t layout_end = 0, cap = 0, small_cap = 0, cache_bytes = 0, alignment = 64;
  ZSTD_DDict* ddict = nullptr;
  ZSTD_DCtx* dctx = nullptr;       // used with the GIL held, so by one call at a time
  std::vector<ZSTD_DCtx*> pool;    // for decompressions without the GIL
  std::list<Cached> lru;           // least recently used first
  std::unordered_map<int64_t, std::list<Cached>::iterator> where;
  int64_t cached = 0;
  // The frame ``locate`` decompressed last when it held its record alone: the LRU keeps
  // frames other records are read from, and evicting its oldest one for such a frame
  // costs a random get more than the frame could save (cold memory; no other record is
  // in it). Kept here, a read of the same record again still finds it.
  Cached last{-1, nullptr, nullptr, 0};

  ~State() {
    clear();
    Py_CLEAR(map);
    Py_CLEAR(pread);
    Py_CLEAR(format_error);
    for (ZSTD_DCtx* d : pool) ZSTD_freeDCtx(d);
    ZSTD_freeDCtx(dctx);
    ZSTD_freeDDict(ddict);
  }

  ZSTD_DCtx* new_dctx() const {
    ZSTD_DCtx* d = ZSTD_createDCtx();
    if (d != nullptr && ddict != nullptr && ZSTD_isError(ZSTD_DCtx_refDDict(d, ddict))) {
      ZSTD_freeDCtx(d);
      return nullptr;
    }
    return d;
  }

  void drop(std::list<Cached>::iterator it) {  // (the references go after the bookkeeping)
    PyObject *length = it->length, *buf = it->buf;
    cached -= it->nbytes;
    where.erase(it->key);
    lru.erase(it);
    Py_DECREF(length);
    Py_DECREF(buf);
  }

  // Makes ``entry`` (new references taken) the last lone frame, or none (key -1).
  void set_last(Cached entry) {
    Py_XINCREF(entry.length);
    Py_XINCREF(entry.buf);
    const Cached old = last;
    last = entry;
    Py_XDECREF(old.length);
    Py_XDECREF(old.buf);
  }

  void clear() {
    set_last(Cached{-1, nullptr, nullptr, 0});
    while (!lru.empty()) drop(lru.begin());
  }

  // Keeps ``buf`` (new references taken) as the frame at ``key``, evicting the least
  // recently used frames while over ``cache_bytes`` (the newest always stays).
  void remember(int64_t key, PyObject* length, PyObject* buf, int64_t nbytes) {
    if (key == last.key) set_last(Cached{-1, nullptr, nullptr, 0});
    auto found = where.find(key);
    if (found != where.end()) drop(found->second);
    Py_INCREF(length);
    Py_INCREF(buf);
    lru.push_back(Cached{key, length, buf, nbytes});
    where[key] = std::prev(lru.end());
    cached += nbytes;
    while (cached > cache_bytes && lru.size() > 1) drop(lru.begin());
  }

  const Cached* find(int64_t key) {  // the cached frame at ``key`` (made the newest) or null
    if (key == last.key) return &last;
    auto found = where.find(key);
    if (found == where.end()) return nullptr;
    lru.splice(lru.end(), lru, found->second);
    return &*found->second;
  }
};

struct Get {
  PyObject_HEAD State* s;
};

// ``n`` bytes at file offset ``at``, from the mapping (an export held while this lives:
// with the GIL held, no other thread can close the file meanwhile) or a pread.
struct Bytes {
  Py_buffer view{};
  bool held = false;
  const uint8_t* p = nullptr;
  ~Bytes() {
    if (held) PyBuffer_Release(&view);
  }
};

// 1: ``out`` holds the n bytes at ``at``; 0: they cannot be read so (short, a closed
// mapping, a pread that raised FormatError): the general path says why; -1: an error.
int read_bytes(State& s, int64_t at, int64_t n, Bytes* out) {
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

// Decompresses the frame [p, p + span) into a new Frame of exactly ``size`` bytes placed
// for logical offset ``start``; nullptr (no error set) if the decoder rejects it or it
// gives another size; nullptr with an error set if memory runs out.
PyObject* decompress(State& s, Bytes& in, int64_t span, int64_t size, uint64_t start) {
  const int64_t align = s.alignment;
  Frame* f = PyObject_NewVar(Frame, &FrameType, size + align);
  if (f == nullptr) return nullptr;
  const auto address = reinterpret_cast<uintptr_t>(f->bytes);
  f->shift = static_cast<Py_ssize_t>((start - address) & static_cast<uint64_t>(align - 1));
  f->size = size;
  char* dst = f->bytes + f->shift;
  size_t r;
  if (size < kReleaseGil) {
    r = ZSTD_decompressDCtx(s.dctx, dst, size, in.p, span);
  } else {
    std::vector<uint8_t> copy(in.p, in.p + span);  // no export is held without the GIL
    PyBuffer_Release(&in.view);
    in.held = false;
    ZSTD_DCtx* d;
    if (s.pool.empty()) {
      d = s.new_dctx();
      if (d == nullptr) {
        Py_DECREF(f);
        PyErr_NoMemory();
        return nullptr;
      }
    } else {
      d = s.pool.back();
      s.pool.pop_back();
    }
    Py_BEGIN_ALLOW_THREADS r = ZSTD_decompressDCtx(d, dst, size, copy.data(), span);
    Py_END_ALLOW_THREADS if (s.pool.size() < kPoolMax) s.pool.push_back(d);
    else ZSTD_freeDCtx(d);
  }
  if (ZSTD_isError(r) || r != static_cast<size_t>(size)) {
    Py_DECREF(f);
    return nullptr;
  }
  return reinterpret_cast<PyObject*>(f);
}

PyObject* get_new(PyTypeObject* type, PyObject*, PyObject*) {
  Get* self = reinterpret_cast<Get*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->s = new (std::nothrow) State();
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

bool set_alignment(State& s, long long alignment) {
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
  State& s = *reinterpret_cast<Get*>(self)->s;
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
  Py_INCREF(format_error);
  Py_XSETREF(s.format_error, format_error);
  s.clear();
  return 0;
}

}  // namespace

bool is_zstd_frame(PyObject* obj) { return Py_TYPE(obj) == &FrameType; }

bool is_zstd_get(PyObject* obj) { return Py_TYPE(obj) == &GetType; }

int locate(PyObject* zget, long long i, Located* out) {
  State& s = *reinterpret_cast<Get*>(zget)->s;
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
    if (position == 0 && static_cast<uint64_t>(size) <= record_end)
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
  State& s = *reinterpret_cast<Get*>(self)->s;
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
  State& s = *reinterpret_cast<Get*>(self)->s;
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
  State& s = *reinterpret_cast<Get*>(self)->s;
  const long long alignment = PyLong_AsLongLong(arg);
  if (alignment == -1 && PyErr_Occurred()) return nullptr;
  if (!set_alignment(s, alignment)) return nullptr;
  s.clear();
  Py_RETURN_NONE;
}

// read_from(map, pread): the file's bytes, from a mapping (a buffer; None: none) or else
// through pread(offset, n).
PyObject* read_from(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  State& s = *reinterpret_cast<Get*>(self)->s;
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
  State& s = *reinterpret_cast<Get*>(self)->s;
  Py_CLEAR(s.map);
  Py_CLEAR(s.pread);
  s.clear();
  Py_RETURN_NONE;
}

PyObject* cached_bytes(PyObject* self, void*) {
  const State& s = *reinterpret_cast<Get*>(self)->s;
  return PyLong_FromLongLong(s.cached + s.last.nbytes);
}

PyObject* cached_frames(PyObject* self, void*) {
  const State& s = *reinterpret_cast<Get*>(self)->s;
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
  if (FrameType.tp_name == nullptr) {
    FrameType.tp_name = "evalue_store._native.ZstdFrame";
    FrameType.tp_doc = "A decompressed frame's bytes (read-only buffer), placed aligned.";
    FrameType.tp_basicsize = offsetof(Frame, bytes);
    FrameType.tp_itemsize = 1;
    FrameType.tp_flags = Py_TPFLAGS_DEFAULT;
    FrameType.tp_as_buffer = &frame_buffer;
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
    if (PyType_Ready(&FrameType) < 0 || PyType_Ready(&GetType) < 0) return -1;
  }
  if (PyModule_AddObjectRef(module, "ZstdFrame", reinterpret_cast<PyObject*>(&FrameType)) < 0)
    return -1;
  return PyModule_AddObjectRef(module, "ZstdGet", reinterpret_cast<PyObject*>(&GetType));
}

}  // namespace evalue_store_native
