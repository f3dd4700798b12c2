// evalue_store._native.ZstdFrame, a compressed frame's bytes as ZstdGet (_native_zstd.cc)
// decompresses them: the type (a read-only buffer placed so that the records' tensors keep
// their file alignment) and the decompression into one, with the GIL released for a large
// frame (from a private copy of its bytes, with a decoder of the pool).
#include "_native_zstd.h"

#include <zstd.h>

#include <cstdint>
#include <vector>

namespace evalue_store_native {
namespace {

constexpr size_t kPoolMax = 8;

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

}  // namespace

PyObject* decompress(ZstdState& s, Bytes& in, int64_t span, int64_t size, uint64_t start) {
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

bool is_zstd_frame(PyObject* obj) { return Py_TYPE(obj) == &FrameType; }

int add_zstd_frame(PyObject* module) {
  if (FrameType.tp_name == nullptr) {
    FrameType.tp_name = "evalue_store._native.ZstdFrame";
    FrameType.tp_doc = "A decompressed frame's bytes (read-only buffer), placed aligned.";
    FrameType.tp_basicsize = offsetof(Frame, bytes);
    FrameType.tp_itemsize = 1;
    FrameType.tp_flags = Py_TPFLAGS_DEFAULT;
    FrameType.tp_as_buffer = &frame_buffer;
    if (PyType_Ready(&FrameType) < 0) return -1;
  }
  return PyModule_AddObjectRef(module, "ZstdFrame", reinterpret_cast<PyObject*>(&FrameType));
}

}  // namespace evalue_store_native
