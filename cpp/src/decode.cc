// The record grammar of docs/FORMAT.md sections 4-5: every count, length and dim is checked
// against the payload bytes left before it is used; sizes use checked 64-bit arithmetic.
#include <string>

#include "internal.h"

namespace evalue_store {

size_t dtype_itemsize(Dtype dtype) {
  switch (dtype) {
    case Dtype::kUInt8: case Dtype::kInt8: case Dtype::kBool: return 1;
    case Dtype::kInt16: case Dtype::kFloat16: case Dtype::kBFloat16: case Dtype::kUInt16: return 2;
    case Dtype::kInt32: case Dtype::kFloat32: case Dtype::kUInt32: return 4;
    case Dtype::kInt64: case Dtype::kFloat64: case Dtype::kComplex64: case Dtype::kUInt64: return 8;
    case Dtype::kComplex128: return 16;
  }
  return 0;
}

const char* dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::kUInt8: return "uint8";
    case Dtype::kInt8: return "int8";
    case Dtype::kInt16: return "int16";
    case Dtype::kInt32: return "int32";
    case Dtype::kInt64: return "int64";
    case Dtype::kFloat16: return "float16";
    case Dtype::kFloat32: return "float32";
    case Dtype::kFloat64: return "float64";
    case Dtype::kComplex64: return "complex64";
    case Dtype::kComplex128: return "complex128";
    case Dtype::kBool: return "bool";
    case Dtype::kBFloat16: return "bfloat16";
    case Dtype::kUInt16: return "uint16";
    case Dtype::kUInt32: return "uint32";
    case Dtype::kUInt64: return "uint64";
  }
  return nullptr;
}

uint64_t TensorView::stride(int k) const {
  uint64_t step = 1;
  for (int j = rank - 1; j >= 0; --j) {
    int axis = dim_order(j);
    if (axis == k) return step;
    step *= size(axis);
  }
  return 0;
}

int64_t Value::int_at(uint64_t k) const {
  int64_t v;
  std::memcpy(&v, bytes + 8 * k, 8);
  return v;
}

double Value::double_at(uint64_t k) const {
  double v;
  std::memcpy(&v, bytes + 8 * k, 8);
  return v;
}

constexpr uint32_t kMaxValues = 1u << 20;
const uint8_t kZeros[65536] = {};  // padding is below the largest alignment
constexpr uint8_t kDimOrderFlag = 1;

class Decoder {
 public:
  Decoder(const uint8_t* base, uint64_t frame, uint64_t length, uint32_t alignment)
      : b_(base), pos_(frame + 16), end_(frame + 16 + length), frame_(frame), align_(alignment) {}

  Error run(Record* out) {
    out->clear();
    uint64_t start = pos_;
    if (end_ - pos_ < 4) return bad(pos_, "truncated value count");
    uint32_t n;
    std::memcpy(&n, b_ + pos_, 4);
    pos_ += 4;
    if (n > kMaxValues) return bad(start, "record claims more values than the limit 2^20");
    if (n > end_ - start) return bad(start, "record claims more values than its bytes");
    for (uint32_t k = 0; k < n; ++k) {
      out->values_.emplace_back();
      if (!value(&out->values_.back(), 0, out)) return error_;
    }
    if (pos_ != end_) return bad(pos_, std::to_string(end_ - pos_) + " bytes left after the last value");
    return {};
  }

 private:
  // allowed: 0 = any tag, 1 = Tensor only, 2 = None or Tensor (items of the tensor lists)
  bool value(Value* v, int allowed, Record* out) {
    uint64_t at = pos_;
    if (!need(1, "value tag")) return false;
    uint8_t tag = b_[at];
    if ((allowed == 1 && tag != 1) || (allowed == 2 && tag != 0 && tag != 1))
      return fail(at, "tag " + std::to_string(tag) + " not allowed inside a list of tensors");
    v->kind = static_cast<Kind>(tag);
    switch (tag) {
      case 0: return true;
      case 1: return tensor(v, at);
      case 2: return string(v, at);
      case 3: case 4: {
        uint64_t p = pos_;
        if (!need(8, tag == 3 ? "Double" : "Int")) return false;
        if (tag == 3) std::memcpy(&v->d, b_ + p, 8);
        else std::memcpy(&v->i, b_ + p, 8);
        return true;
      }
      case 5: {
        uint64_t p = pos_;
        if (!need(1, "Bool")) return false;
        if (b_[p] > 1) return fail(p, "Bool byte is neither 0 nor 1");
        v->b = b_[p] == 1;
        return true;
      }
      case 6: case 7: case 8: {
        uint64_t count;
        if (!length(&count)) return false;
        uint64_t size = tag == 6 ? 1 : 8;
        if (count > (end_ - pos_) / size) return fail(pos_ - 8, "list claims more items than its bytes");
        v->bytes = b_ + pos_;
        v->count = count;
        if (tag == 6)
          for (uint64_t k = 0; k < count; ++k)
            if (v->bytes[k] > 1) return fail(pos_ + k, "ListBool item is neither 0 nor 1");
        pos_ += count * size;
        return true;
      }
      case 9: case 11: {
        uint64_t count;
        if (!length(&count)) return false;
        if (count > end_ - pos_) return fail(at, "list claims more items than its bytes");
        v->count = count;
        v->first_item = out->items_.size();
        for (uint64_t k = 0; k < count; ++k) {
          out->items_.emplace_back();
          if (!value(&out->items_.back(), tag == 9 ? 1 : 2, out)) return false;
        }
        return true;
      }
      default:
        return fail(at, "unknown value tag " + std::to_string(tag));
    }
  }

  bool length(uint64_t* count) {
    uint64_t p = pos_;
    if (!need(8, "list length")) return false;
    std::memcpy(count, b_ + p, 8);
    return true;
  }

  bool string(Value* v, uint64_t at) {
    uint64_t p = pos_;
    if (!need(9, "String header")) return false;
    uint8_t subtype = b_[p];
    uint64_t n = load_u64(b_ + p + 1);
    uint64_t start = pos_;
    if (!need(n, "String")) return false;
    v->bytes = b_ + start;
    v->count = n;
    if (subtype > 1) return fail(at + 1, "unknown String subtype " + std::to_string(subtype));
    v->is_text = subtype == 0;
    size_t where = 0;
    if (v->is_text && !internal::valid_utf8(v->bytes, n, &where))
      return fail(start + where, "invalid UTF-8 in String");
    return true;
  }

  bool tensor(Value* v, uint64_t at) {
    if (end_ - pos_ < 3) return fail(pos_, "truncated Tensor header");
    uint8_t code = b_[pos_], rank = b_[pos_ + 1], flags = b_[pos_ + 2];
    Dtype dtype = static_cast<Dtype>(code);
    uint64_t itemsize = dtype_itemsize(dtype);
    if (itemsize == 0) return fail(at + 1, "unknown tensor dtype code " + std::to_string(code));
    if (rank > kMaxRank) return fail(at + 2, "tensor rank " + std::to_string(rank) + " exceeds 64");
    if (flags & ~kDimOrderFlag) return fail(at + 3, "unknown tensor flags " + std::to_string(flags));
    pos_ += 3;
    uint64_t head = 8ull * rank + ((flags & kDimOrderFlag) ? rank : 0);
    if (end_ - pos_ < head) return fail(pos_, "truncated Tensor dims");
    TensorView& t = v->tensor;
    t.dtype = dtype;
    t.rank = rank;
    t.dims_at = b_ + pos_;
    pos_ += 8ull * rank;
    t.order_at = nullptr;
    if (flags & kDimOrderFlag) {
      t.order_at = b_ + pos_;
      uint64_t seen = 0;  // rank <= 64 axes: one bit each
      for (int k = 0; k < rank; ++k) {
        uint8_t axis = t.order_at[k];
        if (axis >= rank || (seen >> axis & 1)) return fail(pos_, "dim order is not a permutation");
        seen |= 1ull << axis;
      }
      pos_ += rank;
    }
    uint64_t data = frame_ + ((pos_ - frame_ + align_ - 1) / align_) * align_;
    if (data <= end_ && std::memcmp(b_ + pos_, kZeros, data - pos_) != 0)
      return fail(pos_, "non-zero bytes in the padding before tensor data");
    uint64_t extent = itemsize, numel = 1;
    bool overflow = false;
    for (int k = 0; k < rank; ++k) {
      uint64_t dim = t.size(k);
      overflow |= __builtin_mul_overflow(extent, dim ? dim : 1, &extent);
      numel *= dim;  // <= extent when no overflow
    }
    if (overflow || extent >= (1ull << 63))
      return fail(at + 4, "tensor dims overflow 64-bit sizes");
    uint64_t nbytes = numel * itemsize;
    if (data > end_ || nbytes > end_ - data)
      return fail(data, "tensor data (" + std::to_string(nbytes) + " bytes) runs past the record");
    t.data = b_ + data;
    t.numel = numel;
    t.nbytes = nbytes;
    pos_ = data + nbytes;
    if (dtype == Dtype::kBool)
      for (uint64_t k = 0; k < nbytes; ++k)
        if (b_[data + k] > 1) return fail(data + k, "bool tensor holds a byte other than 0 or 1");
    return true;
  }

  bool need(uint64_t n, const char* what) {
    if (n > end_ - pos_)
      return fail(pos_, std::string("truncated ") + what + ": needs " + std::to_string(n) +
                            " bytes, " + std::to_string(end_ - pos_) + " left");
    pos_ += n;
    return true;
  }

  bool fail(uint64_t offset, std::string reason) {
    error_.code = ErrorCode::kFormat;
    error_.offset = static_cast<int64_t>(offset);
    error_.reason = std::move(reason);
    return false;
  }
  Error bad(uint64_t offset, std::string reason) {
    fail(offset, std::move(reason));
    return error_;
  }

  const uint8_t* b_;
  uint64_t pos_, end_, frame_;
  uint32_t align_;
  Error error_;
};

namespace internal {

Error decode_record(const uint8_t* base, uint64_t frame, uint64_t length, uint32_t alignment,
                    Record* out) {
  return Decoder(base, frame, length, alignment).run(out);
}

}  // namespace internal
}  // namespace evalue_store
