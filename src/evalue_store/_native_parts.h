// The parts of evalue_store._native defined outside _native.cc, which adds them to the
// module when it is imported.
#pragma once
#include <Python.h>

// _native_mapped.cc: the type Mapped (ds[i] of a plain mapped file in one call).
int add_mapped_type(PyObject* module);
