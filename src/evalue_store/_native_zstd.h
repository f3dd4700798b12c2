// What the files of evalue_store._native.ZstdGet share: the state a ZstdGet holds (its
// runs of locators, where the file's bytes are read from, its decoders, its cache of
// decompressed frames with its bookkeeping), bytes read from the file, and the making of a
// decompressed frame, a ZstdFrame (_native_zstd_frame.cc). The type itself: _native_zstd.cc.
#pragma once

#include "_native_parts.h"

#include <zstd.h>

#include <cstdint>
#include <iterator>
#include <list>
#include <unordered_map>
#include <vector>

namespace evalue_store_native {

struct Run {
  int64_t offset, first, count;  // offset -1: beyond kRunLimit, never served here
};

struct Cached {
  int64_t key;     // the frame's file offset
  PyObject* length;  // its compressed length, as given
  PyObject* buf;   // its decompressed bytes (a buffer)
  int64_t nbytes;
};

// What a ZstdGet holds.
struct ZstdState {
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
  // The frame ``locate`` decompressed last and did not put in the LRU: one that holds its
  // record alone (no other record is read from it), or one not yet seen twice (below).
  // Evicting the LRU's oldest frame for it would cost a random get more than it could
  // save (cold memory); kept here, a read of the same record, or of a neighbour, finds it.
  Cached last{-1, nullptr, nullptr, 0};
  // Keys of frames ``locate`` decompressed lately, one a slot (direct-mapped: a newer key
  // takes its slot): a frame enters the LRU the second time it is decompressed while its
  // key is still there. Random reads over a file much larger than the cache seldom come
  // back to a frame, and made the LRU evict a cold frame at every get (W1-shaped records,
  // 10M of them: 18.2 us a get with the cache, 15.9 without); a frame read again soon is
  // cached from then on.
  std::vector<int64_t> seen;
  int seen_shift = 64;

  ~ZstdState() {
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

  // True if the frame at ``key``, decompressed now, goes in the LRU (seen lately); else
  // its key takes its slot.
  bool admit(int64_t key) {
    if (seen.empty()) return true;
    int64_t& slot = seen[(static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull) >> seen_shift];
    if (slot == key) return true;
    slot = key;
    return false;
  }

  // ``slots`` (a power of two) keys remembered for ``admit``.
  void set_seen(int64_t slots) {
    int bits = 0;
    while ((int64_t{1} << bits) < slots) ++bits;
    seen.assign(static_cast<size_t>(int64_t{1} << bits), -1);
    seen_shift = 64 - bits;
  }

  const Cached* find(int64_t key) {  // the cached frame at ``key`` (made the newest) or null
    if (key == last.key) return &last;
    auto found = where.find(key);
    if (found == where.end()) return nullptr;
    lru.splice(lru.end(), lru, found->second);
    return &*found->second;
  }
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

// Decompresses the frame [p, p + span) into a new Frame of exactly ``size`` bytes placed
// for logical offset ``start``; nullptr (no error set) if the decoder rejects it or it
// gives another size; nullptr with an error set if memory runs out.
PyObject* decompress(ZstdState& s, Bytes& in, int64_t span, int64_t size, uint64_t start);

// Adds the type ZstdFrame to ``module`` (readied the first time): 0, or -1 with an error set.
int add_zstd_frame(PyObject* module);

}  // namespace evalue_store_native
