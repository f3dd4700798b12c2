"""The compiled part of evalue_store: ``evalue_store._native`` (record checksums of many
byte ranges in one call, the record readers of a mapped file and of compressed frames),
built from src/evalue_store/_native*.cc and the C++ reader's CRC code (cpp/src/crc.cc), so
the Python and C++ readers share one implementation. It uses numpy's C API (its headers
come with the numpy that pip installs for the build) and the system libzstd. Everything
else is in pyproject.toml."""

import glob

import numpy
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "evalue_store._native",
            sources=[
                "src/evalue_store/_native.cc",
                "src/evalue_store/_native_mapped.cc",
                "src/evalue_store/_native_layout.cc",
                "src/evalue_store/_native_batch.cc",
                "src/evalue_store/_native_zstd.cc",
                "src/evalue_store/_native_zstd_frame.cc",
                "src/evalue_store/_native_zstd_checks.cc",
                "src/evalue_store/_native_gather.cc",
                "src/evalue_store/_native_readonly.cc",
                "cpp/src/crc.cc",
            ],
            depends=sorted(glob.glob("src/evalue_store/_native*.h")),  # rebuilt when one changes
            include_dirs=["cpp/include", numpy.get_include()],
            libraries=["zstd"],  # the system libzstd (libzstd-dev)
            language="c++",
            extra_compile_args=["-std=c++17", "-O2"],
        )
    ]
)
