// `kvattn run --check`: a backend's output against the fp64 reference, with the tolerance of
// testing/tolerance.h (2 x the error of a plain low-precision implementation + atol).
#pragma once

#include <vector>

#include "kvattn/status.h"
#include "testing/tolerance.h"
#include "tools/case_file.h"

namespace kvattn::tools {

// Runs the reference (f32 output, with LSE) and the baseline on the inputs of `c` and compares
// `got` (the outputs of the backend under test, in c.problem's o dtype; lse when it returns it).
// A reference or baseline failure is returned as the Status; the comparison in `result`.
Status check_against_reference(const io::OwnedCase& c, const io::OutputBuffers& got,
                               testing::CheckResult* result);

}  // namespace kvattn::tools
