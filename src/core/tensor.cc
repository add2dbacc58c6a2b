#include "kvattn/tensor.h"

#include <sstream>

namespace kvattn {

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[i];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int i = rank - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

int64_t TensorView::extent_elements() const {
  int64_t last = 0;
  for (int i = 0; i < rank; ++i) {
    if (shape[i] == 0) return 0;
    last += (shape[i] - 1) * strides[i];
  }
  return last + 1;
}

std::string TensorView::shape_string() const {
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < rank; ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

TensorView TensorView::contiguous(void* data, DType dtype, const int64_t* shape, int rank) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.rank = rank;
  int64_t stride = 1;
  for (int i = rank - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.strides[i] = stride;
    stride *= shape[i];
  }
  t.buffer_bytes = stride * static_cast<int64_t>(dtype_size(dtype));
  return t;
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  return contiguous(data, dtype, shape.begin(), static_cast<int>(shape.size()));
}

TensorView TensorView::strided(void* data, DType dtype, const int64_t* shape,
                               const int64_t* strides, int rank, int64_t buffer_bytes) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.rank = rank;
  for (int i = 0; i < rank; ++i) {
    t.shape[i] = shape[i];
    t.strides[i] = strides[i];
  }
  t.buffer_bytes = buffer_bytes >= 0
                       ? buffer_bytes
                       : t.extent_elements() * static_cast<int64_t>(dtype_size(dtype));
  return t;
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               std::initializer_list<int64_t> strides, int64_t buffer_bytes) {
  return strided(data, dtype, shape.begin(), strides.begin(), static_cast<int>(shape.size()),
                 buffer_bytes);
}

}  // namespace kvattn
