// The founding case and the rules of selection (DESIGN.md §3). The full grid is in
// selection_conformance_test.cc.
#include <gtest/gtest.h>

#include "kvattn/kvattn.h"

namespace kvattn {
namespace {

Problem founding_case(Op op) {
  Problem p;
  p.op = op;
  p.batch_size = 4;
  p.num_qo_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim_qk = p.head_dim_vo = 128;
  p.q_dtype = DType::kBF16;
  p.kv_dtype = DType::kE4M3;
  p.o_dtype = DType::kBF16;
  p.mask_mode = MaskMode::kCausal;
  return p;
}

// A backend name is checked before there is a problem (the Python wrappers' constructors) by the
// same rule select_backend applies.
TEST(SelectionTest, CheckBackendNameAcceptsAutoAndEveryRegisteredName) {
  EXPECT_TRUE(check_backend_name("").ok());
  EXPECT_TRUE(check_backend_name("auto").ok());
  for (const std::string& name : backend_names()) EXPECT_TRUE(check_backend_name(name).ok());
  Status s = check_backend_name("fa4");
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("backend 'fa4' is unknown (expected auto or one of:"),
            std::string::npos)
      << s.message();
  for (const std::string& name : backend_names()) {
    EXPECT_NE(s.message().find(" " + name), std::string::npos) << s.message();
  }
  std::string selected;
  Status via_select =
      select_backend(founding_case(Op::kBatchDecode), Device::cpu(), "fa4", &selected);
  EXPECT_EQ(via_select.message(), s.message());
}

TEST(SelectionTest, FoundingCaseSelectsFa2OnHopper) {
  for (Op op : {Op::kBatchPrefillPaged, Op::kBatchPrefillRagged}) {
    Explanation e = explain(founding_case(op), Device::cuda_sm(90));
    ASSERT_TRUE(e.selected.has_value());
    EXPECT_EQ(*e.selected, "fa2");
    bool saw_fa3 = false;
    for (const Verdict& v : e.verdicts) {
      if (v.backend != "fa3") continue;
      saw_fa3 = true;
      EXPECT_FALSE(v.supported);
      EXPECT_NE(v.reason.find("FP8 KV"), std::string::npos) << v.reason;
      EXPECT_NE(v.reason.find("needs an FP8 query"), std::string::npos) << v.reason;
    }
    EXPECT_TRUE(saw_fa3);
  }
}

TEST(SelectionTest, ForcingFa3OnFoundingCaseIsAnError) {
  std::string selected;
  Status s =
      select_backend(founding_case(Op::kBatchPrefillPaged), Device::cuda_sm(90), "fa3", &selected);
  EXPECT_EQ(s.code(), ErrorCode::kNotSupported);
  EXPECT_NE(s.message().find("fa3"), std::string::npos);
  EXPECT_NE(s.message().find("needs an FP8 query"), std::string::npos);
  EXPECT_NE(s.message().find("fa2 would run it"), std::string::npos) << s.message();
}

TEST(SelectionTest, CpuPrefersCpuThenReference) {
  Problem p = founding_case(Op::kBatchDecode);
  Explanation e = explain(p, Device::cpu());
  ASSERT_TRUE(e.selected.has_value());
  EXPECT_TRUE(*e.selected == "cpu" || *e.selected == "reference");
  EXPECT_EQ(e.verdicts.size(), backend_names().size());
}

}  // namespace
}  // namespace kvattn
