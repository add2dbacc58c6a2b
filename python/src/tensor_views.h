// The extension's errors and tensor views: C++ Status -> the kvattn.Error subclass of its kind,
// and Python tensors -> TensorViews of the memory where they lie (torch by its own metadata,
// anything else through DLPack).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>
#include <string>
#include <string_view>

#include "kvattn/kvattn.h"

namespace kvattn::python {

namespace nb = nanobind;
using Array = nb::ndarray<nb::ro>;

// Python exception classes by error-code name, registered by kvattn/_errors.py at import.
nb::dict& error_classes();
[[noreturn]] void raise(const Status& status);
void check(const Status& status);
[[noreturn]] void raise_invalid(const std::string& message);

// A view of `a` as it lies in memory; `name` is the argument, for messages. Frameworks without
// fp8 or bf16 (numpy) pass uint8 / uint16 storage and name the real dtype in `expected`.
TensorView to_view(const Array& a, std::string_view name, std::optional<DType> expected = {});
// Any tensor argument: torch by its metadata, anything else through DLPack.
TensorView object_view(nb::handle obj, std::string_view name, std::optional<DType> expected);
TensorView optional_view(const std::optional<Array>& a, std::string_view name,
                         std::optional<DType> expected = {});

}  // namespace kvattn::python
