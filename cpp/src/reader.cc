// The container layer of docs/FORMAT.md: header (section 3), finding the last commit
// (sections 8-9), index entries and frames (section 10), metadata (section 7).
#include "evalue_store/reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "internal.h"

namespace evalue_store {

namespace {

constexpr uint8_t kMagic[8] = {0x89, 'E', 'V', 'S', '\r', '\n', 0x1A, '\n'};
constexpr uint8_t kZstdMagic[4] = {0x28, 0xB5, 0x2F, 0xFD};
constexpr uint8_t kDictMagic[4] = {0x5D, 0x2A, 0x4D, 0x18};  // our dictionary frame
constexpr uint32_t kFlagCrc32c = 0x1;  // format 1.1: every checksum is CRC-32C
constexpr uint32_t kKnownFlags = kFlagCrc32c;
constexpr uint64_t kHeaderFixed = 50;  // fields before the writer info
constexpr uint64_t kMaxWriterInfo = 1024;
constexpr uint64_t kFrameSize = 16;    // magic, payload crc, payload length
constexpr uint64_t kEntrySize = 24;    // offset, length, crc, reserved
constexpr uint64_t kFooterFixed = 72;  // fields before the segments
constexpr uint64_t kSegmentSize = 24;  // offset, count, crc, level
constexpr uint64_t kTrailerSize = 24;  // footer offset, footer length, crc, end magic
constexpr uint64_t kTrailerUnchecked = 12;  // the footer crc and end magic
constexpr uint64_t kMaxSegments = 4096;
constexpr uint64_t kMaxFooter = kFooterFixed + kMaxSegments * kSegmentSize + kTrailerSize;
constexpr uint64_t kMaxMetadata = 64ull << 20;
const char kFooterMagic[] = "EVSFOOT1";
const char kTrailerMagic[] = "EVSEND01";
const char kFrameMagic[] = "EVR1";

uint16_t u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
uint32_t u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

Error fail(ErrorCode code, int64_t offset, std::string reason, int64_t record = -1) {
  Error e;
  e.code = code;
  e.offset = offset;
  e.record = record;
  e.reason = std::move(reason);
  return e;
}
Error format(uint64_t offset, std::string reason) {
  return fail(ErrorCode::kFormat, static_cast<int64_t>(offset), std::move(reason));
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }

struct Footer {
  uint64_t offset, end, number, record_count, prev, meta_offset, meta_length;
  uint32_t meta_crc;
  uint32_t n_segments;
};

}  // namespace

std::string Error::message() const {
  std::string m = reason;
  if (record >= 0 || offset >= 0) {
    m += " (";
    if (record >= 0) m += "record " + std::to_string(record);
    if (record >= 0 && offset >= 0) m += ", ";
    if (offset >= 0) m += "offset " + std::to_string(offset);
    m += ")";
  }
  return m;
}

Reader::~Reader() { release(); }

Reader::Reader(Reader&& other) noexcept { *this = std::move(other); }

Reader& Reader::operator=(Reader&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    size_ = other.size_;
    std::memcpy(file_id_, other.file_id_, 16);
    map_ = std::exchange(other.map_, nullptr);
    map_size_ = other.map_size_;
    options_ = other.options_;
    alignment_ = other.alignment_;
    minor_ = other.minor_;
    checksum_ = other.checksum_;
    data_start_ = other.data_start_;
    end_ = other.end_;
    commit_ = other.commit_;
    record_count_ = other.record_count_;
    metadata_offset_ = other.metadata_offset_;
    metadata_length_ = other.metadata_length_;
    metadata_crc_ = other.metadata_crc_;
    segments_ = std::move(other.segments_);
    other.data_ = nullptr;
    other.size_ = other.end_ = other.record_count_ = 0;
  }
  return *this;
}

void Reader::release() {
  if (map_ != nullptr) munmap(map_, map_size_);
  map_ = nullptr;
  data_ = nullptr;
}

uint32_t Reader::crc(const uint8_t* data, uint64_t n) const {
  return checksum_ == Checksum::kCrc32c ? crc32c(data, n) : crc32(data, n);
}

// Where the header and footers are read from while a file is opened: the tail search must
// not touch a mapping of the tail, which a writer may cut meanwhile (an abort, a recovery:
// FORMAT.md §11 rule 5 allows it above the last commit), so a file is read with pread and
// only its committed bytes are mapped afterwards.
struct Reader::Source {
  virtual ~Source() = default;
  virtual bool read(uint64_t offset, size_t n, uint8_t* out) = 0;  // false: not there
};

namespace {

struct BufferSource : Reader::Source {
  BufferSource(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}
  bool read(uint64_t offset, size_t n, uint8_t* out) override {
    if (offset > size_ || n > size_ - offset) return false;
    if (n) std::memcpy(out, data_ + offset, n);
    return true;
  }
  const uint8_t* data_;
  uint64_t size_;
};

struct FileSource : Reader::Source {
  explicit FileSource(int fd) : fd_(fd) {}
  bool read(uint64_t offset, size_t n, uint8_t* out) override {
    while (n) {
      ssize_t got = ::pread(fd_, out, n, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return false;
      out += got;
      offset += static_cast<uint64_t>(got);
      n -= static_cast<size_t>(got);
    }
    return true;
  }
  int fd_;
};

constexpr uint64_t kSearchChunk = 1 << 20;  // tail bytes read at a time by the search

}  // namespace

Error Reader::open_file(const char* path, Reader* out, Options options) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; only regular files are read.
  int fd = ::open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return fail(ErrorCode::kIo, -1, std::string(path) + ": " + std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail(ErrorCode::kIo, -1, std::string(path) + ": not a regular file");
  }
  Reader reader;
  FileSource source(fd);
  Error e = reader.locate(source, static_cast<uint64_t>(st.st_size), options);
  if (!e) {  // map the committed bytes only: reads never go past them
    void* map = mmap(nullptr, static_cast<size_t>(reader.end_), PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      e = fail(ErrorCode::kIo, -1, std::string(path) + ": mmap: " + std::strerror(errno));
    } else {
      reader.map_ = map;
      reader.map_size_ = static_cast<size_t>(reader.end_);
      reader.data_ = static_cast<const uint8_t*>(map);
    }
  }
  ::close(fd);
  if (e) return e;
  *out = std::move(reader);
  return {};
}

Error Reader::open_buffer(const void* data, size_t size, Reader* out, Options options) {
  Reader reader;
  BufferSource source(static_cast<const uint8_t*>(data), size);
  Error e = reader.locate(source, size, options);
  if (e) return e;
  reader.data_ = static_cast<const uint8_t*>(data);
  *out = std::move(reader);
  return {};
}

// Section 3: the header, then section 9: the last commit.
Error Reader::locate(Source& src, uint64_t size, Options options) {
  size_ = size;
  options_ = options;
  const Error gone = fail(ErrorCode::kIo, -1, "the file shrank while it was opened (a writer "
                                              "cut its uncommitted tail): open it again");
  if (size == 0) return format(0, "empty file, not an evalue_store container");
  uint8_t head[kHeaderFixed];
  size_t got = static_cast<size_t>(std::min<uint64_t>(size, kHeaderFixed));
  if (!src.read(0, got, head)) return gone;
  // Layout 2 starts with its layout frame, a zstd skippable frame (magic 0x184D2A5?, the
  // dictionary frame of layout 1 among them); layout 1 may also start with a data frame.
  const bool skippable =
      got >= 4 && (head[0] & 0xF0) == 0x50 && std::memcmp(head + 1, kDictMagic + 1, 3) == 0;
  if (got >= 4 && (std::memcmp(head, kZstdMagic, 4) == 0 || skippable))
    return fail(ErrorCode::kCompressed, 0,
                "a zstd-compressed container: this reader reads plain files only "
                "(decompress it with `evalue-store decompress FILE -o OUT`, or with stock "
                "`zstd -d`, given `-D` and the dictionary `evalue-store dictionary` "
                "extracts when the file has one)");
  if (got < 8 || std::memcmp(head, kMagic, 8) != 0)
    return format(0, "bad magic: not an evalue_store container");
  if (got < kHeaderFixed) return format(size, "truncated header");
  uint16_t major = u16(head + 8);
  minor_ = u16(head + 10);
  uint32_t flags = u32(head + 12);
  alignment_ = u32(head + 16);
  uint32_t length = u32(head + 20);
  uint16_t wlen = u16(head + 48);
  std::memcpy(file_id_, head + 24, 16);
  if (major != 1)
    return format(8, "unsupported format version " + std::to_string(major) + "." +
                         std::to_string(minor_) + " (reader knows 1.x)");
  if (flags & ~kKnownFlags) return format(12, "unknown header flags " + std::to_string(flags));
  checksum_ = (flags & kFlagCrc32c) ? Checksum::kCrc32c : Checksum::kCrc32;
  if (alignment_ < 8 || alignment_ > 65536 || (alignment_ & (alignment_ - 1)))
    return format(16, "alignment " + std::to_string(alignment_) +
                          " is not a power of two in [8, 65536]");
  if (wlen > kMaxWriterInfo || length != kHeaderFixed + wlen + 4)
    return format(20, "header length disagrees with the writer info length");
  data_start_ = align_up(length, alignment_);
  if (size < data_start_) return format(size, "truncated header");
  std::vector<uint8_t> buf(length);  // at most 1078 bytes
  if (!src.read(0, length, buf.data())) return gone;
  if (crc(buf.data(), length - 4) != u32(buf.data() + length - 4))
    return format(length - 4, "header checksum mismatch");

  // A cleanly closed file ends with its footer; else search back over trailer magics.
  Footer found{};
  bool ok = false;
  Error e;
  auto candidate = [&](uint64_t trailer_end, uint64_t* hashed) -> bool {
    // Fields that cost no hashing first (the trailer's, then the footer's magic, file id
    // and segment count), the checksum last. True: stop searching (found, or an error).
    if (trailer_end < kTrailerSize || trailer_end - kTrailerSize < data_start_) return false;
    uint8_t t[kTrailerSize], f[kFooterFixed];
    if (!src.read(trailer_end - kTrailerSize, kTrailerSize, t)) return e = gone, true;
    uint64_t offset = load_u64(t);
    uint64_t flen = u32(t + 8);
    if (std::memcmp(t + 16, kTrailerMagic, 8) != 0 || offset % alignment_ || offset < data_start_)
      return false;
    if (flen < kFooterFixed + kTrailerSize || offset > trailer_end || trailer_end - offset != flen)
      return false;
    uint64_t n = (flen - kFooterFixed - kTrailerSize) / kSegmentSize;
    if (n > kMaxSegments || kFooterFixed + kTrailerSize + n * kSegmentSize != flen) return false;
    if (!src.read(offset, kFooterFixed, f)) return e = gone, true;
    if (std::memcmp(f, kFooterMagic, 8) != 0 || std::memcmp(f + 8, file_id_, 16) != 0 ||
        u32(f + 68) != n)
      return false;
    if (hashed != nullptr) {
      *hashed += flen;
      if (*hashed > 2 * (size_ - trailer_end) + 2 * kMaxFooter) {
        e = format(trailer_end, "no valid commit found after checksumming " +
                                    std::to_string(*hashed) +
                                    " bytes of candidate footers (a hostile tail?)");
        return true;
      }
    }
    buf.resize(flen);  // at most kMaxFooter: n <= 4096 was checked
    if (!src.read(offset, flen, buf.data())) return e = gone, true;
    if (crc(buf.data(), flen - kTrailerUnchecked) != u32(t + 12)) return false;
    found = Footer{offset, trailer_end, load_u64(f + 24), load_u64(f + 32), load_u64(f + 40),
                   load_u64(f + 48), load_u64(f + 56), u32(f + 64), static_cast<uint32_t>(n)};
    ok = true;
    return true;
  };
  if (!candidate(size, nullptr)) {
    uint64_t hashed = 0;
    std::vector<uint8_t> chunk;
    uint64_t hi = size;
    while (!ok && !e && hi >= data_start_ + 8) {
      uint64_t lo = hi - data_start_ > kSearchChunk ? hi - kSearchChunk : data_start_;
      chunk.resize(hi - lo);
      if (!src.read(lo, chunk.size(), chunk.data())) return gone;
      // every end of an end magic in [lo + 8, hi], from the end of the file backwards
      for (uint64_t at = hi; at >= lo + 8; --at) {
        const uint8_t* p = chunk.data() + (at - lo);
        if (at == size || p[-1] != '1' || std::memcmp(p - 8, kTrailerMagic, 8) != 0) continue;
        if (candidate(at, &hashed)) break;
      }
      if (lo == data_start_) break;
      hi = lo + 7;  // a magic cut by the chunk boundary is found in the next chunk
    }
  }
  if (e) return e;
  if (!ok) {  // no commit: zero records, everything after the header is tail
    end_ = data_start_;
    return {};
  }

  // A checksum-valid footer with impossible contents is refused, never skipped.
  const uint64_t where = found.offset;
  const uint8_t* segs = buf.data() + kFooterFixed;  // the footer's bytes, read last
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  spans.reserve(found.n_segments);
  uint64_t total = 0;
  for (uint32_t k = 0; k < found.n_segments; ++k) {
    uint64_t offset = load_u64(segs + k * kSegmentSize);
    uint64_t count = load_u64(segs + k * kSegmentSize + 8);
    if (offset % alignment_ || offset < data_start_)
      return format(where, "index segment " + std::to_string(k) + " at a bad offset");
    if (count == 0 || offset > found.offset || count > (found.offset - offset) / kEntrySize)
      return format(where, "index segment " + std::to_string(k) + " overruns the footer");
    segments_.push_back(Segment{offset, count, total});
    total += count;  // no overflow: each count is below the file size / 24
    spans.emplace_back(offset, offset + count * kEntrySize);
  }
  if (total != found.record_count)
    return format(where, "footer counts " + std::to_string(found.record_count) +
                             " records but its segments hold " + std::to_string(total));
  std::sort(spans.begin(), spans.end());
  for (size_t k = 1; k < spans.size(); ++k)
    if (spans[k].first < spans[k - 1].second) return format(where, "index segments overlap");
  if (found.meta_length) {
    if (found.meta_length > kMaxMetadata || found.meta_offset < data_start_)
      return format(where, "metadata block out of bounds");
    if (found.meta_offset > found.offset || found.meta_length > found.offset - found.meta_offset)
      return format(where, "metadata block overruns the footer");
  } else if (found.meta_offset || found.meta_crc) {
    return format(where, "no metadata (length 0) but a metadata offset or checksum");
  }
  if (found.prev >= found.offset) return format(where, "previous footer does not precede this one");
  if (found.number == 0 || (found.number == 1) != (found.prev == 0))
    return format(where, "commit numbering broken: only commit 1 has no previous footer");
  end_ = found.end;
  commit_ = found.number;
  record_count_ = found.record_count;
  metadata_offset_ = found.meta_offset;
  metadata_length_ = found.meta_length;
  metadata_crc_ = found.meta_crc;
  return {};
}

Error Reader::metadata(std::string_view* json) const {
  if (metadata_length_ == 0) {
    *json = "{}";
    return {};
  }
  const uint8_t* p = data_ + metadata_offset_;
  if (crc(p, metadata_length_) != metadata_crc_)
    return fail(ErrorCode::kChecksum, static_cast<int64_t>(metadata_offset_),
                "metadata checksum mismatch");
  std::string_view text(reinterpret_cast<const char*>(p), metadata_length_);
  std::string problem = check_metadata_json(text);
  if (!problem.empty()) return format(metadata_offset_, problem);
  *json = text;
  return {};
}

// Section 10 steps 1-2: the index entry of record i.
Error Reader::entry(uint64_t i, uint64_t* offset, uint64_t* length, uint32_t* crc) const {
  if (i >= record_count_)
    return fail(ErrorCode::kOutOfRange, -1,
                "record " + std::to_string(i) + " out of range (" +
                    std::to_string(record_count_) + " records)");
  auto seg = std::upper_bound(segments_.begin(), segments_.end(), i,
                              [](uint64_t v, const Segment& s) { return v < s.first; }) - 1;
  uint64_t at = seg->offset + (i - seg->first) * kEntrySize;
  const uint8_t* e = data_ + at;
  *offset = load_u64(e);
  *length = load_u64(e + 8);
  *crc = u32(e + 16);
  if (u32(e + 20) != 0)
    return fail(ErrorCode::kFormat, static_cast<int64_t>(at), "index entry has reserved bits set",
                static_cast<int64_t>(i));
  return {};
}

// Section 10 steps 2-4: where the frame may be, that it agrees with its entry, its checksum.
Error Reader::frame(uint64_t offset, uint64_t length, uint32_t want) const {
  if (offset % alignment_ || offset < data_start_) return format(offset, "bad record offset");
  if (offset > end_ || end_ - offset < kFrameSize || length > end_ - offset - kFrameSize)
    return format(offset, "record runs past the committed end");
  const uint8_t* f = data_ + offset;
  if (std::memcmp(f, kFrameMagic, 4) != 0)
    return format(offset, "no record frame here (bad frame magic)");
  if (load_u64(f + 8) != length || u32(f + 4) != want)
    return format(offset, "record frame disagrees with its index entry");
  if (options_.verify_checksums && crc(f + kFrameSize, length) != want)
    return fail(ErrorCode::kChecksum, static_cast<int64_t>(offset), "record checksum mismatch");
  return {};
}

Error Reader::raw(uint64_t i, const uint8_t** payload, uint64_t* length) const {
  uint64_t offset;
  uint32_t want;
  Error e = entry(i, &offset, length, &want);
  if (!e) e = frame(offset, *length, want);
  if (e) {
    e.record = static_cast<int64_t>(i);
    return e;
  }
  *payload = data_ + offset + kFrameSize;
  return {};
}

Error Reader::read_at(uint64_t i, uint64_t offset, uint64_t length, uint32_t want,
                      Record* out) const {
  Error e = frame(offset, length, want);
  if (!e) e = internal::decode_record(data_, offset, length, alignment_, out);
  if (e) e.record = static_cast<int64_t>(i);
  return e;
}

Error Reader::read(uint64_t i, Record* out) const {
  uint64_t offset, length;
  uint32_t want;
  Error e = entry(i, &offset, &length, &want);
  if (e) return e;
  return read_at(i, offset, length, want, out);
}

bool Scan::next(Record* out) {
  if (!error_.ok() || next_ >= reader_.record_count_) return false;
  uint64_t i = next_;
  uint64_t offset, length;
  uint32_t want;
  error_ = reader_.entry(i, &offset, &length, &want);
  // Only a frame inside the committed range can shadow a later one (section 10).
  uint64_t end = reader_.end_;
  bool inside = offset >= reader_.data_start_ && offset <= end && end - offset >= kFrameSize &&
                length <= end - offset - kFrameSize;
  if (inside && offset < reach_) {
    error_ = fail(ErrorCode::kFormat, static_cast<int64_t>(offset),
                  "starts before an earlier record's frame ends (frames must be in file order)",
                  static_cast<int64_t>(i));
    return false;
  }
  if (inside) reach_ = std::max(reach_, offset + kFrameSize + length);
  if (error_) return false;
  error_ = reader_.read_at(i, offset, length, want, out);
  if (error_) return false;
  ++next_;
  return true;
}

}  // namespace evalue_store
