// The exporters of the bytes reads hand out, both exported READ-ONLY (THREAT_MODEL.md 4):
// every array and memoryview a read returns views one of them, and Python reaches the
// exporter from it (``a.base``, ``memoryview.obj``). A writable exporter there (a mmap.mmap,
// a numpy array, an array.array) let ``np.frombuffer(a.base.obj, np.uint8)`` write, from
// pure Python, into bytes later reads return. Neither type shows Python the object behind
// it (no attribute, nothing for gc.get_referents), so only ctypes or an address can write.
//
// evalue_store._native.FileMap: the mapping a plain file is read through (buffers.py). A
// private (copy-on-write: MAP_PRIVATE, PROT_WRITE) mapping of a file from offset 0, so
// that a forced write changes this process's copy, never the file, and does not crash the
// process as a PROT_READ mapping would. It keeps a duplicate of the descriptor for
// ``buffers.private`` to map pages of it again; ``close()`` unmaps and closes it unless
// buffers are exported (BufferError, as mmap.mmap), and the last reference does otherwise.
//
// evalue_store._native.read_only(buffer): a memoryview of a ReadOnly, the bytes of a
// C-contiguous buffer the library filled (a pread, a decompressed or assembled frame),
// exported read-only; it holds the buffer's export for its lifetime.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "_native_parts.h"

namespace evalue_store_native {
namespace {

struct FileMap {
  PyObject_HEAD char* data;  // nullptr once closed
  Py_ssize_t size;
  Py_ssize_t exports;
  int fd;  // the duplicate; -1 once closed
};

void unmap(FileMap* m) {
  if (m->data != nullptr) munmap(m->data, static_cast<size_t>(m->size));
  if (m->fd >= 0) close(m->fd);
  m->data = nullptr;
  m->fd = -1;
}

PyObject* filemap_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  int fd;
  Py_ssize_t size;
  static const char* names[] = {"fd", "size", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "in:FileMap", const_cast<char**>(names), &fd,
                                   &size))
    return nullptr;
  if (size <= 0) return PyErr_Format(PyExc_ValueError, "cannot map %zd bytes", size);
  struct stat st;
  if (fstat(fd, &st) != 0) return PyErr_SetFromErrno(PyExc_OSError);
  if (S_ISREG(st.st_mode) && size > st.st_size)  // (pages past the end would be SIGBUS)
    return PyErr_Format(PyExc_ValueError, "cannot map %zd bytes of a file of %lld", size,
                        static_cast<long long>(st.st_size));
  auto* m = reinterpret_cast<FileMap*>(type->tp_alloc(type, 0));
  if (m == nullptr) return nullptr;
  m->data = nullptr;
  m->size = size;
  m->exports = 0;
  m->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (m->fd < 0) {
    PyErr_SetFromErrno(PyExc_OSError);
    Py_DECREF(m);
    return nullptr;
  }
  void* p;
  Py_BEGIN_ALLOW_THREADS p =
      mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_PRIVATE, m->fd, 0);
  Py_END_ALLOW_THREADS if (p == MAP_FAILED) {
    PyErr_SetFromErrno(PyExc_OSError);
    Py_DECREF(m);
    return nullptr;
  }
  m->data = static_cast<char*>(p);
  return reinterpret_cast<PyObject*>(m);
}

void filemap_dealloc(PyObject* self) {
  unmap(reinterpret_cast<FileMap*>(self));
  Py_TYPE(self)->tp_free(self);
}

int filemap_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  auto* m = reinterpret_cast<FileMap*>(self);
  if (m->data == nullptr) {
    PyErr_SetString(PyExc_ValueError, "FileMap is closed");
    return -1;
  }
  if (flags & PyBUF_WRITABLE) {
    PyErr_SetString(PyExc_BufferError,
                    "FileMap is read-only: reads share its bytes (THREAT_MODEL.md 4)");
    return -1;
  }
  if (PyBuffer_FillInfo(view, self, m->data, m->size, 1, flags) < 0) return -1;
  ++m->exports;
  return 0;
}

void filemap_releasebuffer(PyObject* self, Py_buffer*) {
  --reinterpret_cast<FileMap*>(self)->exports;
}

PyObject* filemap_close(PyObject* self, PyObject*) {
  auto* m = reinterpret_cast<FileMap*>(self);
  if (m->exports > 0) {
    PyErr_SetString(PyExc_BufferError, "cannot close exported pointers exist");
    return nullptr;
  }
  unmap(m);
  Py_RETURN_NONE;
}

PyObject* filemap_fd(PyObject* self, void*) {
  return PyLong_FromLong(reinterpret_cast<FileMap*>(self)->fd);
}

PyObject* filemap_address(PyObject* self, void*) {
  return PyLong_FromVoidPtr(reinterpret_cast<FileMap*>(self)->data);
}

PyObject* filemap_closed(PyObject* self, void*) {
  return PyBool_FromLong(reinterpret_cast<FileMap*>(self)->data == nullptr);
}

Py_ssize_t filemap_length(PyObject* self) { return reinterpret_cast<FileMap*>(self)->size; }

PyMethodDef filemap_methods[] = {
    {"close", filemap_close, METH_NOARGS,
     "Unmap and close the descriptor (BufferError while buffers of it are exported)."},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef filemap_getset[] = {
    {"fd", filemap_fd, nullptr, "The mapping's own descriptor (-1 once closed).", nullptr},
    {"address", filemap_address, nullptr, "The address of the first byte (0 once closed).",
     nullptr},
    {"closed", filemap_closed, nullptr, "True once closed.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyBufferProcs filemap_buffer = {filemap_getbuffer, filemap_releasebuffer};
PySequenceMethods filemap_sequence = {filemap_length};
PyTypeObject FileMapType = {PyVarObject_HEAD_INIT(nullptr, 0)};

struct ReadOnly {
  PyObject_HEAD Py_buffer inner;
};

PyTypeObject ReadOnlyType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// read_only(buffer): a memoryview of a new ReadOnly over ``buffer``'s bytes.
PyObject* read_only(PyObject*, PyObject* obj) {
  auto* r = PyObject_New(ReadOnly, &ReadOnlyType);
  if (r == nullptr) return nullptr;
  if (PyObject_GetBuffer(obj, &r->inner, PyBUF_SIMPLE) < 0) {
    r->inner.obj = nullptr;
    Py_DECREF(r);
    return nullptr;
  }
  PyObject* view = PyMemoryView_FromObject(reinterpret_cast<PyObject*>(r));
  Py_DECREF(r);
  return view;
}

void readonly_dealloc(PyObject* self) {
  auto* r = reinterpret_cast<ReadOnly*>(self);
  if (r->inner.obj != nullptr) PyBuffer_Release(&r->inner);
  Py_TYPE(self)->tp_free(self);
}

int readonly_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  const Py_buffer& inner = reinterpret_cast<ReadOnly*>(self)->inner;
  if (flags & PyBUF_WRITABLE) {
    PyErr_SetString(PyExc_BufferError,
                    "read-only: later reads share these bytes (THREAT_MODEL.md 4)");
    return -1;
  }
  return PyBuffer_FillInfo(view, self, inner.buf, inner.len, 1, flags);
}

Py_ssize_t readonly_length(PyObject* self) {
  return reinterpret_cast<ReadOnly*>(self)->inner.len;
}

PyBufferProcs readonly_buffer = {readonly_getbuffer, nullptr};
PySequenceMethods readonly_sequence = {readonly_length};

PyMethodDef readonly_functions[] = {
    {"read_only", read_only, METH_O,
     "read_only(buffer) -> memoryview: the bytes of a C-contiguous buffer, read-only, through\n"
     "a ReadOnly exporter that leads nowhere writable (memoryview.obj is the ReadOnly)."},
    {nullptr, nullptr, 0, nullptr}};
}  // namespace

int add_read_only(PyObject* module) {
  if (FileMapType.tp_name == nullptr) {
    FileMapType.tp_name = "evalue_store._native.FileMap";
    FileMapType.tp_doc =
        "FileMap(fd, size): a private mapping of size bytes of a file, exported read-only.";
    FileMapType.tp_basicsize = sizeof(FileMap);
    FileMapType.tp_flags = Py_TPFLAGS_DEFAULT;
    FileMapType.tp_new = filemap_new;
    FileMapType.tp_dealloc = filemap_dealloc;
    FileMapType.tp_as_buffer = &filemap_buffer;
    FileMapType.tp_as_sequence = &filemap_sequence;
    FileMapType.tp_methods = filemap_methods;
    FileMapType.tp_getset = filemap_getset;
    if (PyType_Ready(&FileMapType) < 0) return -1;
  }
  if (ReadOnlyType.tp_name == nullptr) {
    ReadOnlyType.tp_name = "evalue_store._native.ReadOnly";
    ReadOnlyType.tp_doc = "The bytes of a contiguous buffer, exported read-only (read_only).";
    ReadOnlyType.tp_basicsize = sizeof(ReadOnly);
    ReadOnlyType.tp_flags = Py_TPFLAGS_DEFAULT;
    ReadOnlyType.tp_dealloc = readonly_dealloc;
    ReadOnlyType.tp_as_buffer = &readonly_buffer;
    ReadOnlyType.tp_as_sequence = &readonly_sequence;
    if (PyType_Ready(&ReadOnlyType) < 0) return -1;
  }
  if (PyModule_AddObjectRef(module, "FileMap", reinterpret_cast<PyObject*>(&FileMapType)) < 0)
    return -1;
  if (PyModule_AddObjectRef(module, "ReadOnly", reinterpret_cast<PyObject*>(&ReadOnlyType)) < 0)
    return -1;
  return PyModule_AddFunctions(module, readonly_functions);
}

}  // namespace evalue_store_native
