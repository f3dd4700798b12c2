"""A compressed file's dictionary, trained on its own first frames (docs/FRAMES.md
section 7 rule 5).

Small frames are what make a random read cheap (it decompresses the frame holding its
record), and alone they compress poorly: each carries its own entropy tables. A dictionary
trained on the file's first frames gives them shared tables and common content, which
makes them about as small as frames several times their size, and faster to decode. A new
file's writer holds its first frames back (``ZstdSink.hold``) until it has TRAIN_BYTES of
them or commits; ``choose_dictionary`` then trains on them and keeps the dictionary only if
it makes frames it was not trained on clearly smaller.
"""

from __future__ import annotations

from typing import Any

import zstandard

from .zframe import new_compressor

TRAIN_BYTES = 1 << 20  # logical bytes a new file's first frames are held back for, at most
MIN_FRAMES = 64  # fewer held frames than this: no dictionary (too little to learn from)
DICT_SIZE = 64 << 10  # at most
SEGMENTS = (2000, 16000)  # COVER segment sizes tried (d = 6); the better one is kept
MIN_GAIN = 0.98  # kept only if the held-out frames compress to at most this fraction


def train(samples: list[Any], size: int, segment: int, level: int) -> bytes | None:
    """A dictionary of at most ``size`` bytes trained on ``samples`` (fastCOVER, segments of
    ``segment`` bytes and dmers of 6; 0: zstd's own choice), or None if zstd finds too
    little to train on."""
    shape = {"k": segment, "d": 6} if segment else {}
    try:
        trained = zstandard.train_dictionary(size, samples, level=level, **shape)
    except zstandard.ZstdError:
        return None
    return trained.as_bytes()


def compressed_size(frames: list[Any], level: int, dictionary: bytes | None) -> int:
    data = zstandard.ZstdCompressionDict(dictionary) if dictionary else None
    cctx = new_compressor(level, data)
    return sum(len(cctx.compress(frame)) for frame in frames)


def best_dictionary(samples: list[Any], size: int, level: int) -> tuple[bytes | None, float]:
    """The best of the candidate dictionaries (one per entry of SEGMENTS, of at most
    ``size`` bytes: zstd makes them smaller when the samples are few) trained on the first
    three quarters of ``samples``, judged on the last quarter, and what it compresses
    those to as a fraction of what no dictionary does; (None, 1.0) if none could be
    trained."""
    cut = len(samples) * 3 // 4 if len(samples) >= 16 else len(samples)  # else judged on all
    learn, judge = samples[:cut], samples[cut:] or samples
    base = compressed_size(judge, level, None)
    best, best_size = None, base
    for segment in (*SEGMENTS, 0):  # zstd's own segments only if neither can be used
        if segment == 0 and best is not None:
            break
        candidate = train(learn, size, segment, level)
        if candidate is not None:
            got = compressed_size(judge, level, candidate)
            if best is None or got < best_size:
                best, best_size = candidate, got
    return best, best_size / max(base, 1)


def choose_dictionary(frames: list[Any], level: int) -> bytes | None:
    """The dictionary a new file whose first frames are ``frames`` is written with: the
    best candidate, if there are MIN_FRAMES frames to learn from and it makes the held-out
    ones at least 2% smaller; else None. Measured on W1 (docs/FRAMES.md section 7):
    one-record frames of 1,280 bytes then take 400 bytes each, not 436."""
    if len(frames) < MIN_FRAMES:
        return None
    dictionary, ratio = best_dictionary(frames, DICT_SIZE, level)
    return dictionary if ratio <= MIN_GAIN else None
