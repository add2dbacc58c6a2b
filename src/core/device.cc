#include "kvattn/device.h"

#include <charconv>
#include <thread>

#include "core/cpu_features.h"
#include "core/cuda_query.h"

namespace kvattn {

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return "scalar";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "?";
}

std::optional<CpuIsa> parse_cpu_isa(std::string_view name) {
  if (name == "scalar") return CpuIsa::kScalar;
  if (name == "avx2") return CpuIsa::kAvx2;
  if (name == "avx512") return CpuIsa::kAvx512;
  return std::nullopt;
}

Device Device::cpu() {
  Device d;
  d.kind = Kind::kCpu;
  d.isa = detail::effective_cpu_isa();
  return d;
}

Device Device::cuda_sm(int sm) {
  Device d;
  d.kind = Kind::kCuda;
  d.sm = sm;
  d.described = true;
  return d;
}

namespace {
bool parse_int(std::string_view s, int* out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}
}  // namespace

std::optional<Device> Device::parse(std::string_view text, std::string* error) {
  auto fail = [&](std::string why) -> std::optional<Device> {
    if (error) *error = "device '" + std::string(text) + "': " + why;
    return std::nullopt;
  };
  if (text == "cpu") return Device::cpu();
  if (text.substr(0, 4) == "cpu:") {
    auto isa = parse_cpu_isa(text.substr(4));
    if (!isa) return fail("unknown CPU ISA (expected scalar, avx2 or avx512)");
    Device d = Device::cpu();
    d.isa = *isa;
    d.described = *isa > detail::cpu_features().best;
    return d;
  }
  std::string_view rest = text;
  if (rest.substr(0, 4) == "cuda") {
    rest.remove_prefix(4);
    if (rest.empty() || rest.substr(0, 1) == ":") {
      if (!rest.empty()) rest.remove_prefix(1);
      int ordinal = 0;
      if (rest.empty() || (rest.substr(0, 2) != "sm" && parse_int(rest, &ordinal))) {
        std::vector<CudaDeviceInfo> devices;
        std::string status;
        detail::query_cuda_devices(&devices, &status);
        for (const auto& info : devices) {
          if (info.index == ordinal) {
            Device d;
            d.kind = Kind::kCuda;
            d.sm = info.sm;
            d.index = ordinal;
            return d;
          }
        }
        return fail("no such CUDA device on this machine (" +
                    (devices.empty() ? status : std::to_string(devices.size()) + " present") +
                    "); describe one instead, e.g. cuda:sm90");
      }
    } else {
      return fail("expected cpu, cpu:ISA, cuda, cuda:N or cuda:smNN");
    }
  }
  if (rest.substr(0, 2) == "sm") rest.remove_prefix(2);
  int sm = 0;
  if (!parse_int(rest, &sm) || sm < 10 || sm > 200) {
    return fail("expected cpu, cpu:ISA, cuda, cuda:N or cuda:smNN (e.g. cuda:sm90)");
  }
  return Device::cuda_sm(sm);
}

std::string Device::to_string() const {
  if (is_cpu()) return "cpu:" + std::string(cpu_isa_name(isa));
  return "cuda:sm" + std::to_string(sm);
}

MachineDevices query_devices() {
  MachineDevices m;
  m.cpu_isa = detail::effective_cpu_isa();
  unsigned n = std::thread::hardware_concurrency();
  m.cpu_threads = n ? static_cast<int>(n) : 1;
  m.cpu_features = detail::cpu_features().to_string();
  detail::query_cuda_devices(&m.cuda, &m.cuda_status);
  return m;
}

}  // namespace kvattn
