// MLA in the tools: case files round-trip and replay to the same bits, their metadata holds
// MLA's own keys (the fields MLA fixes may be absent, and when present must read their fixed
// values), and the command line runs, checks, replays and explains batch_mla_paged.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include "testing/case_builder.h"
#include "tests/tools/temp_path.h"
#include "tools/case_file.h"
#include "tools/safetensors.h"

namespace kvattn::io {
namespace {

using Metadata = std::map<std::string, std::string, std::less<>>;

testing::CaseSpec mla_spec(DType kv) {
  testing::CaseSpec s;
  s.problem = make_mla_problem(3, 16, 4, 0.125f, 64, 16);
  s.problem.kv_dtype = kv;
  if (is_fp8(kv)) s.scalars.k_scale = 0.5f;
  s.problem.mask_mode = MaskMode::kCausal;
  s.return_lse = true;
  s.qo_lens = {2, 0, 3};
  s.kv_lens = {9, 0, 13};
  s.seed = 42;
  return s;
}

Status run_on(const std::string& backend, const Problem& p, const AttentionArgs& a) {
  PlanOptions options;
  options.backend = backend;
  return run(p, a, options);
}

TEST(MlaCaseFileTest, RoundTripAndReplayGiveTheSameBits) {
  for (DType kv : {DType::kBF16, DType::kE4M3}) {
    testing::Case c = testing::Case::make(mla_spec(kv));
    OwnedCase captured;
    ASSERT_TRUE(capture_case(c, &captured).ok());
    std::vector<uint8_t> file;
    ASSERT_TRUE(serialize_case(captured, &file).ok());
    OwnedCase loaded;
    const Status s = parse_case(file.data(), file.size(), &loaded);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(loaded.problem.to_string(), c.problem().to_string());
    EXPECT_EQ(loaded.qo_lens, c.qo_lens());
    EXPECT_EQ(loaded.kv_lens, c.kv_lens());
    EXPECT_EQ(loaded.bytes_moved(), c.bytes_moved());
    std::vector<uint8_t> again;
    ASSERT_TRUE(serialize_case(loaded, &again).ok());
    EXPECT_EQ(again, file);
    for (const char* backend : {"reference", "cpu"}) {
      AttentionArgs original = c.args();
      ASSERT_TRUE(run_on(backend, c.problem(), original).ok()) << backend;
      OutputBuffers replay;
      AttentionArgs replay_args =
          loaded.args_with_outputs(&replay, loaded.problem.o_dtype, loaded.run.return_lse);
      ASSERT_TRUE(run_on(backend, loaded.problem, replay_args).ok()) << backend;
      EXPECT_TRUE(replay.out == c.out) << backend << ": output bits differ";
      EXPECT_TRUE(replay.lse == c.lse) << backend << ": lse bits differ";
    }
  }
}

// The case file's tensors and metadata as the issue names them.
TEST(MlaCaseFileTest, NamesAndMetadataKeys) {
  testing::Case c = testing::Case::make(mla_spec(DType::kE4M3));
  OwnedCase captured;
  ASSERT_TRUE(capture_case(c, &captured).ok());
  std::vector<uint8_t> file;
  ASSERT_TRUE(serialize_case(captured, &file).ok());
  SafeTensors st;
  ASSERT_TRUE(parse_safetensors(file.data(), file.size(), &st).ok());
  for (const char* name : {"q_nope", "q_pe", "ckv_cache", "kpe_cache", "kv_indptr", "kv_indices",
                           "kv_last_page_len", "qo_indptr"}) {
    EXPECT_NE(st.find(name), nullptr) << name;
  }
  EXPECT_EQ(st.find("q_nope")->shape, (std::vector<int64_t>{5, 16, 64}));
  EXPECT_EQ(st.find("kpe_cache")->shape[2], 16);
  const Metadata& m = st.metadata;
  EXPECT_EQ(m.at("op"), "batch_mla_paged");
  EXPECT_EQ(m.at("head_dim_ckv"), "64");
  EXPECT_EQ(m.at("head_dim_kpe"), "16");
  EXPECT_EQ(m.at("sm_scale"), "0.125");
  EXPECT_EQ(m.at("k_scale"), "0.5");
  EXPECT_EQ(m.at("causal"), "true");
  for (const char* fixed : {"num_kv_heads", "head_dim_qk", "head_dim_vo", "kv_layout"}) {
    EXPECT_EQ(m.count(fixed), 0u) << fixed;
  }
}

// Rewrites one metadata key (or removes it, value empty) and parses again.
Status parse_with(const std::vector<uint8_t>& file, const std::string& key,
                  const std::string& value) {
  SafeTensors st;
  EXPECT_TRUE(parse_safetensors(file.data(), file.size(), &st).ok());
  Metadata m = st.metadata;
  if (value.empty()) {
    m.erase(key);
  } else {
    m[key] = value;
  }
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, t] : st.tensors) {
    tensors.push_back({name, t.dtype, t.shape, std::as_bytes(t.bytes)});
  }
  std::vector<uint8_t> bytes;
  EXPECT_TRUE(serialize_safetensors(tensors, m, &bytes).ok());
  OwnedCase out;
  return parse_case(bytes.data(), bytes.size(), &out);
}

TEST(MlaCaseFileTest, FixedKeysMayBeAbsentOrMustReadTheirValues) {
  testing::Case c = testing::Case::make(mla_spec(DType::kBF16));
  OwnedCase captured;
  ASSERT_TRUE(capture_case(c, &captured).ok());
  std::vector<uint8_t> file;
  ASSERT_TRUE(serialize_case(captured, &file).ok());
  for (auto [key, good, bad] : {std::array<const char*, 3>{"num_kv_heads", "1", "2"},
                                {"head_dim_qk", "80", "576"},
                                {"head_dim_vo", "64", "80"},
                                {"kv_layout", "NHD", "HND"}}) {
    EXPECT_TRUE(parse_with(file, key, good).ok()) << key;
    const Status s = parse_with(file, key, bad);
    EXPECT_EQ(s.code(), ErrorCode::kParseError) << key;
    EXPECT_NE(s.message().find(key), std::string::npos) << s.message();
  }
  const Status no_scale = parse_with(file, "sm_scale", "");
  EXPECT_EQ(no_scale.code(), ErrorCode::kParseError);
  EXPECT_NE(no_scale.message().find("sm_scale"), std::string::npos) << no_scale.message();
  const Status wide = parse_with(file, "head_dim_ckv", "128");
  EXPECT_EQ(wide.code(), ErrorCode::kParseError);
  EXPECT_NE(wide.message().find("128]"), std::string::npos) << wide.message();
}

struct Result {
  int exit_code = -1;
  std::string output;
};

Result kvattn_cli(const std::string& args) {
  const std::string command = std::string(KVATTN_CLI_PATH) + " " + args + " 2>&1";
  Result r;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(MlaCliTest, RunCheckSaveReplayAndExplain) {
  const std::string case_path = temp_path("mla_case.safetensors");
  Result r = kvattn_cli(
      "run --backend cpu --op batch_mla_paged --num-qo-heads 32 --head-dim-ckv 512 "
      "--head-dim-kpe 64 --page-size 16 --sm-scale 0.1352 --kv-len 70,33,0 --qo-len 1,2,1 "
      "--causal --kv-data-type e4m3 --k-scale 0.25 --return-lse --repeat 1 --check --save-case " +
      case_path);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("backend: cpu"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("check: PASS"), std::string::npos) << r.output;
  r = kvattn_cli("run --backend cpu --repeat 1 --check --case " + case_path);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("check: PASS"), std::string::npos) << r.output;

  r = kvattn_cli("run --op batch_mla_paged --num-qo-heads 16 --kv-len 8 --repeat 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("sm_scale"), std::string::npos) << r.output;
  r = kvattn_cli(
      "run --op batch_mla_paged --num-qo-heads 16 --sm-scale 1 --head-dim-vo 64 --repeat 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("head_dim_vo"), std::string::npos) << r.output;

  r = kvattn_cli(
      "explain --device cuda:sm90 --op batch_mla_paged --num-qo-heads 128 "
      "--sm-scale 0.1352");
  for (const char* backend : {"fa3:", "fa2:", "reference:", "cpu:"}) {
    EXPECT_NE(r.output.find(backend), std::string::npos) << backend << "\n" << r.output;
  }
  EXPECT_NE(r.output.find("no MLA kernel"), std::string::npos) << r.output;
  r = kvattn_cli("explain --op batch_mla_paged --num-qo-heads 128 --sm-scale 0.1352");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("selected: cpu"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kvattn::io
