// The CUDA runtime query on a machine without a usable GPU (this CI machine: no driver) must
// answer "no CUDA device" with the runtime's reason, never abort; selection on described devices
// keeps working. On a machine with a GPU the same tests check the discovered devices instead.
#include <gtest/gtest.h>

#include "core/backend.h"
#include "core/cuda_query.h"
#include "kvattn/kvattn.h"

namespace kvattn {
namespace {

std::vector<CudaDeviceInfo> devices_here(std::string* why) {
  std::vector<CudaDeviceInfo> devices;
  detail::query_cuda_devices(&devices, why);
  return devices;
}

TEST(CudaRuntimeQueryTest, ReturnsCleanlyAndExplainsAnEmptyList) {
  std::string why;
  std::vector<CudaDeviceInfo> devices = devices_here(&why);
  if (devices.empty()) {
    EXPECT_FALSE(why.empty());
    if (detail::cuda_support_built()) {
      EXPECT_EQ(why.rfind("no CUDA device: ", 0), 0u) << why;
    } else {
      EXPECT_NE(why.find("not built"), std::string::npos) << why;
    }
  } else {
    for (const CudaDeviceInfo& d : devices) {
      EXPECT_GE(d.sm, 30) << d.name;
      EXPECT_GT(d.memory_gib, 0.0) << d.name;
    }
  }
  // Asking twice gives the same answer (no sticky runtime error leaks into the second call).
  std::string why_again;
  EXPECT_EQ(devices_here(&why_again).size(), devices.size());
  EXPECT_EQ(why_again, why);
  MachineDevices m = query_devices();
  EXPECT_EQ(m.cuda.size(), devices.size());
  EXPECT_EQ(m.cuda_status, why);
}

TEST(CudaRuntimeQueryTest, CudaZeroFailsWithAReasonWhenThereIsNoDevice) {
  std::string why;
  if (!devices_here(&why).empty()) GTEST_SKIP() << "this machine has a CUDA device";
  std::string error;
  std::optional<Device> d = Device::parse("cuda:0", &error);
  EXPECT_FALSE(d.has_value());
  EXPECT_NE(error.find(why), std::string::npos) << error;
}

TEST(CudaRuntimeQueryTest, Fa2AvailabilitySaysWhyAndSelectionOnDescribedDevicesWorks) {
  std::string why;
  if (!devices_here(&why).empty()) GTEST_SKIP() << "this machine has a CUDA device";
  Status s = fa2_backend().available(Device::cuda_sm(90));
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kUnavailable);
  const std::string expected = detail::cuda_support_built() ? why : "not built";
  EXPECT_NE(s.message().find(expected), std::string::npos) << s.message();

  // The founding case on a described Hopper still selects fa2 (capability, not availability),
  // and fa2's verdict carries the availability reason.
  Problem p;
  p.op = Op::kBatchDecode;
  p.q_dtype = DType::kBF16;
  p.kv_dtype = DType::kE4M3;
  Explanation e = explain(p, Device::cuda_sm(90));
  ASSERT_TRUE(e.selected.has_value());
  EXPECT_EQ(*e.selected, "fa2");
  for (const Verdict& v : e.verdicts) {
    if (v.backend != "fa2") continue;
    EXPECT_TRUE(v.supported) << v.reason;
    EXPECT_FALSE(v.available);
    EXPECT_NE(v.availability.find(expected), std::string::npos) << v.availability;
  }
}

}  // namespace
}  // namespace kvattn
