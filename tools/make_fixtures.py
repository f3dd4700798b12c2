"""Write the fixture files that tests/test_fixtures.py reads: the same records as format 1.0
(CRC-32 checksums) and as format 1.1 (CRC-32C), plain and compressed.

The fixtures are committed: if a change to the code stops reading them, the format changed
and docs/FORMAT.md's version rules apply. This writes only the fixtures that are missing
(a committed one is never rewritten: its bytes are what old writers wrote):
    python tools/make_fixtures.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

import evalue_store as evs

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(ROOT))
from tests.test_fixtures import describe  # noqa: E402  (one definition, shared with the test)


def records() -> list[list]:
    """Every kind and dtype once, plus a channels-last tensor and a multi-commit history."""
    dtypes = [
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
        "bool",
        "uint16",
        "uint32",
        "uint64",
    ]
    out = [[np.arange(6).astype(dt).reshape(2, 3) for dt in dtypes]]
    out.append([evs.float32_to_bfloat16(np.array([1.0, -2.5, np.inf], np.float32))])
    out.append(
        [
            None,
            True,
            False,
            -(2**63),
            2**63 - 1,
            1.5,
            float("-inf"),
            "héllo\x00🙂",
            b"\x00\xff",
            [True, False],
            [1, -2],
            [0.5],
            [np.zeros(0, np.int32)],
            [None, np.ones((), np.float64)],
            [],
        ]
    )
    nchw = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    out.append([np.ascontiguousarray(nchw.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)])
    out += [[np.full(i, i, np.int64), f"rec-{i}", i] for i in range(20)]
    return out


VERSIONS = ("1.0", "1.1")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    recs = records()
    written = []
    for version in VERSIONS:
        for name, options in (
            (f"plain-v{version}.evs", {}),
            (f"zstd-v{version}.evs.zst", {"compression": "zstd", "frame_size": 4096}),
        ):
            path = OUT / name
            if path.exists():
                continue
            with evs.Writer(
                path, "x", metadata={"fixture": name}, format_version=version, **options
            ) as w:
                w.extend(recs[:4])
                w.commit()
                w.extend(recs[4:])
            written.append(name)
        path = OUT / f"expected-v{version}.json"
        if not path.exists():
            expected = [[describe(v) for v in record] for record in recs]
            path.write_text(json.dumps(expected, indent=1, ensure_ascii=False))
            written.append(path.name)
    print(f"wrote {', '.join(written) or 'nothing (every fixture exists)'} in {OUT}")


if __name__ == "__main__":
    main()
