// The extension module kvattn._kvattn: the C++ API reached from Python, nothing more. Python
// holds argument handling and conventions; validation, selection and kernels stay in C++, so there
// is one set of rules and one set of messages (STYLE.md, "Python: a thin, familiar layer").
//
// Tensors are read where they lie (tensor_views.h: torch by its metadata, anything else through
// DLPack). The GIL is released while kernels run.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "kvattn/kvattn.h"
#include "problem_values.h"
#include "tensor_views.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace kvattn::python {
namespace {

Device parse_device(const std::string& text) {
  std::string why;
  std::optional<Device> d = Device::parse(text, &why);
  if (!d) raise(Status(ErrorCode::kInvalidArgument, "device '" + text + "': " + why));
  return *d;
}

// The AttentionArgs fields by the names Python uses for them, with the dtype each expects.
enum class Expect { kNone, kQ, kKV, kO };
struct ArgField {
  const char* name;
  TensorView AttentionArgs::*member;
  Expect expect;
};
constexpr ArgField kArgFields[] = {
    {"q", &AttentionArgs::q, Expect::kQ},
    {"k", &AttentionArgs::k, Expect::kKV},
    {"v", &AttentionArgs::v, Expect::kKV},
    {"paged_k_cache", &AttentionArgs::paged_k_cache, Expect::kKV},
    {"paged_v_cache", &AttentionArgs::paged_v_cache, Expect::kKV},
    {"qo_indptr", &AttentionArgs::qo_indptr, Expect::kNone},
    {"kv_indptr", &AttentionArgs::kv_indptr, Expect::kNone},
    {"kv_indices", &AttentionArgs::kv_indices, Expect::kNone},
    {"kv_last_page_len", &AttentionArgs::kv_last_page_len, Expect::kNone},
    {"custom_mask", &AttentionArgs::custom_mask, Expect::kNone},
    {"alibi_slopes", &AttentionArgs::alibi_slopes, Expect::kNone},
    {"sinks", &AttentionArgs::sinks, Expect::kNone},
    {"k_scale", &AttentionArgs::k_scale, Expect::kNone},
    {"v_scale", &AttentionArgs::v_scale, Expect::kNone},
    {"k_scale_cache", &AttentionArgs::k_scale_cache, Expect::kNone},
    {"v_scale_cache", &AttentionArgs::v_scale_cache, Expect::kNone},
    {"q_nope", &AttentionArgs::q_nope, Expect::kQ},
    {"q_pe", &AttentionArgs::q_pe, Expect::kQ},
    {"ckv_cache", &AttentionArgs::ckv_cache, Expect::kKV},
    {"kpe_cache", &AttentionArgs::kpe_cache, Expect::kKV},
    {"out", &AttentionArgs::out, Expect::kO},
    {"lse", &AttentionArgs::lse, Expect::kNone},
};

std::optional<DType> expected_dtype(const Problem& p, Expect e) {
  switch (e) {
    case Expect::kQ:
      return p.q_dtype;
    case Expect::kKV:
      return p.kv_dtype;
    case Expect::kO:
      return p.o_dtype;
    case Expect::kNone:
      break;
  }
  return std::nullopt;
}

// FlashInfer's combined cache [P, 2, ...] as the two strided views kvattn reads: K at index 0
// and V at index 1 of dim 1 (no copy, no Python-side slicing per call).
void split_combined_cache(const TensorView& both, AttentionArgs* args) {
  if (both.rank != 5 || both.shape[1] != 2) {
    raise(Status(ErrorCode::kInvalidShape,
                 "paged_kv_cache: shape " + both.shape_string() +
                     ": must be [num_pages, 2, page_size, H_kv, D] (NHD) or [num_pages, 2, H_kv, "
                     "page_size, D] (HND), or a (k_cache, v_cache) tuple"));
  }
  int64_t shape[4] = {both.shape[0], both.shape[2], both.shape[3], both.shape[4]};
  int64_t strides[4] = {both.strides[0], both.strides[2], both.strides[3], both.strides[4]};
  const int64_t bytes = both.buffer_bytes;
  TensorView k = TensorView::strided(both.data, both.dtype, shape, strides, 4, bytes);
  const int64_t v_offset = both.strides[1] * static_cast<int64_t>(dtype_size(both.dtype));
  TensorView v = TensorView::strided(static_cast<char*>(both.data) + v_offset, both.dtype, shape,
                                     strides, 4, bytes - v_offset);
  k.memory = v.memory = both.memory;
  k.device_index = v.device_index = both.device_index;
  args->paged_k_cache = k;
  args->paged_v_cache = v;
}

// The tensors of one call over `base` (the plan's index tensors, converted once at plan time).
AttentionArgs args_from_dict(const Problem& problem, const nb::dict& tensors,
                             bool custom_mask_packed, const AttentionArgs& base = {}) {
  AttentionArgs args = base;
  args.custom_mask_packed = custom_mask_packed;
  for (auto [key, value] : tensors) {
    if (value.is_none()) continue;
    const char* name = nb::borrow<nb::str>(key).c_str();
    if (std::strcmp(name, "paged_kv_cache") == 0) {
      split_combined_cache(object_view(value, "paged_kv_cache", problem.kv_dtype), &args);
      continue;
    }
    const ArgField* field = nullptr;
    for (const ArgField& f : kArgFields) {
      if (std::strcmp(f.name, name) == 0) field = &f;
    }
    if (!field) raise_invalid(std::string("unknown attention argument '") + name + "'");
    args.*(field->member) = object_view(value, name, expected_dtype(problem, field->expect));
  }
  return args;
}

// One plan per plan() call, reused by every layer's run: the per-layer values (scales, sinks,
// per-head scale tensors, the LSE and its base) are run arguments (AttentionArgs::scalars and the
// tensors), so a run copies no plan and allocates none.
struct PyPlan {
  Plan plan;
  bool custom_mask_packed = false;
  // The index tensors (and custom mask) given at plan, converted once; `keep` holds the Python
  // objects they view so that they outlive the plan.
  AttentionArgs index_args;
  nb::object keep;
};

std::unique_ptr<PyPlan> make_plan(const Problem& problem, const nb::dict& tensors,
                                  bool custom_mask_packed, const std::string& backend,
                                  const std::string& device, int num_threads, int64_t kv_chunk_size,
                                  uintptr_t stream) {
  auto out = std::make_unique<PyPlan>();
  AttentionArgs args = args_from_dict(problem, tensors, custom_mask_packed);
  PlanOptions options;
  options.backend = backend;
  options.device = parse_device(device);
  options.num_threads = num_threads;
  options.kv_chunk_size = kv_chunk_size;
  options.stream = reinterpret_cast<void*>(stream);
  Status s;
  {
    nb::gil_scoped_release release;
    s = plan(problem, args, options, &out->plan);
  }
  check(s);
  out->custom_mask_packed = custom_mask_packed;
  if (is_batch(problem.op)) {
    // run() takes the data tensors only; the index tensors stay as planned.
    AttentionArgs& ia = out->index_args;
    ia.qo_indptr = args.qo_indptr;
    ia.kv_indptr = args.kv_indptr;
    ia.kv_indices = args.kv_indices;
    ia.kv_last_page_len = args.kv_last_page_len;
    ia.custom_mask = args.custom_mask;
    ia.alibi_slopes = args.alibi_slopes;
    out->keep = nb::borrow(tensors);
  }
  return out;
}

// run(plan, tensors, workspace, lse_base2, q_scale, k_scale, v_scale, stream): the lse is returned
// when an "lse" tensor is given, in base 2 with lse_base2 (FlashInfer's convention) or natural.
void run_plan(PyPlan& p, const nb::dict& tensors, nb::handle workspace, bool lse_base2,
              nb::handle q_scale, nb::handle k_scale, nb::handle v_scale, uintptr_t stream) {
  // torch's current stream at run (the plan's device state is ready for any; runs of one plan do
  // not overlap, as C++'s run requires).
  p.plan.stream = reinterpret_cast<void*>(stream);
  const Plan& plan = p.plan;
  AttentionArgs args = args_from_dict(plan.problem, tensors, p.custom_mask_packed, p.index_args);
  args.scalars.q_scale = run_scale("q_scale", q_scale);
  args.scalars.k_scale = run_scale("k_scale", k_scale);
  args.scalars.v_scale = run_scale("v_scale", v_scale);
  args.scalars.lse_base = lse_base2 ? LseBase::k2 : LseBase::kE;
  // The caller's workspace when it is on the plan's device and large enough; else run allocates.
  // Read only when the plan needs one, and a torch tensor by its metadata: a DLPack export of the
  // workspace on every call cost ~3.5 us, most of the call's fixed cost.
  void* ws = nullptr;
  std::size_t ws_bytes = 0;
  if (!workspace.is_none() && plan.workspace_bytes > 0) {
    const TensorView w = object_view(workspace, "workspace", std::nullopt);
    const auto bytes = static_cast<std::size_t>(w.buffer_bytes);
    if (w.is_contiguous() && bytes >= plan.workspace_bytes &&
        (w.memory == MemoryKind::kCuda) == plan.device.is_cuda()) {
      ws = w.data;
      ws_bytes = bytes;
    }
  }
  Status s;
  {
    nb::gil_scoped_release release;
    s = run(plan, args, ws, ws_bytes);
  }
  check(s);
}

// Seconds of each of `repeats` C++ run() calls on the same arguments (the GIL released): the
// figure the Python overhead benchmark (bench/python_overhead.py) subtracts.
std::vector<double> time_cpp_run(PyPlan& p, const nb::dict& tensors, int repeats) {
  const Plan& plan = p.plan;
  AttentionArgs args = args_from_dict(plan.problem, tensors, p.custom_mask_packed, p.index_args);
  std::vector<double> seconds;
  seconds.reserve(static_cast<std::size_t>(std::max(repeats, 0)));
  Status s;
  {
    nb::gil_scoped_release release;
    for (int i = 0; i < repeats && s.ok(); ++i) {
      const auto start = std::chrono::steady_clock::now();
      s = run(plan, args);
      seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  check(s);
  return seconds;
}

OpOptions op_options(const std::string& backend, const std::string& device, int num_threads,
                     uintptr_t stream) {
  OpOptions o;
  o.stream = reinterpret_cast<void*>(stream);  // torch's current stream on the tensors' device
  o.backend = backend;
  o.device = parse_device(device);
  o.num_threads = num_threads;
  return o;
}

template <class Fn>
void run_released(Fn&& fn) {
  Status s;
  {
    nb::gil_scoped_release release;
    s = fn();
  }
  check(s);
}

// RoPE beyond the whole-head rotation: a partial rotary dim, Llama 3.1 frequency scaling, a
// precomputed cos/sin cache (validated, and applied, in C++).
void set_rope_extensions(RopeParams* rope, int rotary_dim,
                         const std::optional<std::tuple<float, float, float>>& llama31,
                         const TensorView& cos_sin_cache) {
  rope->rotary_dim = rotary_dim;
  if (llama31) {
    Llama31Scaling s;
    s.low_freq_factor = std::get<0>(*llama31);
    s.high_freq_factor = std::get<1>(*llama31);
    s.old_context_len = std::get<2>(*llama31);
    rope->llama31 = s;
  }
  rope->cos_sin_cache = cos_sin_cache;
}

nb::dict devices() {
  MachineDevices m = query_devices();
  nb::dict out;
  out["cpu_isa"] = std::string(cpu_isa_name(m.cpu_isa));
  out["cpu_threads"] = m.cpu_threads;
  out["cpu_features"] = m.cpu_features;
  nb::list cuda;
  for (const CudaDeviceInfo& d : m.cuda) {
    nb::dict g;
    g["index"] = d.index;
    g["sm"] = d.sm;
    g["name"] = d.name;
    g["memory_gib"] = d.memory_gib;
    cuda.append(g);
  }
  out["cuda"] = cuda;
  out["cuda_status"] = m.cuda_status;
  return out;
}

}  // namespace
}  // namespace kvattn::python

NB_MODULE(_kvattn, m) {
  using namespace kvattn;
  using namespace kvattn::python;
  m.doc() = "kvattn's C++ API (internal: use the kvattn package)";
  // A wrapper kept in a module global still holds its plan when the interpreter exits; that is
  // not a leak worth a warning to every user.
  nb::set_leak_warnings(false);

  m.def("_set_error_classes", [](nb::dict classes) { error_classes() = classes; });
  m.def("error_code_names", [] {
    std::vector<std::string> names;
    for (int c = 0; c <= static_cast<int>(ErrorCode::kInternal); ++c) {
      names.emplace_back(error_code_name(static_cast<ErrorCode>(c)));
    }
    return names;
  });

  bind_problem(m);

  nb::class_<PyPlan>(m, "Plan")
      .def_prop_ro("backend", [](const PyPlan& p) { return p.plan.backend; })
      .def_prop_ro("device", [](const PyPlan& p) { return p.plan.device.to_string(); })
      .def_prop_ro("workspace_bytes", [](const PyPlan& p) { return p.plan.workspace_bytes; })
      .def_prop_ro("num_work_items", [](const PyPlan& p) { return p.plan.work.size(); })
      .def_prop_ro("kv_chunk_size", [](const PyPlan& p) { return p.plan.kv_chunk_size; })
      .def_prop_ro("num_threads", [](const PyPlan& p) { return p.plan.num_threads; })
      .def_prop_ro("qo_len", [](const PyPlan& p) { return p.plan.qo_len; })
      .def_prop_ro("kv_len", [](const PyPlan& p) { return p.plan.kv_len; })
      .def_prop_ro("problem", [](const PyPlan& p) { return p.plan.problem; })
      .def("__repr__", [](const PyPlan& p) {
        return "<kvattn plan: backend " + p.plan.backend + " on " + p.plan.device.to_string() +
               ", " + p.plan.problem.to_string() + ">";
      });

  m.def("plan", &make_plan, "problem"_a, "tensors"_a, "custom_mask_packed"_a, "backend"_a,
        "device"_a, "num_threads"_a, "kv_chunk_size"_a, "stream"_a = 0);
  m.def("run", &run_plan, "plan"_a, "tensors"_a, "workspace"_a.none(), "lse_base2"_a,
        "q_scale"_a.none(), "k_scale"_a.none(), "v_scale"_a.none(), "stream"_a = 0);

  m.def("time_cpp_run", &time_cpp_run, "plan"_a, "tensors"_a, "repeats"_a);
  m.def("explain", [](const Problem& problem, const std::string& device) {
    return explanation_dict(explain(problem, parse_device(device)));
  });
  m.def("select_backend",
        [](const Problem& problem, const std::string& device, const std::string& requested) {
          std::string selected;
          check(select_backend(problem, parse_device(device), requested, &selected));
          return selected;
        });
  m.def("backend_names", &backend_names);
  m.def("check_backend", [](const std::string& name) { check(check_backend_name(name)); });
  m.def("devices", &devices);
  m.def("set_cpu_threads",
        [](const std::string& mode) { check(set_cpu_threads(std::string_view(mode))); });
  m.def("cpu_threads", [] { return std::string(cpu_threads_name(cpu_threads())); });
  m.def("host_openmp_runtime", &host_openmp_runtime);

  m.def(
      "merge_state",
      [](Array v_a, Array s_a, Array v_b, Array s_b, Array v_out, std::optional<Array> s_out,
         const std::string& backend, const std::string& device, int num_threads, uintptr_t stream) {
        const TensorView va = to_view(v_a, "v_a"), sa = to_view(s_a, "s_a"),
                         vb = to_view(v_b, "v_b"), sb = to_view(s_b, "s_b"),
                         vo = to_view(v_out, "v_out"), so = optional_view(s_out, "s_out");
        const OpOptions o = op_options(backend, device, num_threads, stream);
        run_released([&] { return merge_state(va, sa, vb, sb, vo, so, o); });
      },
      "v_a"_a, "s_a"_a, "v_b"_a, "s_b"_a, "v_out"_a, "s_out"_a.none(), "backend"_a, "device"_a,
      "num_threads"_a, "stream"_a = 0);
  m.def(
      "merge_states",
      [](Array v, Array s, Array v_out, std::optional<Array> s_out, const std::string& backend,
         const std::string& device, int num_threads, uintptr_t stream) {
        const TensorView vv = to_view(v, "v"), sv = to_view(s, "s"), vo = to_view(v_out, "v_out"),
                         so = optional_view(s_out, "s_out");
        const OpOptions o = op_options(backend, device, num_threads, stream);
        run_released([&] { return merge_states(vv, sv, vo, so, o); });
      },
      "v"_a, "s"_a, "v_out"_a, "s_out"_a.none(), "backend"_a, "device"_a, "num_threads"_a,
      "stream"_a = 0);
  m.def(
      "append_paged_kv_cache",
      [](Array append_key, Array append_value, Array batch_indices, Array positions, Array k_cache,
         Array v_cache, Array kv_indices, Array kv_indptr, Array kv_last_page_len,
         const std::string& kv_layout, const std::string& cache_dtype, float k_scale, float v_scale,
         const std::string& scale_granularity, std::optional<Array> k_scale_cache,
         std::optional<Array> v_scale_cache, const std::string& backend, const std::string& device,
         int num_threads, uintptr_t stream) {
        std::optional<DType> cdt;
        if (!cache_dtype.empty()) cdt = parse_dtype(cache_dtype);
        PagedKVCache cache;
        cache.k_cache = to_view(k_cache, "k_cache", cdt);
        cache.v_cache = to_view(v_cache, "v_cache", cdt);
        cache.kv_indices = to_view(kv_indices, "kv_indices");
        cache.kv_indptr = to_view(kv_indptr, "kv_indptr");
        cache.kv_last_page_len = to_view(kv_last_page_len, "kv_last_page_len");
        std::optional<KVLayout> layout = parse_kv_layout(kv_layout);
        if (!layout) raise_invalid("kv_layout = '" + kv_layout + "': expected NHD or HND");
        cache.layout = *layout;
        cache.k_scale = k_scale;
        cache.v_scale = v_scale;
        std::optional<KVScaleGranularity> g = parse_kv_scale_granularity(scale_granularity);
        if (!g) {
          raise_invalid("kv_scale_granularity = '" + scale_granularity +
                        "': expected per_tensor, per_head or per_token_head");
        }
        cache.scale_granularity = *g;
        cache.k_scale_cache = optional_view(k_scale_cache, "k_scale_cache");
        cache.v_scale_cache = optional_view(v_scale_cache, "v_scale_cache");
        const TensorView ak = to_view(append_key, "append_key"),
                         av = to_view(append_value, "append_value"),
                         bi = to_view(batch_indices, "batch_indices"),
                         pos = to_view(positions, "positions");
        const OpOptions o = op_options(backend, device, num_threads, stream);
        run_released([&] { return append_paged_kv_cache(ak, av, bi, pos, cache, o); });
      },
      "append_key"_a, "append_value"_a, "batch_indices"_a, "positions"_a, "k_cache"_a, "v_cache"_a,
      "kv_indices"_a, "kv_indptr"_a, "kv_last_page_len"_a, "kv_layout"_a, "cache_dtype"_a,
      "k_scale"_a, "v_scale"_a, "scale_granularity"_a, "k_scale_cache"_a.none(),
      "v_scale_cache"_a.none(), "backend"_a, "device"_a, "num_threads"_a, "stream"_a = 0);
  m.def(
      "append_paged_mla_kv_cache",
      [](nb::handle append_ckv, nb::handle append_kpe, nb::handle batch_indices,
         nb::handle positions, nb::handle ckv_cache, nb::handle kpe_cache, nb::handle kv_indices,
         nb::handle kv_indptr, nb::handle kv_last_page_len, const std::string& cache_dtype,
         float k_scale, const std::string& backend, const std::string& device, int num_threads,
         uintptr_t stream) {
        std::optional<DType> cdt;
        if (!cache_dtype.empty()) cdt = parse_dtype(cache_dtype);
        PagedMLACache cache;
        cache.ckv_cache = object_view(ckv_cache, "ckv_cache", cdt);
        cache.kpe_cache = object_view(kpe_cache, "kpe_cache", cdt);
        cache.kv_indices = object_view(kv_indices, "kv_indices", {});
        cache.kv_indptr = object_view(kv_indptr, "kv_indptr", {});
        cache.kv_last_page_len = object_view(kv_last_page_len, "kv_last_page_len", {});
        cache.k_scale = k_scale;
        const TensorView ac = object_view(append_ckv, "append_ckv", {}),
                         ak = object_view(append_kpe, "append_kpe", {}),
                         bi = object_view(batch_indices, "batch_indices", {}),
                         pos = object_view(positions, "positions", {});
        const OpOptions o = op_options(backend, device, num_threads, stream);
        run_released([&] { return append_paged_mla_kv_cache(ac, ak, bi, pos, cache, o); });
      },
      "append_ckv"_a, "append_kpe"_a, "batch_indices"_a, "positions"_a, "ckv_cache"_a,
      "kpe_cache"_a, "kv_indices"_a, "kv_indptr"_a, "kv_last_page_len"_a, "cache_dtype"_a,
      "k_scale"_a, "backend"_a, "device"_a, "num_threads"_a, "stream"_a = 0);
  m.def(
      "apply_rope",
      [](Array q, Array k, std::optional<Array> q_out, std::optional<Array> k_out, Array pos_ids,
         float rope_theta, float rope_scale, bool interleave, int rotary_dim,
         std::optional<std::tuple<float, float, float>> llama31, std::optional<Array> cos_sin_cache,
         const std::string& backend, const std::string& device, int num_threads, uintptr_t stream) {
        const TensorView qv = to_view(q, "q"), kv = to_view(k, "k"),
                         qo = optional_view(q_out, "q_out"), ko = optional_view(k_out, "k_out"),
                         pv = to_view(pos_ids, "pos_ids");
        RopeParams rope;
        rope.rope_theta = rope_theta;
        rope.rope_scale = rope_scale;
        rope.interleave = interleave;
        set_rope_extensions(&rope, rotary_dim, llama31,
                            optional_view(cos_sin_cache, "cos_sin_cache"));
        const OpOptions o = op_options(backend, device, num_threads, stream);
        run_released([&] { return apply_rope(qv, kv, qo, ko, pv, rope, o); });
      },
      "q"_a, "k"_a, "q_out"_a.none(), "k_out"_a.none(), "pos_ids"_a, "rope_theta"_a, "rope_scale"_a,
      "interleave"_a, "rotary_dim"_a, "llama31"_a.none(), "cos_sin_cache"_a.none(), "backend"_a,
      "device"_a, "num_threads"_a, "stream"_a = 0);

  m.attr("__version__") = kvattn::version_string();
}
