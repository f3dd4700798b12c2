// The metadata check of docs/FORMAT.md section 7: UTF-8 text holding one strict JSON object
// (RFC 8259; no NaN or Infinity, no number beyond a double, no lone surrogate escape).
#include <cmath>
#include <cstdlib>
#include <string>

#include "evalue_store/reader.h"
#include "internal.h"

namespace evalue_store {
namespace internal {

bool valid_utf8(const uint8_t* p, size_t n, size_t* bad) {
  size_t i = 0;
  while (i < n) {
    uint8_t c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // past U+10FFFF
    } else {
      *bad = i;
      return false;
    }
    if (n - i < len || p[i + 1] < lo || p[i + 1] > hi) {
      *bad = i;
      return false;
    }
    for (size_t k = 2; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) {
        *bad = i;
        return false;
      }
    }
    i += len;
  }
  return true;
}

}  // namespace internal

namespace {

// Nesting bound of docs/FORMAT.md section 7: arrays and objects nest at most 512 deep, the
// top object counting 1 (depth below is the number of containers around a value).
constexpr int kMaxDepth = 512;

class Json {
 public:
  explicit Json(std::string_view s) : s_(s) {}

  std::string check() {
    space();
    if (pos_ >= s_.size() || s_[pos_] != '{') return fail("metadata is not a JSON object");
    if (!value(0)) return error_;
    space();
    if (pos_ != s_.size()) return fail("extra data after the JSON object");
    return {};
  }

 private:
  std::string fail(const char* what) {
    if (error_.empty()) error_ = std::string(what) + " at byte " + std::to_string(pos_);
    return error_;
  }
  bool bad(const char* what) {
    fail(what);
    return false;
  }
  void space() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  bool literal(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (s_.compare(pos_, n, word) != 0) return bad("metadata is not JSON");
    pos_ += n;
    return true;
  }

  bool value(int depth) {
    space();
    if (pos_ >= s_.size()) return bad("metadata is not JSON (ends early)");
    char c = s_[pos_];
    if ((c == '{' || c == '[') && depth >= kMaxDepth) {
      return bad("metadata nests deeper than 512");
    }
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return string();
    if (c == 't') return literal("true");
    if (c == 'f') return literal("false");
    if (c == 'n') return literal("null");
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    return bad("metadata is not strict JSON");  // NaN, Infinity and the rest
  }

  bool object(int depth) {
    ++pos_;
    space();
    if (pos_ < s_.size() && s_[pos_] == '}') return ++pos_, true;
    for (;;) {
      space();
      if (pos_ >= s_.size() || s_[pos_] != '"') return bad("metadata is not JSON (key)");
      if (!string()) return false;
      space();
      if (pos_ >= s_.size() || s_[pos_] != ':') return bad("metadata is not JSON (colon)");
      ++pos_;
      if (!value(depth + 1)) return false;
      space();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') return ++pos_, true;
      return bad("metadata is not JSON (object)");
    }
  }

  bool array(int depth) {
    ++pos_;
    space();
    if (pos_ < s_.size() && s_[pos_] == ']') return ++pos_, true;
    for (;;) {
      if (!value(depth + 1)) return false;
      space();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == ']') return ++pos_, true;
      return bad("metadata is not JSON (array)");
    }
  }

  bool hex4(uint32_t* out) {
    if (s_.size() - pos_ < 4) return bad("metadata is not JSON (\\u escape)");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      char h = s_[pos_ + k];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= h - '0';
      else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
      else return bad("metadata is not JSON (\\u escape)");
    }
    pos_ += 4;
    *out = v;
    return true;
  }

  bool string() {
    ++pos_;
    while (pos_ < s_.size()) {
      unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') return ++pos_, true;
      if (c < 0x20) return bad("metadata is not JSON (control character in a string)");
      if (c != '\\') {
        ++pos_;
        continue;
      }
      if (++pos_ >= s_.size()) break;
      char e = s_[pos_++];
      if (e == 'u') {
        uint32_t unit;
        if (!hex4(&unit)) return false;
        if (unit >= 0xDC00 && unit <= 0xDFFF) return bad("metadata holds a lone surrogate");
        if (unit >= 0xD800 && unit <= 0xDBFF) {
          uint32_t low;
          if (s_.compare(pos_, 2, "\\u") != 0) return bad("metadata holds a lone surrogate");
          pos_ += 2;
          if (!hex4(&low)) return false;
          if (low < 0xDC00 || low > 0xDFFF) return bad("metadata holds a lone surrogate");
        }
      } else if (e != '"' && e != '\\' && e != '/' && e != 'b' && e != 'f' && e != 'n' &&
                 e != 'r' && e != 't') {
        return bad("metadata is not JSON (bad escape)");
      }
    }
    return bad("metadata is not JSON (unterminated string)");
  }

  bool digits() {
    size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    return pos_ > start;
  }

  bool number() {
    size_t start = pos_;
    if (s_[pos_] == '-') ++pos_;
    if (pos_ < s_.size() && s_[pos_] == '0') {
      ++pos_;
    } else if (!digits()) {
      return bad("metadata is not strict JSON (number)");  // "-Infinity" lands here
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (!digits()) return bad("metadata is not JSON (number)");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!digits()) return bad("metadata is not JSON (number)");
    }
    std::string text(s_.substr(start, pos_ - start));
    if (std::isinf(std::strtod(text.c_str(), nullptr)))
      return bad("metadata holds a number too large for a double");
    return true;
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::string error_;
};

}  // namespace

std::string check_metadata_json(std::string_view text) {
  size_t bad = 0;
  if (!internal::valid_utf8(reinterpret_cast<const uint8_t*>(text.data()), text.size(), &bad))
    return "metadata is not UTF-8 at byte " + std::to_string(bad);
  return Json(text).check();
}

}  // namespace evalue_store
