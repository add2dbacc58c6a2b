#include "cuda/gpu/device_mirror.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "core/cuda_query.h"

namespace kvattn::fa2::test {

std::optional<Device> gpu_or_reason(std::string* why) { return gpu_or_reason(why, 80, 1000); }

std::optional<Device> gpu_or_reason(std::string* why, int min_sm, int max_sm) {
  std::vector<CudaDeviceInfo> devices;
  detail::query_cuda_devices(&devices, why);
  for (const CudaDeviceInfo& d : devices) {
    if (d.sm >= min_sm && d.sm <= max_sm) {
      std::optional<Device> dev = Device::parse("cuda:" + std::to_string(d.index), why);
      if (dev) return dev;
    }
  }
  if (!devices.empty()) {
    *why = "no CUDA device of SM" + std::to_string(min_sm) + (max_sm == min_sm ? "" : " or newer");
  }
  return std::nullopt;
}

DeviceMirror::~DeviceMirror() {
  for (void* p : buffers_) (void)cudaFree(p);
}

TensorView DeviceMirror::to_device(const TensorView& host) {
  if (host.empty() || host.memory == MemoryKind::kCuda) return host;
  TensorView d = host;
  void* ptr = nullptr;
  const size_t bytes = size_t(std::max<int64_t>(host.buffer_bytes, 1));
  if (cudaMalloc(&ptr, bytes) != cudaSuccess) return TensorView{};
  buffers_.push_back(ptr);
  if (host.buffer_bytes > 0) {
    (void)cudaMemcpy(ptr, host.data, size_t(host.buffer_bytes), cudaMemcpyHostToDevice);
  }
  d.data = ptr;
  d.memory = MemoryKind::kCuda;
  d.device_index = 0;
  return d;
}

void DeviceMirror::to_host(const TensorView& device, const TensorView& host) const {
  if (device.empty() || host.empty() || host.buffer_bytes <= 0) return;
  (void)cudaMemcpy(host.data, device.data, size_t(host.buffer_bytes), cudaMemcpyDeviceToHost);
}

AttentionArgs mirror_args(const Problem&, const AttentionArgs& host, DeviceMirror* m) {
  AttentionArgs d = host;
  d.q = m->to_device(host.q);
  d.k = m->to_device(host.k);
  d.v = m->to_device(host.v);
  d.paged_k_cache = m->to_device(host.paged_k_cache);
  d.paged_v_cache = m->to_device(host.paged_v_cache);
  d.custom_mask = m->to_device(host.custom_mask);
  d.alibi_slopes = m->to_device(host.alibi_slopes);
  d.sinks = m->to_device(host.sinks);
  d.k_scale = m->to_device(host.k_scale);
  d.v_scale = m->to_device(host.v_scale);
  d.k_scale_cache = m->to_device(host.k_scale_cache);
  d.v_scale_cache = m->to_device(host.v_scale_cache);
  d.out = m->to_device(host.out);
  d.lse = m->to_device(host.lse);
  return d;
}

testing::RunBackend run_fa2(const Device& device, int64_t kv_chunk_size) {
  return run_backend("fa2", device, kv_chunk_size);
}

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void log_case_time(const std::string& what, std::chrono::steady_clock::time_point t0) {
  std::fprintf(stderr, "[ case     ] %s: %.0f ms with the reference\n", what.c_str(), ms_since(t0));
}

KeyShard key_shard_from_env() {
  const char* v = std::getenv("KVATTN_GPU_KEY_SHARD");
  if (v == nullptr || *v == '\0') return {};
  KeyShard s;
  char tail = 0;
  if (std::sscanf(v, "%d/%d%c", &s.index, &s.count, &tail) != 2 || s.count < 1 || s.index < 0 ||
      s.index >= s.count) {
    std::fprintf(stderr, "KVATTN_GPU_KEY_SHARD=\"%s\": expected i/n with 0 <= i < n (e.g. 0/4)\n",
                 v);
    std::exit(2);
  }
  return s;
}

testing::RunBackend run_backend(std::string backend, const Device& device, int64_t kv_chunk_size) {
  return [backend, device, kv_chunk_size](const Problem& problem,
                                          const AttentionArgs& host) -> Status {
    // One line per launch, written before the GPU is waited for: a hang names its problem in
    // the log, and the time tells the GPU's share of a slow test from the reference's.
    std::fprintf(stderr, "[ gpu run  ] %s %s\n", backend.c_str(), problem.to_string().c_str());
    const auto t0 = std::chrono::steady_clock::now();
    DeviceMirror mirror;
    AttentionArgs args = mirror_args(problem, host, &mirror);
    PlanOptions options;
    options.backend = backend;
    options.device = device;
    options.kv_chunk_size = kv_chunk_size;
    Plan plan;
    Status st = kvattn::plan(problem, args, options, &plan);
    if (!st.ok()) return st;
    st = kvattn::run(plan, args);
    if (!st.ok()) return st;
    cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
      return Status(ErrorCode::kInternal, std::string("CUDA: ") + cudaGetErrorString(err));
    }
    mirror.to_host(args.out, host.out);
    mirror.to_host(args.lse, host.lse);
    std::fprintf(stderr, "[ gpu done ] %.1f ms (copies, plan, run, synchronize)\n", ms_since(t0));
    return Status::Ok();
  };
}

testing::RunBackend run_fa2_graph(const Device& device, int64_t kv_chunk_size) {
  return [device, kv_chunk_size](const Problem& problem, const AttentionArgs& host) -> Status {
    const auto failed = [](const char* what, cudaError_t err) {
      return Status(ErrorCode::kInternal, std::string(what) + ": " + cudaGetErrorString(err));
    };
    DeviceMirror mirror;
    AttentionArgs args = mirror_args(problem, host, &mirror);
    cudaStream_t stream;
    cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) return failed("cudaStreamCreate", err);
    PlanOptions options;
    options.backend = "fa2";
    options.device = device;
    options.kv_chunk_size = kv_chunk_size;
    options.stream = stream;
    Plan plan;
    Status st = kvattn::plan(problem, args, options, &plan);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    if (st.ok()) {
      err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
      if (err != cudaSuccess) st = failed("cudaStreamBeginCapture", err);
    }
    if (st.ok()) {
      const Status ran = kvattn::run(plan, args);
      err = cudaStreamEndCapture(stream, &graph);
      st = !ran.ok() ? ran : err != cudaSuccess ? failed("cudaStreamEndCapture", err) : ran;
    }
    if (st.ok() && (err = cudaGraphInstantiate(&exec, graph, 0)) != cudaSuccess) {
      st = failed("cudaGraphInstantiate", err);
    }
    for (int replay = 0; st.ok() && replay < 2; ++replay) {
      if ((err = cudaGraphLaunch(exec, stream)) != cudaSuccess) st = failed("cudaGraphLaunch", err);
    }
    if (st.ok() && (err = cudaStreamSynchronize(stream)) != cudaSuccess) {
      st = failed("cudaStreamSynchronize", err);
    }
    if (exec) (void)cudaGraphExecDestroy(exec);
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaStreamDestroy(stream);
    if (!st.ok()) return st;
    mirror.to_host(args.out, host.out);
    mirror.to_host(args.lse, host.lse);
    return Status::Ok();
  };
}

}  // namespace kvattn::fa2::test
