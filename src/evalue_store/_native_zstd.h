// evalue_store._native's compressed-file lookup (_native_zstd.cc): the ZstdGet type.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace evalue_store_native {

// Adds the ZstdGet and ZstdFrame types to ``module``; -1 with a Python error set on failure.
int add_zstd(PyObject* module);

}  // namespace evalue_store_native
