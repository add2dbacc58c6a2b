// Where a problem runs: the CPU (with its ISA) or a CUDA GPU of some SM version. A device can be
// described without owning it ("cuda:sm90"), so selection can be exercised on any machine.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvattn {

// CPU instruction-set levels, lowest first. Kernels exist per level; the best one the machine
// has is chosen once at run time.
enum class CpuIsa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

std::string_view cpu_isa_name(CpuIsa isa);  // "scalar", "avx2", "avx512"
std::optional<CpuIsa> parse_cpu_isa(std::string_view name);

struct Device {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  // CUDA: compute capability as major*10+minor (80, 86, 89, 90, 100, 120). Unused for the CPU.
  int sm = 0;
  // CUDA: device ordinal.
  int index = 0;
  // CPU: the ISA level (the detected one unless described otherwise).
  CpuIsa isa = CpuIsa::kScalar;
  // True when the device was described ("cuda:sm90") rather than discovered on this machine.
  bool described = false;

  bool is_cpu() const { return kind == Kind::kCpu; }
  bool is_cuda() const { return kind == Kind::kCuda; }

  static Device cpu();              // this machine's CPU, detected ISA
  static Device cuda_sm(int sm);    // a described CUDA device
  // "cpu", "cpu:avx2", "cuda:sm90", "cuda:90", "sm90", "cuda" / "cuda:0" (first present GPU).
  static std::optional<Device> parse(std::string_view text, std::string* error = nullptr);
  std::string to_string() const;    // "cpu:avx512", "cuda:sm90"

  bool operator==(const Device&) const = default;
};

// What this machine has.
struct CudaDeviceInfo {
  int index = 0;
  int sm = 0;
  std::string name;
  double memory_gib = 0;
};
struct MachineDevices {
  CpuIsa cpu_isa = CpuIsa::kScalar;
  int cpu_threads = 1;
  std::string cpu_features;             // e.g. "avx512f avx512bw avx512_bf16 avx512_fp16 fma"
  std::vector<CudaDeviceInfo> cuda;     // empty when there is none
  std::string cuda_status;              // why there is none ("CUDA support not built", "no driver: ...")
};
MachineDevices query_devices();

}  // namespace kvattn
