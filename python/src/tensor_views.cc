#include "tensor_views.h"

#include <cstdint>
#include <utility>
#include <vector>

namespace kvattn::python {
namespace {

// DLPack type codes for the fp8 formats (DLPack >= 1.0).
constexpr uint8_t kDLFloat8E4M3FN = 10;
constexpr uint8_t kDLFloat8E5M2 = 12;

// The kvattn dtype of a DLPack array. Frameworks without fp8 or bf16 (numpy) pass the bytes as
// uint8 / uint16 and name the real dtype in `expected`: a storage-compatible array takes it.
std::optional<DType> array_dtype(const Array& a, std::optional<DType> expected) {
  const nb::dlpack::dtype t = a.dtype();
  if (t.lanes != 1) return std::nullopt;
  const auto code = static_cast<uint8_t>(t.code);
  using Code = nb::dlpack::dtype_code;
  if (code == static_cast<uint8_t>(Code::Float) && t.bits == 32) return DType::kF32;
  if (code == static_cast<uint8_t>(Code::Float) && t.bits == 16) return DType::kF16;
  if (code == static_cast<uint8_t>(Code::Bfloat) && t.bits == 16) return DType::kBF16;
  if (code == kDLFloat8E4M3FN && t.bits == 8) return DType::kE4M3;
  if (code == kDLFloat8E5M2 && t.bits == 8) return DType::kE5M2;
  if (code == static_cast<uint8_t>(Code::Int) && t.bits == 32) return DType::kI32;
  const bool integer =
      code == static_cast<uint8_t>(Code::UInt) || code == static_cast<uint8_t>(Code::Int);
  if (integer && t.bits == 8) {
    if (expected && is_fp8(*expected)) return expected;
    if (code == static_cast<uint8_t>(Code::UInt)) return DType::kU8;
  }
  if (integer && t.bits == 16 && expected && is_16bit_float(*expected)) return expected;
  if (code == static_cast<uint8_t>(Code::Bool) && t.bits == 8) return DType::kU8;
  return std::nullopt;
}

std::string describe_dtype(const Array& a) {
  const nb::dlpack::dtype t = a.dtype();
  return "DLPack type code " + std::to_string(static_cast<int>(t.code)) + ", " +
         std::to_string(t.bits) + " bits";
}

// torch tensors, read by their own metadata: pointer, shape, strides, dtype and device, the fields
// DLPack would carry, without __dlpack__'s cost (~3.5 us a tensor in torch 2.15, which alone
// would break the per-call overhead budget). Everything else goes through DLPack.
struct TorchTypes {
  nb::handle tensor, strided;
  std::vector<std::pair<nb::handle, DType>> dtypes;
  nb::handle uint8, int32, int16, boolean;
};

// torch's types once torch is imported (numpy-only callers never import it); under the GIL.
const TorchTypes* torch_types() {
  static TorchTypes* types = nullptr;
  if (types) return types;
  types = []() -> TorchTypes* {
    nb::module_ sys = nb::module_::import_("sys");
    nb::dict modules = nb::borrow<nb::dict>(sys.attr("modules"));
    if (!modules.contains("torch")) return nullptr;
    nb::object torch = modules["torch"];
    auto* t = new TorchTypes();  // never destroyed: torch outlives every call
    t->tensor = nb::object(torch.attr("Tensor")).release();
    t->strided = nb::object(torch.attr("strided")).release();
    const std::pair<const char*, DType> names[] = {{"float32", DType::kF32},
                                                   {"float16", DType::kF16},
                                                   {"bfloat16", DType::kBF16},
                                                   {"float8_e4m3fn", DType::kE4M3},
                                                   {"float8_e5m2", DType::kE5M2}};
    for (const auto& [name, dtype] : names) {
      if (nb::hasattr(torch, name))
        t->dtypes.emplace_back(nb::object(torch.attr(name)).release(), dtype);
    }
    t->uint8 = nb::object(torch.attr("uint8")).release();
    t->int32 = nb::object(torch.attr("int32")).release();
    t->int16 = nb::object(torch.attr("int16")).release();
    t->boolean = nb::object(torch.attr("bool")).release();
    return t;
  }();
  return types;
}

std::optional<TensorView> torch_view(nb::handle obj, std::string_view name,
                                     std::optional<DType> expected) {
  const TorchTypes* t = torch_types();
  if (!t || !PyObject_TypeCheck(obj.ptr(), reinterpret_cast<PyTypeObject*>(t->tensor.ptr()))) {
    return std::nullopt;
  }
  if (!obj.attr("layout").is(t->strided)) return std::nullopt;  // sparse: DLPack says why
  nb::handle dt = obj.attr("dtype");
  std::optional<DType> dtype;
  for (const auto& [h, d] : t->dtypes) {
    if (dt.is(h)) dtype = d;
  }
  if (dt.is(t->int32)) dtype = DType::kI32;
  if (dt.is(t->uint8) || dt.is(t->boolean)) {
    dtype = expected && is_fp8(*expected) && dt.is(t->uint8) ? *expected : DType::kU8;
  }
  if (dt.is(t->int16) && expected && is_16bit_float(*expected)) dtype = expected;
  if (!dtype) return std::nullopt;  // DLPack's path names the type in its error
  nb::tuple shape = nb::borrow<nb::tuple>(obj.attr("shape"));
  nb::tuple stride = nb::borrow<nb::tuple>(obj.attr("stride")());
  const int rank = static_cast<int>(shape.size());
  if (rank > kMaxRank) {
    raise(Status(ErrorCode::kInvalidShape, std::string(name) + ": rank " + std::to_string(rank) +
                                               " exceeds " + std::to_string(kMaxRank)));
  }
  int64_t sh[kMaxRank], st[kMaxRank];
  for (int i = 0; i < rank; ++i) {
    sh[i] = nb::cast<int64_t>(shape[i]);
    st[i] = nb::cast<int64_t>(stride[i]);
  }
  const auto ptr = nb::cast<uintptr_t>(obj.attr("data_ptr")());
  TensorView v = TensorView::strided(reinterpret_cast<void*>(ptr), *dtype, sh, st, rank);
  const int device = nb::cast<int>(obj.attr("get_device")());  // -1: CPU
  if (device >= 0) {
    v.memory = MemoryKind::kCuda;
    v.device_index = device;
  }
  return v;
}

}  // namespace

// Python exception classes by error-code name, registered by kvattn/_errors.py at import.
nb::dict& error_classes() {
  static nb::dict* classes = new nb::dict();  // never destroyed: outlives the interpreter's exit
  return *classes;
}

[[noreturn]] void raise(const Status& status) {
  std::string name(error_code_name(status.code()));
  nb::handle cls = PyExc_RuntimeError;
  if (error_classes().contains(name.c_str())) cls = error_classes()[name.c_str()];
  PyErr_SetString(cls.ptr(), status.message().c_str());
  throw nb::python_error();
}

void check(const Status& status) {
  if (!status.ok()) raise(status);
}

[[noreturn]] void raise_invalid(const std::string& message) {
  raise(Status(ErrorCode::kInvalidArgument, message));
}

// A view of `a` as it lies in memory. `name` is the argument, for messages.
TensorView to_view(const Array& a, std::string_view name, std::optional<DType> expected) {
  std::optional<DType> dtype = array_dtype(a, expected);
  if (!dtype) {
    raise(Status(ErrorCode::kInvalidDType, std::string(name) + ": " + describe_dtype(a) +
                                               " is not a type kvattn reads (float32, float16, "
                                               "bfloat16, float8_e4m3fn, float8_e5m2, int32, "
                                               "uint8)"));
  }
  if (a.ndim() > static_cast<size_t>(kMaxRank)) {
    raise(Status(ErrorCode::kInvalidShape, std::string(name) + ": rank " +
                                               std::to_string(a.ndim()) + " exceeds " +
                                               std::to_string(kMaxRank)));
  }
  int64_t shape[kMaxRank], strides[kMaxRank];
  const int rank = static_cast<int>(a.ndim());
  for (int i = 0; i < rank; ++i) {
    shape[i] = static_cast<int64_t>(a.shape(i));
    strides[i] = static_cast<int64_t>(a.stride(i));
    if (strides[i] < 0) {
      raise(Status(ErrorCode::kOutOfBounds,
                   std::string(name) + ": stride " + std::to_string(strides[i]) + " of dim " +
                       std::to_string(i) + " is negative (kvattn reads strides >= 0)"));
    }
  }
  TensorView v = TensorView::strided(const_cast<void*>(a.data()), *dtype, shape, strides, rank);
  const int device_type = a.device_type();
  if (device_type == nb::device::cuda::value) {
    v.memory = MemoryKind::kCuda;
    v.device_index = a.device_id();
  } else if (device_type != nb::device::cpu::value && device_type != nb::device::cuda_host::value) {
    raise(Status(ErrorCode::kInvalidArgument,
                 std::string(name) + ": DLPack device type " + std::to_string(device_type) +
                     " is not one kvattn runs on (CPU, CUDA, CUDA host)"));
  }
  return v;
}

// Any tensor argument: torch by its metadata, anything else through DLPack.
TensorView object_view(nb::handle obj, std::string_view name, std::optional<DType> expected) {
  if (std::optional<TensorView> v = torch_view(obj, name, expected)) return *v;
  Array a;
  if (!nb::try_cast(obj, a)) {
    raise_invalid(std::string(name) + ": expected a tensor or array (DLPack), got " +
                  nb::cast<std::string>(nb::str(obj.type())));
  }
  return to_view(a, name, expected);
}

TensorView optional_view(const std::optional<Array>& a, std::string_view name,
                         std::optional<DType> expected) {
  return a ? to_view(*a, name, expected) : TensorView{};
}

}  // namespace kvattn::python
