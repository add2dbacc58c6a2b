// Problems and explain's verdicts as Python values: the library's problem table
// (kvattn/problem_text.h) read and written with each field's Python type, so Python, the command
// line and the case files share one spelling, one rule and one message per field.
#pragma once

#include <nanobind/nanobind.h>

#include "kvattn/selection.h"

namespace kvattn::python {

// _kvattn.Problem (a typed class: keyword values in, one read-only property per table key) and
// _kvattn.check_field (one parameter put to the table: raises its refusal).
void bind_problem(nanobind::module_& m);

// A layer's q_scale / k_scale / v_scale (`key`) from a Python value given to run: None is 1, a
// float itself; anything else is put to the problem table, which parses it or raises its refusal.
float run_scale(const char* key, nanobind::handle value);

// explain's verdicts (the keys of Explanation::to_json) as a dict of Python values.
nanobind::dict explanation_dict(const Explanation& e);

}  // namespace kvattn::python
