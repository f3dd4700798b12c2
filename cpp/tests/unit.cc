// Unit checks of the pieces a container comparison does not isolate: the checksums' check
// values and hardware/portable agreement, the strict JSON rules. Prints "ok" or what failed.
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "evalue_store/reader.h"

namespace evs = evalue_store;

static int failures = 0;

static void expect(bool ok, const char* what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what);
    ++failures;
  }
}

int main() {
  const char* check = "123456789";
  expect(evs::crc32(check, 9) == 0xCBF43926u, "crc32 check value");
  expect(evs::crc32c(check, 9) == 0xE3069283u, "crc32c check value");
  expect(evs::crc32c_portable(check, 9) == 0xE3069283u, "portable crc32c check value");
  expect(evs::crc32(check + 4, 5, evs::crc32(check, 4)) == 0xCBF43926u, "crc32 chaining");
  expect(evs::crc32c(check + 4, 5, evs::crc32c(check, 4)) == 0xE3069283u, "crc32c chaining");
  std::mt19937 rng(7);
  std::vector<uint8_t> buf(4096 + 16);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t start = 0; start < 9; ++start)
    for (size_t n : {0, 1, 7, 8, 9, 63, 64, 65, 1000, 4096})
      expect(evs::crc32c(buf.data() + start, n) == evs::crc32c_portable(buf.data() + start, n),
             "hardware and portable crc32c agree");
  std::printf("crc32c hardware: %s\n", evs::crc32c_hardware() ? "yes" : "no");

  struct Case {
    const char* json;
    bool ok;
  } cases[] = {
      {"{}", true}, {" {\"a\": [1, -0.5e3, true, false, null, \"x\\u00e9\\ud83d\\ude00\"]} ", true},
      {"[]", false}, {"{\"a\": NaN}", false}, {"{\"a\": Infinity}", false},
      {"{\"a\": -Infinity}", false}, {"{\"a\": 1e999}", false}, {"{\"a\": \"\\ud800\"}", false},
      {"{\"a\": \"\\udc00x\"}", false}, {"{\"a\": \"\\ud800\\u0041\"}", false},
      {"{\"a\": 01}", false}, {"{\"a\": 1.}", false}, {"{\"a\": .5}", false},
      {"{\"a\": 1}x", false}, {"{\"a\": \"\x01\"}", false}, {"{'a': 1}", false},
      {"{\"a\": 1,}", false}, {"\xef\xbb\xbf{}", false}, {"{\"\xed\xa0\x80\": 1}", false},
      {"{\"a\": 1e-400}", true}, {"", false},
  };
  for (const Case& c : cases) {
    bool ok = evs::check_metadata_json(c.json).empty();
    if (ok != c.ok) std::printf("json case: %s\n", c.json);
    expect(ok == c.ok, "strict JSON rule");
  }
  // An integer literal past the largest double is "a number too large for a double" too.
  std::string big = "{\"a\": 1" + std::string(400, '0') + "}";
  expect(!evs::check_metadata_json(big).empty(), "integer beyond a double refused");
  // At most 512 deep, the top object counting 1 (here 1 + 511 arrays, then 1 + 512).
  std::string open(511, '['), close(511, ']');
  expect(evs::check_metadata_json("{\"a\": " + open + close + "}").empty(), "512 deep");
  expect(!evs::check_metadata_json("{\"a\": [" + open + close + "]}").empty(), "513 deep");

  evs::Reader reader;
  evs::Error e = evs::Reader::open_buffer("", 0, &reader);
  expect(e.code == evs::ErrorCode::kFormat, "empty buffer refused");
  e = evs::Reader::open_buffer("\x28\xb5\x2f\xfd....", 8, &reader);
  expect(e.code == evs::ErrorCode::kCompressed, "zstd refused as compressed");
  e = evs::Reader::open_file("/nonexistent/file.evs", &reader);
  expect(e.code == evs::ErrorCode::kIo, "missing file is an I/O error");
  if (failures == 0) std::printf("ok\n");
  return failures ? 1 : 0;
}
