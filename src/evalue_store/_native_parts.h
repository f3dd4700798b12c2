// The parts of evalue_store._native defined outside _native.cc, which adds them to the
// module when it is imported. Each returns -1 with a Python error set on failure.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

// _native_mapped.cc: the type Mapped (ds[i] of a plain mapped file in one call).
int add_mapped_type(PyObject* module);

// _native_batch.cc: the type BatchPlan (get_batch's records of one layout, one pass each).
int add_batch_type(PyObject* module);

namespace evalue_store_native {

// _native_zstd.cc: the ZstdGet and ZstdFrame types (ds[i] of a compressed file's frame).
int add_zstd(PyObject* module);

}  // namespace evalue_store_native
