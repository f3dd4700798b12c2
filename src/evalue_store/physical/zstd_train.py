"""A compressed file's dictionary, trained on its own first frames (docs/FRAMES.md
section 7 rule 5).

Small frames are what make a random read cheap (it decompresses the frame holding its
record), and alone they compress poorly: each carries its own entropy tables. A dictionary
trained on the file's first frames gives them shared tables and common content, which
makes them about as small as frames several times their size, and faster to decode. A new
file's writer holds its first frames back (``ZstdSink.hold``) until it has TRAIN_BYTES of
them or commits; ``choose_dictionary`` then trains on them and keeps the dictionary only if
it makes frames it was not trained on clearly smaller. A commit before TRAIN_BYTES (closing
the writer commits) may be the file's last: the dictionary may then serve those frames
alone, so it is kept only if the file, the dictionary's own bytes counted, comes out
clearly smaller.
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
# Sizes tried at a commit before TRAIN_BYTES. Measured on W1 (400 records, 195 KB
# compressed without a dictionary): 4 KiB 0.864x of that with the dictionary counted, 16 KiB
# 0.894x, 64 KiB 1.085x (the 64 KiB one compresses the frames best, 0.855x, but is a third
# of what it saves on them).
COMMIT_SIZES = (4 << 10, 16 << 10, DICT_SIZE)


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


def choose_dictionary(
    frames: list[Any], level: int, at_commit: bool = False, offered: bytes | None = None
) -> bytes | None:
    """The dictionary a new file whose first frames are ``frames`` is written with: the
    best candidate, if there are MIN_FRAMES frames to learn from and it makes the held-out
    ones at least 2% smaller; else None. Measured on W1 (docs/FRAMES.md section 7):
    one-record frames of 1,280 bytes then take 400 bytes each, not 436. ``at_commit``: a
    commit needs the frames before TRAIN_BYTES of them were held (``smallest_file``).
    ``offered`` (a finished shard's, for the next shards of its job): that one instead of
    any training, under the same rule (``offered_pays``)."""
    if offered is not None:
        return offered if offered_pays(frames, level, at_commit, offered) else None
    if len(frames) < MIN_FRAMES:
        return None
    if at_commit:
        return smallest_file(frames, level)
    dictionary, ratio = best_dictionary(frames, DICT_SIZE, level)
    return dictionary if ratio <= MIN_GAIN else None


def smallest_file(frames: list[Any], level: int) -> bytes | None:
    """For a file that may end with ``frames`` (a commit is often a writer's last): of the
    dictionaries trained on them all, one of each size in COMMIT_SIZES and segment in
    SEGMENTS, the one that makes the file smallest, its own bytes counted, if that is at
    least 2% smaller than without a dictionary; else None. (A 64 KiB dictionary made a file
    of 64 W1 records 2.2 times the size it has without one.)"""
    best, best_size = None, MIN_GAIN * compressed_size(frames, level, None)
    for size in COMMIT_SIZES:
        for segment in SEGMENTS:
            candidate = train(frames, size, segment, level)
            if candidate is not None:
                got = len(candidate) + compressed_size(frames, level, candidate)
                if got <= best_size:
                    best, best_size = candidate, got
    return best


def offered_pays(frames: list[Any], level: int, at_commit: bool, offered: bytes) -> bool:
    """Whether ``offered`` makes ``frames`` at least 2% smaller than no dictionary, its own
    bytes counted ``at_commit`` (the file may end there). A shared 64 KiB dictionary made a
    last shard of one W1 record 58 times the size it has without one."""
    cost = compressed_size(frames, level, offered) + (len(offered) if at_commit else 0)
    return cost <= MIN_GAIN * compressed_size(frames, level, None)
