// evs_dump: print a container as one canonical JSON document, for comparing this reader with
// the Python one (tests/test_cpp.py) and for looking at a file on a device.
//
//   evs_dump [--no-verify] [--max-records N] FILE...
//
// One line per file: {"open": "ok" | {"error": ...}, "commit": c, "records": n, "tail": bytes,
//  "aligned": bool, "checksum": "crc32" | "crc32c", "metadata": hex | {"error": ...},
//  "values": [[value, ...] | {"error": ...}, ...] (random access, record by record),
//  "scan": {"count": k, "error": ... | null}} (an in-order scan; k records before it stopped)
// A value: null, true/false, an integer, {"f64": hex of its 8 bytes}, {"str": hex} (text),
// {"bytes": hex}, a list of values, or a tensor {"dtype", "shape", "strides" (elements),
// "order", "hex" (the elements in row-major order)}.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "evalue_store/reader.h"

namespace evs = evalue_store;

namespace {

void hex(std::string* out, const uint8_t* p, uint64_t n) {
  static const char digits[] = "0123456789abcdef";
  for (uint64_t k = 0; k < n; ++k) {
    out->push_back(digits[p[k] >> 4]);
    out->push_back(digits[p[k] & 15]);
  }
}

void quoted(std::string* out, const std::string& s) {
  out->push_back('"');
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c < 0x20 || c >= 0x80) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);  // reasons are ASCII; keep it so
      *out += buf;
    } else {
      out->push_back(static_cast<char>(c));
    }
  }
  out->push_back('"');
}

void error(std::string* out, const evs::Error& e) {
  *out += "{\"error\": ";
  quoted(out, e.message());
  *out += "}";
}

// The elements of a tensor in row-major (logical) order, whatever its dim order.
void tensor_hex(std::string* out, const evs::TensorView& t) {
  const uint8_t* data = static_cast<const uint8_t*>(t.data);
  size_t item = evs::dtype_itemsize(t.dtype);
  if (t.numel == 0) return;
  if (!t.has_dim_order()) {
    hex(out, data, t.nbytes);
    return;
  }
  uint64_t index[evs::kMaxRank] = {0};
  uint64_t strides[evs::kMaxRank];
  for (int k = 0; k < t.rank; ++k) strides[k] = t.stride(k);
  for (uint64_t n = 0; n < t.numel; ++n) {
    uint64_t at = 0;
    for (int k = 0; k < t.rank; ++k) at += index[k] * strides[k];
    hex(out, data + at * item, item);
    for (int k = t.rank - 1; k >= 0; --k) {
      if (++index[k] < t.size(k)) break;
      index[k] = 0;
    }
  }
}

void value(std::string* out, const evs::Record& r, const evs::Value& v) {
  char buf[32];
  switch (v.kind) {
    case evs::Kind::kNone: *out += "null"; return;
    case evs::Kind::kBool: *out += v.b ? "true" : "false"; return;
    case evs::Kind::kInt:
      std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v.i));
      *out += buf;
      return;
    case evs::Kind::kDouble:
      *out += "{\"f64\": \"";
      hex(out, reinterpret_cast<const uint8_t*>(&v.d), 8);
      *out += "\"}";
      return;
    case evs::Kind::kString:
      *out += v.is_text ? "{\"str\": \"" : "{\"bytes\": \"";
      hex(out, v.bytes, v.count);
      *out += "\"}";
      return;
    case evs::Kind::kTensor: {
      const evs::TensorView& t = v.tensor;
      *out += "{\"dtype\": \"";
      *out += evs::dtype_name(t.dtype);
      *out += "\", \"shape\": [";
      for (int k = 0; k < t.rank; ++k) {
        std::snprintf(buf, sizeof buf, "%s%llu", k ? ", " : "",
                      static_cast<unsigned long long>(t.size(k)));
        *out += buf;
      }
      *out += "], \"strides\": [";
      for (int k = 0; k < t.rank; ++k) {
        std::snprintf(buf, sizeof buf, "%s%llu", k ? ", " : "",
                      static_cast<unsigned long long>(t.stride(k)));
        *out += buf;
      }
      *out += "], \"order\": [";
      for (int k = 0; k < t.rank; ++k) {
        std::snprintf(buf, sizeof buf, "%s%d", k ? ", " : "", t.dim_order(k));
        *out += buf;
      }
      *out += "], \"hex\": \"";
      tensor_hex(out, t);
      *out += "\"}";
      return;
    }
    case evs::Kind::kListBool: case evs::Kind::kListInt: case evs::Kind::kListDouble:
    case evs::Kind::kListTensor: case evs::Kind::kListOptionalTensor:
      *out += "[";
      for (uint64_t k = 0; k < v.count; ++k) {
        if (k) *out += ", ";
        if (v.kind == evs::Kind::kListBool) {
          *out += v.bool_at(k) ? "true" : "false";
        } else if (v.kind == evs::Kind::kListInt) {
          std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v.int_at(k)));
          *out += buf;
        } else if (v.kind == evs::Kind::kListDouble) {
          *out += "{\"f64\": \"";
          hex(out, v.bytes + 8 * k, 8);
          *out += "\"}";
        } else {
          value(out, r, r.item(v, k));
        }
      }
      *out += "]";
      return;
  }
}

void record(std::string* out, const evs::Record& r) {
  *out += "[";
  for (size_t k = 0; k < r.size(); ++k) {
    if (k) *out += ", ";
    value(out, r, r[k]);
  }
  *out += "]";
}

// One file's document (one line). Returns false when the file could not be read at all.
bool dump(const char* path, const evs::Options& options, uint64_t max_records, std::string* out) {
  evs::Reader reader;
  evs::Error e = evs::Reader::open_file(path, &reader, options);
  *out += "{\"open\": ";
  if (e) {
    error(out, e);
    *out += ", \"code\": " + std::to_string(static_cast<int>(e.code)) + "}\n";
    return e.code != evs::ErrorCode::kIo;
  }
  *out += "\"ok\", \"commit\": " + std::to_string(reader.commit_number());
  *out += ", \"records\": " + std::to_string(reader.record_count());
  *out += ", \"tail\": " + std::to_string(reader.uncommitted_bytes());
  *out += std::string(", \"aligned\": ") + (reader.aligned() ? "true" : "false");
  *out += std::string(", \"checksum\": ") +
          (reader.checksum() == evs::Checksum::kCrc32c ? "\"crc32c\"" : "\"crc32\"");
  *out += ", \"metadata\": ";
  std::string_view meta;
  e = reader.metadata(&meta);
  if (e) {
    error(out, e);
  } else {
    *out += "\"";
    hex(out, reinterpret_cast<const uint8_t*>(meta.data()), meta.size());
    *out += "\"";
  }
  *out += ", \"values\": [";
  evs::Record r;
  uint64_t n = reader.record_count() < max_records ? reader.record_count() : max_records;
  for (uint64_t i = 0; i < n; ++i) {
    if (i) *out += ", ";
    e = reader.read(i, &r);
    if (e) error(out, e);
    else record(out, r);
  }
  *out += "], \"scan\": {\"count\": ";
  evs::Scan scan(reader);
  while (scan.position() < n && scan.next(&r)) {
  }
  *out += std::to_string(scan.position()) + ", \"error\": ";
  if (scan.error()) error(out, scan.error());
  else *out += "null";
  *out += "}}\n";
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  evs::Options options;
  uint64_t max_records = 10000;
  int status = 0, files = 0;
  for (int k = 1; k < argc; ++k) {
    if (std::strcmp(argv[k], "--no-verify") == 0) {
      options.verify_checksums = false;
    } else if (std::strcmp(argv[k], "--max-records") == 0 && k + 1 < argc) {
      max_records = std::strtoull(argv[++k], nullptr, 10);
    } else {
      std::string out;
      if (!dump(argv[k], options, max_records, &out)) status = 2;
      std::fwrite(out.data(), 1, out.size(), stdout);
      ++files;
    }
  }
  if (files == 0) {
    std::fprintf(stderr, "usage: evs_dump [--no-verify] [--max-records N] FILE...\n");
    return 2;
  }
  return status;
}
