"""The compiled part of evalue_store: ``evalue_store._native`` (record checksums of many
byte ranges in one call), built from src/evalue_store/_native.cc and the C++ reader's
CRC code (cpp/src/crc.cc), so the Python and C++ readers share one implementation.
Everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "evalue_store._native",
            sources=[
                "src/evalue_store/_native.cc",
                "src/evalue_store/_native_mapped.cc",
                "src/evalue_store/_native_zstd.cc",
                "cpp/src/crc.cc",
            ],
            include_dirs=["cpp/include"],
            libraries=["zstd"],  # the system libzstd (libzstd-dev)
            language="c++",
            extra_compile_args=["-std=c++17", "-O2"],
        )
    ]
)
