// Optional adapter: a record's values as ExecuTorch tensors and EValues, wrapping the file's
// bytes in place (executorch::extension::from_blob: no copy). Compiled only when the
// ExecuTorch headers are on the include path (the wheel's site-packages/executorch/include
// and .../runtime/core/portable_type/c10, with -DC10_USING_CUSTOM_GENERATED_MACROS).
//
// Lifetimes: the Reader (its mapping or buffer) must outlive every tensor made here. The
// bytes are read-only: a program that writes its inputs in place needs a copy.
#pragma once

#if __has_include(<executorch/extension/tensor/tensor_ptr.h>)

#include <executorch/extension/tensor/tensor_ptr.h>
#include <executorch/extension/tensor/tensor_ptr_maker.h>
#include <executorch/runtime/core/evalue.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "evalue_store/reader.h"

namespace evalue_store {
namespace et {

// The tensor `t` as an ExecuTorch TensorPtr over the same bytes (dtype codes are
// ExecuTorch's ScalarType numbers already; the dim order is passed on as it is stored).
inline Error to_tensor(const TensorView& t, executorch::extension::TensorPtr* out) {
  using executorch::aten::DimOrderType;
  using executorch::aten::ScalarType;
  using executorch::aten::SizesType;
  std::vector<SizesType> sizes(t.rank);
  std::vector<DimOrderType> order(t.rank);
  for (int k = 0; k < t.rank; ++k) {
    uint64_t dim = t.size(k);
    if (dim > static_cast<uint64_t>(std::numeric_limits<SizesType>::max())) {
      Error e;
      e.code = ErrorCode::kFormat;
      e.reason = "tensor dim " + std::to_string(dim) + " does not fit ExecuTorch's sizes";
      return e;
    }
    sizes[k] = static_cast<SizesType>(dim);
    order[k] = t.dim_order(k);
  }
  *out = executorch::extension::for_blob(const_cast<void*>(t.data), std::move(sizes),
                                         static_cast<ScalarType>(t.dtype))
             .dim_order(std::move(order))
             .make_tensor_ptr();
  return {};
}

// The values of one record as EValues, for Module::execute / Method::set_input. Holds the
// tensors and string views the EValues point to: keep it alive while they are used, and
// reuse it across records.
class EValues {
 public:
  Error set(const Record& record) {
    values_.clear();
    tensors_.clear();
    strings_.clear();
    strings_.reserve(record.size());  // EValue keeps a pointer: no reallocation after this
    for (size_t k = 0; k < record.size(); ++k) {
      const Value& v = record[k];
      switch (v.kind) {
        case Kind::kNone: values_.emplace_back(); break;
        case Kind::kInt: values_.emplace_back(static_cast<int64_t>(v.i)); break;
        case Kind::kDouble: values_.emplace_back(v.d); break;
        case Kind::kBool: values_.emplace_back(v.b); break;
        case Kind::kString:
          strings_.emplace_back(reinterpret_cast<const char*>(v.bytes),
                                static_cast<size_t>(v.count));
          values_.emplace_back(&strings_.back());
          break;
        case Kind::kTensor: {
          executorch::extension::TensorPtr tensor;
          Error e = to_tensor(v.tensor, &tensor);
          if (e) {
            e.reason = "value " + std::to_string(k) + ": " + e.reason;
            return e;
          }
          values_.emplace_back(*tensor);
          tensors_.push_back(std::move(tensor));
          break;
        }
        default: {
          Error e;
          e.code = ErrorCode::kFormat;
          e.reason = "value " + std::to_string(k) + ": list values are not converted by the "
                     "ExecuTorch adapter (read them from the Value)";
          return e;
        }
      }
    }
    return {};
  }

  const std::vector<executorch::runtime::EValue>& values() const { return values_; }

 private:
  std::vector<executorch::runtime::EValue> values_;
  std::vector<executorch::extension::TensorPtr> tensors_;
  std::vector<executorch::aten::ArrayRef<char>> strings_;
};

}  // namespace et
}  // namespace evalue_store

#endif  // ExecuTorch headers available
