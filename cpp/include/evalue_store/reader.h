// evalue_store C++ reader: a dependency-free C++17 reader of plain evalue_store containers
// (docs/FORMAT.md), for on-device training. Records come out as views over the file's
// mapping (or a caller's buffer): tensors are pointer + dtype + sizes + dim order, never
// copied, aligned as the file aligns them. Errors are values; nothing here throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace evalue_store {

// ----------------------------------------------------------------------------- errors

enum class ErrorCode : uint8_t {
  kOk = 0,
  kIo,          // the file could not be opened, sized or mapped
  kCompressed,  // a zstd container (docs/FRAMES.md): this reader reads plain files only
  kFormat,      // the bytes break a rule of docs/FORMAT.md (see reason and offset)
  kChecksum,    // a record or metadata checksum does not match
  kOutOfRange,  // a record number >= record_count (not a file error)
};

// Not an error when code == kOk. `offset` is the byte offset in the file the problem is at
// (or -1), `record` the record number (or -1).
struct Error {
  ErrorCode code = ErrorCode::kOk;
  int64_t offset = -1;
  int64_t record = -1;
  std::string reason;

  bool ok() const { return code == ErrorCode::kOk; }
  explicit operator bool() const { return code != ErrorCode::kOk; }  // true: failed
  std::string message() const;  // "reason (record R, offset O)"
};

// ----------------------------------------------------------------------------- values

// Value tags: ExecuTorch's Tag numbers (docs/FORMAT.md section 5).
enum class Kind : uint8_t {
  kNone = 0,
  kTensor = 1,
  kString = 2,
  kDouble = 3,
  kInt = 4,
  kBool = 5,
  kListBool = 6,
  kListDouble = 7,
  kListInt = 8,
  kListTensor = 9,
  kListOptionalTensor = 11,
};

// Tensor dtype codes: ExecuTorch's ScalarType numbers.
enum class Dtype : uint8_t {
  kUInt8 = 0,
  kInt8 = 1,
  kInt16 = 2,
  kInt32 = 3,
  kInt64 = 4,
  kFloat16 = 5,
  kFloat32 = 6,
  kFloat64 = 7,
  kComplex64 = 9,
  kComplex128 = 10,
  kBool = 11,
  kBFloat16 = 15,
  kUInt16 = 27,
  kUInt32 = 28,
  kUInt64 = 29,
};

size_t dtype_itemsize(Dtype dtype);       // 0 for a code outside the table
const char* dtype_name(Dtype dtype);      // numpy's name ("float32", "bfloat16"), or nullptr

constexpr int kMaxRank = 64;

inline uint64_t load_u64(const uint8_t* p) {  // little-endian, any alignment
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;  // the format is little-endian, like every machine it targets
}

// A tensor over the file's bytes. `data` is aligned to the file's alignment (64 unless the
// writer chose otherwise); dims and dim order are read from the record as they are stored.
struct TensorView {
  Dtype dtype;
  uint8_t rank;
  const uint8_t* dims_at;   // rank little-endian u64 (unaligned): use size(k)
  const uint8_t* order_at;  // rank bytes (a permutation), or nullptr: row-major
  const void* data;
  uint64_t numel;
  uint64_t nbytes;

  uint64_t size(int k) const { return load_u64(dims_at + 8 * k); }
  // Axis k of the memory order, outermost first (identity without a dim order).
  uint8_t dim_order(int k) const { return order_at ? order_at[k] : static_cast<uint8_t>(k); }
  bool has_dim_order() const { return order_at != nullptr; }
  // Stride of axis k in elements (docs/FORMAT.md section 5's dim-order rule).
  uint64_t stride(int k) const;
};

// One value of a record. Strings and scalar lists point into the file's bytes; list items
// of ListTensor/ListOptionalTensor are values of the record (Record::item).
struct Value {
  Kind kind = Kind::kNone;
  bool is_text = false;  // String: subtype 0 (valid UTF-8) rather than raw bytes
  bool b = false;        // Bool
  int64_t i = 0;         // Int
  double d = 0.0;        // Double
  const uint8_t* bytes = nullptr;  // String bytes, or a scalar list's packed items
  uint64_t count = 0;    // String length in bytes, or a list's item count
  uint64_t first_item = 0;  // ListTensor / ListOptionalTensor: index of item 0 in Record
  TensorView tensor{};   // Tensor

  std::string_view str() const {
    return {reinterpret_cast<const char*>(bytes), static_cast<size_t>(count)};
  }
  // Scalar list items (ListInt, ListDouble, ListBool), read from their packed bytes.
  int64_t int_at(uint64_t k) const;
  double double_at(uint64_t k) const;
  bool bool_at(uint64_t k) const { return bytes[k] != 0; }
};

// The values of one record. Reuse one Record across reads: its vectors keep their capacity,
// so steady-state reading allocates nothing.
class Record {
 public:
  size_t size() const { return values_.size(); }
  const Value& operator[](size_t k) const { return values_[k]; }
  // Item k of a ListTensor / ListOptionalTensor value (a Tensor, or None for a missing one).
  const Value& item(const Value& list, uint64_t k) const { return items_[list.first_item + k]; }
  void clear() {
    values_.clear();
    items_.clear();
  }

 private:
  friend class Decoder;
  std::vector<Value> values_;
  std::vector<Value> items_;
};

// ----------------------------------------------------------------------------- reader

struct Options {
  // docs/FORMAT.md section 10 step 4: check each record's payload checksum on every read.
  // Off hands out big tensors without touching their pages.
  bool verify_checksums = true;
};

enum class Checksum : uint8_t { kCrc32, kCrc32c };  // zlib CRC-32 (1.0) / CRC-32C (flag 0x1)

// A container opened at its last commit. Movable, not copyable; owns its mapping (if any).
// Reading is const and thread-safe: each thread uses its own Record.
class Reader {
 public:
  Reader() = default;
  ~Reader();
  Reader(Reader&& other) noexcept;
  Reader& operator=(Reader&& other) noexcept;
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  // Map the file at `path` read-only (mmap); the mapping lives as long as the Reader.
  static Error open_file(const char* path, Reader* out, Options options = {});
  // Read from `size` bytes at `data` (an Android asset, a buffer the app filled). The buffer
  // must outlive the Reader and every view handed out; it is never written.
  static Error open_buffer(const void* data, size_t size, Reader* out, Options options = {});

  uint64_t record_count() const { return record_count_; }
  uint64_t commit_number() const { return commit_; }
  uint32_t alignment() const { return alignment_; }
  uint16_t minor_version() const { return minor_; }
  Checksum checksum() const { return checksum_; }
  uint64_t committed_end() const { return end_; }  // end of the last footer
  // True when the bytes start at a multiple of alignment(), so that every tensor's data is
  // aligned in memory as it is in the file (always so for open_file: mappings are
  // page-aligned; a caller's buffer may not be, e.g. an APK asset is 4-byte aligned).
  bool aligned() const { return reinterpret_cast<uintptr_t>(data_) % alignment_ == 0; }
  uint64_t uncommitted_bytes() const { return size_ - end_; }  // a tail (crash, live writer)

  // Record i, random access: the index entry, frame, checksum and full decode are checked.
  Error read(uint64_t i, Record* out) const;
  // The payload of record i as stored (frame and checksum checked; values not decoded).
  Error raw(uint64_t i, const uint8_t** payload, uint64_t* length) const;
  // The metadata JSON text, checked (checksum, UTF-8, strict JSON object); "{}" when the
  // file has none. The view points into the file's bytes (or a static "{}").
  Error metadata(std::string_view* json) const;

  struct Source;  // internal: pread or a buffer, how the header and footers are read at open

 private:
  friend class Scan;
  Error locate(Source& src, uint64_t size, Options options);
  Error entry(uint64_t i, uint64_t* offset, uint64_t* length, uint32_t* crc) const;
  Error frame(uint64_t offset, uint64_t length, uint32_t want) const;
  Error read_at(uint64_t i, uint64_t offset, uint64_t length, uint32_t crc, Record* out) const;
  uint32_t crc(const uint8_t* data, uint64_t n) const;
  void release();

  struct Segment {
    uint64_t offset, count, first;
  };
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  void* map_ = nullptr;  // the mmap'ed region, when open_file made it
  size_t map_size_ = 0;
  Options options_;
  uint32_t alignment_ = 0;
  uint16_t minor_ = 0;
  Checksum checksum_ = Checksum::kCrc32;
  uint8_t file_id_[16] = {};
  uint64_t data_start_ = 0;
  uint64_t end_ = 0;
  uint64_t commit_ = 0;
  uint64_t record_count_ = 0;
  uint64_t metadata_offset_ = 0, metadata_length_ = 0;
  uint32_t metadata_crc_ = 0;
  std::vector<Segment> segments_;  // at most 4096: the footer's own bytes bound them
};

// Every record in order (docs/FORMAT.md section 10's in-order rule: a record whose frame
// starts before an earlier one ends is refused, naming it). next() returns false at the end
// or at the first error (then error() says which); the scan does not go on after an error.
class Scan {
 public:
  explicit Scan(const Reader& reader) : reader_(reader) {}
  bool next(Record* out);
  uint64_t position() const { return next_; }  // records handed out so far
  const Error& error() const { return error_; }

 private:
  const Reader& reader_;
  uint64_t next_ = 0;
  uint64_t reach_ = 0;  // the furthest end of a frame inside the committed range so far
  Error error_;
};

// ----------------------------------------------------------------------------- checksums

uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);   // zlib's
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);  // Castagnoli
uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc = 0);  // table-driven
uint32_t crc32_portable(const void* data, size_t n, uint32_t crc = 0);   // table-driven
bool crc32c_hardware();  // true when crc32c uses the CPU's instructions

// Strict JSON check of docs/FORMAT.md section 7 (metadata); empty string when it passes.
std::string check_metadata_json(std::string_view text);

}  // namespace evalue_store
