#include "problem_values.h"

#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kvattn/problem.h"
#include "kvattn/problem_text.h"
#include "tensor_views.h"

namespace nb = nanobind;

namespace kvattn::python {
namespace {

// A Python value as the problem table's text: bool, int, float and str cross as themselves and
// the library's table (kvattn/problem_text.h) parses and refuses them, so Python, the command line
// and the case files share one spelling, one rule and one message per field.
std::string field_text(const ProblemField& field, nb::handle value) {
  PyObject* o = value.ptr();
  if (PyBool_Check(o)) return o == Py_True ? "true" : "false";
  if (field.kind == ProblemField::Kind::kFloat && !PyUnicode_Check(o)) {
    // A number (or a one-element tensor) as its float; anything else is refused as its text.
    if (PyObject* f = PyNumber_Float(o)) {
      const double d = PyFloat_AsDouble(f);
      Py_DECREF(f);
      return format_float(static_cast<float>(d));
    }
    PyErr_Clear();
  }
  return nb::cast<std::string>(nb::str(value));
}

void set_field(const std::string& key, nb::handle value, ProblemDraft* draft) {
  const ProblemField* field = find_problem_field(key);
  if (!field) raise_invalid("unknown problem parameter '" + key + "'");
  const std::string text = field_text(*field, value);
  std::string why;
  if (!field->set(text, draft, &why)) raise_invalid(key + " = " + text + ": " + why);
}

// A problem from keyword values (None: left at its default). The table's per-layer run values
// (q_scale, ..., return_lse) are run's arguments, not the problem's.
Problem problem_from_values(const nb::dict& values) {
  ProblemDraft draft;
  for (auto [key, value] : values) {
    if (value.is_none()) continue;
    const std::string name = nb::cast<std::string>(key);
    const ProblemField* field = find_problem_field(name);
    if (field && field->run_value) {
      raise_invalid(name + ": a per-layer run value, given to run (not to the problem)");
    }
    set_field(name, value, &draft);
  }
  Problem problem;
  check(finish_problem(draft, &problem));
  return problem;
}

// A field of `problem` as its Python type; None where the parameter is unset (sm_scale) or does
// not apply (head_dim_vo of an MLA problem).
nb::object field_value(const ProblemField& field, const Problem& problem) {
  std::optional<std::string> text = field.get(problem, RunValues{});
  if (!text) return nb::none();
  switch (field.kind) {
    case ProblemField::Kind::kBool:
      return nb::bool_(*text == "true");
    case ProblemField::Kind::kInt: {
      int64_t n = 0;
      parse_int64(*text, &n);
      return nb::int_(n);
    }
    case ProblemField::Kind::kFloat: {
      float f = 0;
      parse_float(*text, &f);
      return nb::float_(f);
    }
    case ProblemField::Kind::kText:
      break;
  }
  return nb::str(text->c_str());
}

nb::dict problem_values(const Problem& problem) {
  nb::dict out;
  for (const ProblemField& f : problem_fields()) {
    if (f.run_value) continue;
    nb::object v = field_value(f, problem);
    if (!v.is_none()) out[nb::str(f.key.data(), f.key.size())] = v;
  }
  return out;
}

}  // namespace

void bind_problem(nb::module_& m) {
  // The problem, typed: Problem(op="batch_decode", num_qo_heads=32, causal=True, ...) takes the
  // library's table keys (kvattn/problem_text.h) with values of their Python types; each key is
  // also a read-only property, None where unset or not applicable.
  nb::class_<Problem> problem_class(m, "Problem");
  problem_class
      .def("__init__", [](Problem* self,
                          nb::kwargs values) { new (self) Problem(problem_from_values(values)); })
      .def("fields", &problem_values, "every set parameter by key, as Python values")
      .def("__repr__", [](const Problem& p) { return "<kvattn problem: " + p.to_string() + ">"; });
  for (const ProblemField& f : problem_fields()) {
    if (f.run_value) continue;
    problem_class.def_prop_ro(f.key.data(), [&f](const Problem& p) { return field_value(f, p); });
  }
  // One problem parameter put to the library's table: raises its refusal (the wrappers' early
  // checks of kv_layout or pos_encoding_mode, before there is a whole problem to plan).
  m.def("check_field", [](const std::string& key, nb::handle value) {
    ProblemDraft draft;
    set_field(key, value, &draft);
  });
}

float run_scale(const char* key, nb::handle value) {
  PyObject* o = value.ptr();
  if (value.is_none()) return 1.0f;
  if (PyFloat_CheckExact(o)) return static_cast<float>(PyFloat_AS_DOUBLE(o));
  // Anything else through the table: its rule and its message ("q_scale = ...: expected ...").
  ProblemDraft draft;
  set_field(key, value, &draft);
  const std::string_view k = key;
  return k == "q_scale"   ? draft.run.q_scale
         : k == "k_scale" ? draft.run.k_scale
                          : draft.run.v_scale;
}

nb::dict explanation_dict(const Explanation& e) {
  nb::dict out;
  out["device"] = e.device.to_string();
  out["selected"] = e.selected ? nb::object(nb::str(e.selected->c_str())) : nb::none();
  nb::list verdicts;
  for (const Verdict& v : e.verdicts) {
    nb::dict d;
    d["backend"] = v.backend;
    d["supported"] = v.supported;
    d["reason"] = v.reason;
    d["available"] = v.available;
    d["availability"] = v.availability;
    if (v.backend == "cpu") {
      if (v.cpu_kernel.empty()) {
        d["cpu_kernel"] = nb::none();
        d["cpu_kernel_error"] = v.cpu_kernel_error;
      } else {
        d["cpu_kernel"] = v.cpu_kernel;
      }
      nb::list taller;
      for (const std::string& t : v.cpu_kernel_taller) taller.append(t);
      d["cpu_kernel_taller"] = taller;
      if (v.cpu_kernel_one_token.empty()) {
        d["cpu_kernel_one_token"] = nb::none();
      } else {
        d["cpu_kernel_one_token"] = v.cpu_kernel_one_token;
      }
    }
    verdicts.append(d);
  }
  out["verdicts"] = verdicts;
  return out;
}

}  // namespace kvattn::python
