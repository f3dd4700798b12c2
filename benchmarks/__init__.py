"""Benchmark harness comparing evalue_store with other record formats (see README.md here)."""
