// Case files: a random case saved and loaded again replays to the same output bits, in every
// operation and layout; a malformed case file is a kParseError naming what is wrong.
#include "tools/case_file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>

#include "kvattn/problem_text.h"
#include "testing/case_builder.h"
#include "tests/tools/temp_path.h"
#include "tools/safetensors.h"

namespace kvattn::io {
namespace {

using Metadata = std::map<std::string, std::string, std::less<>>;

struct Variant {
  const char* name;
  std::function<void(testing::CaseSpec*)> apply;
};

std::vector<Variant> variants() {
  return {
      {"plain", [](testing::CaseSpec*) {}},
      {"causal_lse",
       [](testing::CaseSpec* s) {
         s->problem.mask_mode = MaskMode::kCausal;
         s->return_lse = true;
       }},
      {"custom_mask", [](testing::CaseSpec* s) { s->problem.mask_mode = MaskMode::kCustom; }},
      {"packed_custom_mask",
       [](testing::CaseSpec* s) {
         s->problem.mask_mode = MaskMode::kCustom;
         s->packed_custom_mask = true;
       }},
      {"combined_cache_fp8",
       [](testing::CaseSpec* s) {
         s->combined_kv_cache = true;
         s->problem.kv_dtype = DType::kE4M3;
         s->scalars.k_scale = 0.5f;
         s->scalars.v_scale = 1.75f;
       }},
      {"alibi_window_softcap",
       [](testing::CaseSpec* s) {
         s->problem.pos_encoding_mode = PosEncoding::kAlibi;
         s->problem.window_left = 5;
         s->problem.logits_soft_cap = 20.0f;
         s->problem.sm_scale = 0.1f;
       }},
      {"rope_f16_192",
       [](testing::CaseSpec* s) {
         s->problem.pos_encoding_mode = PosEncoding::kRopeLlama;
         s->problem.rope_theta = 5e5f;
         s->problem.rope_scale = 2.0f;
         s->problem.rope_interleave = true;
         s->problem.q_dtype = s->problem.kv_dtype = s->problem.o_dtype = DType::kF16;
         s->problem.head_dim_qk = 192;
         s->problem.head_dim_vo = 128;
       }},
      {"sinks_per_token_head_e4m3",
       [](testing::CaseSpec* s) {
         s->problem.use_sinks = true;
         s->problem.kv_dtype = DType::kE4M3;
         s->problem.kv_scale_granularity = KVScaleGranularity::kPerTokenHead;
         s->problem.mask_mode = MaskMode::kCausal;
         s->return_lse = true;
       }},
      {"per_head_e5m2_d96",
       [](testing::CaseSpec* s) {
         s->problem.kv_dtype = DType::kE5M2;
         s->problem.kv_scale_granularity = KVScaleGranularity::kPerHead;
         s->problem.head_dim_qk = s->problem.head_dim_vo = 96;
       }},
  };
}

testing::CaseSpec base_spec(Op op, KVLayout layout) {
  testing::CaseSpec s;
  Problem& p = s.problem;
  p.op = op;
  p.num_qo_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim_qk = p.head_dim_vo = 32;
  p.page_size = 4;
  p.kv_layout = layout;
  p.q_dtype = p.kv_dtype = p.o_dtype = DType::kBF16;
  if (is_batch(op)) {
    p.batch_size = 3;
    s.kv_lens = {9, 0, 13};
    if (!is_decode(op)) s.qo_lens = {3, 0, 5};
  } else {
    p.batch_size = 1;
    s.kv_lens = {11};
    if (!is_decode(op)) s.qo_lens = {4};
  }
  s.seed = 42;
  return s;
}

Status run_reference(const Problem& p, const AttentionArgs& a) {
  PlanOptions options;
  options.backend = "reference";
  return run(p, a, options);
}

TEST(CaseFileTest, ReplayGivesTheSameOutputBits) {
  const Op ops[] = {Op::kSingleDecode, Op::kSinglePrefill, Op::kBatchDecode, Op::kBatchPrefillPaged,
                    Op::kBatchPrefillRagged};
  int replayed = 0;
  for (Op op : ops) {
    for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      for (const Variant& v : variants()) {
        testing::CaseSpec spec = base_spec(op, layout);
        v.apply(&spec);
        if (!is_paged(spec.problem.op)) spec.combined_kv_cache = false;
        SCOPED_TRACE(std::string(op_name(op)) + " " + std::string(kv_layout_name(layout)) + " " +
                     v.name);
        testing::Case c = testing::Case::make(spec);
        const Problem& p = c.problem();

        OwnedCase captured;
        ASSERT_TRUE(capture_case(c, &captured).ok());
        std::vector<uint8_t> file;
        ASSERT_TRUE(serialize_case(captured, &file).ok());
        OwnedCase loaded;
        Status s = parse_case(file.data(), file.size(), &loaded);
        ASSERT_TRUE(s.ok()) << s.to_string();

        EXPECT_EQ(loaded.problem.to_string(), p.to_string());
        EXPECT_EQ(loaded.qo_lens, c.qo_lens());
        EXPECT_EQ(loaded.kv_lens, c.kv_lens());
        EXPECT_EQ(loaded.extra_metadata.at("seed"), "42");
        EXPECT_EQ(loaded.bytes_moved(), c.bytes_moved());
        EXPECT_DOUBLE_EQ(loaded.flops(), c.flops());
        // Saving what was loaded writes the same file.
        std::vector<uint8_t> again;
        ASSERT_TRUE(serialize_case(loaded, &again).ok());
        EXPECT_EQ(again, file);

        // The reference on the original views (shuffled pages, combined caches, packed masks)
        // and on the replayed contiguous tensors: the same bits.
        AttentionArgs original = c.args();
        ASSERT_TRUE(run_reference(p, original).ok());
        OutputBuffers replay;
        // The run values travel with the case (metadata q_scale, ..., return_lse).
        EXPECT_EQ(loaded.run.return_lse, c.spec().return_lse);
        EXPECT_EQ(loaded.run.k_scale, c.spec().scalars.k_scale);
        EXPECT_EQ(loaded.run.v_scale, c.spec().scalars.v_scale);
        AttentionArgs replay_args =
            loaded.args_with_outputs(&replay, p.o_dtype, loaded.run.return_lse);
        s = run_reference(loaded.problem, replay_args);
        ASSERT_TRUE(s.ok()) << s.to_string();
        ASSERT_EQ(replay.out.size(), c.out.size());
        EXPECT_TRUE(replay.out == c.out) << "output bits differ";
        EXPECT_TRUE(replay.lse == c.lse) << "lse bits differ";
        ++replayed;
      }
    }
  }
  EXPECT_EQ(replayed, 5 * 2 * 9);
}

TEST(CaseFileTest, SaveLoadFileAndOutput) {
  testing::CaseSpec spec = base_spec(Op::kBatchDecode, KVLayout::kHND);
  spec.return_lse = true;
  testing::Case c = testing::Case::make(spec);
  OwnedCase captured;
  ASSERT_TRUE(capture_case(c, &captured).ok());
  const std::string path = temp_path("kvattn_case_test.safetensors");
  ASSERT_TRUE(save_case(path, captured).ok());
  OwnedCase loaded;
  ASSERT_TRUE(load_case(path, &loaded).ok());
  EXPECT_EQ(loaded.problem.to_string(), c.problem().to_string());
  EXPECT_EQ(load_case(path + ".none", &loaded).code(), ErrorCode::kIoError);

  OutputBuffers o;
  AttentionArgs a = loaded.args_with_outputs(&o, loaded.problem.o_dtype, true);
  Status s = run_reference(loaded.problem, a);
  ASSERT_TRUE(s.ok()) << s.to_string();
  const std::string out_path = temp_path("kvattn_case_test_out.safetensors");
  ASSERT_TRUE(
      save_output(out_path, loaded.problem, loaded.run, a.out, a.lse, {{"backend", "reference"}})
          .ok());
  SafeTensorsFile f;
  ASSERT_TRUE(read_safetensors_file(out_path, &f).ok());
  const SafeTensor* out = f.contents.find("out");
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(out->shape, (std::vector<int64_t>{3, 4, 32}));
  EXPECT_EQ(out->dtype, DType::kBF16);
  ASSERT_NE(f.contents.find("lse"), nullptr);
  EXPECT_EQ(f.contents.find("lse")->shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(f.contents.metadata.at("backend"), "reference");
  EXPECT_EQ(f.contents.metadata.at("op"), "batch_decode");
}

TEST(CaseFileTest, MetadataIsSpelledAsOnTheCommandLine) {
  Problem p;
  p.op = Op::kBatchPrefillRagged;
  p.q_dtype = DType::kE4M3;
  p.kv_dtype = DType::kE5M2;
  p.mask_mode = MaskMode::kCausal;
  p.sm_scale = 0.125f;
  p.rope_theta = 500000.0f;
  RunValues run;
  run.k_scale = 0.0123f;
  run.return_lse = true;
  Metadata m = problem_to_fields(p, run);
  EXPECT_EQ(m.at("op"), "batch_prefill_ragged");
  EXPECT_EQ(m.at("q_data_type"), "e4m3");
  EXPECT_EQ(m.at("kv_data_type"), "e5m2");
  EXPECT_EQ(m.at("causal"), "true");
  EXPECT_EQ(m.at("custom_mask"), "false");
  EXPECT_EQ(m.at("sm_scale"), "0.125");
  EXPECT_EQ(m.at("k_scale"), "0.0123");
  EXPECT_EQ(m.at("rope_theta"), "500000");
  EXPECT_EQ(m.at("return_lse"), "true");
  EXPECT_EQ(m.at("window_left"), "-1");
  EXPECT_EQ(m.at("kv_layout"), "NHD");
  EXPECT_EQ(m.at("pos_encoding_mode"), "NONE");
  EXPECT_EQ(m.at("kv_scale_granularity"), "per_tensor");
  EXPECT_EQ(m.at("use_sinks"), "false");
  // Every key reads back into the same problem.
  ProblemDraft draft;
  for (const auto& [key, value] : m) {
    const ProblemField* f = find_problem_field(key);
    ASSERT_NE(f, nullptr) << key;
    std::string why;
    ASSERT_TRUE(f->set(value, &draft, &why)) << key << ": " << why;
  }
  Problem back;
  ASSERT_TRUE(finish_problem(draft, &back).ok());
  EXPECT_EQ(back.to_string(), p.to_string());
}

TEST(CaseFileTest, FloatsRoundTripThroughTheirDecimalSpelling) {
  std::mt19937 rng(3);
  for (int i = 0; i < 100000; ++i) {
    uint32_t bits = static_cast<uint32_t>(rng());
    float f = 0;
    std::memcpy(&f, &bits, 4);
    if (!std::isfinite(f)) continue;
    std::string text = format_float(f);
    EXPECT_EQ(text.find_first_of("eE"), std::string::npos) << text;
    float back = 0;
    ASSERT_TRUE(parse_float(text, &back)) << text;
    EXPECT_EQ(std::memcmp(&back, &f, 4), 0) << text;
  }
}

// A valid batch_prefill_paged case, as tensors and metadata that a test then breaks.
struct RawCase {
  std::vector<TensorToWrite> tensors;
  Metadata metadata;
  std::map<std::string, std::vector<std::byte>> storage;  // owned replacement bytes
  OwnedCase owned;

  RawCase() {
    testing::CaseSpec spec = base_spec(Op::kBatchPrefillPaged, KVLayout::kNHD);
    spec.problem.mask_mode = MaskMode::kCustom;
    testing::Case c = testing::Case::make(spec);
    EXPECT_TRUE(capture_case(c, &owned).ok());
    for (const auto& [name, bytes] : owned.inputs) {
      DType d = name == "q" || name.find("cache") != std::string::npos ? DType::kBF16
                : name == "custom_mask"                                ? DType::kU8
                                                                       : DType::kI32;
      tensors.push_back({name, d, owned.input_shapes.at(name), bytes});
    }
    metadata = problem_to_fields(owned.problem);
    metadata["kv_len"] = format_length_list(owned.kv_lens);
  }
  TensorToWrite& tensor(const std::string& name) {
    for (TensorToWrite& t : tensors) {
      if (t.name == name) return t;
    }
    ADD_FAILURE() << "no tensor " << name;
    return tensors[0];
  }
  void erase(const std::string& name) {
    std::erase_if(tensors, [&](const TensorToWrite& t) { return t.name == name; });
  }
  // Replaces an int32 tensor's values.
  void set_i32(const std::string& name, std::vector<int32_t> values) {
    std::vector<std::byte>& b = storage[name];
    b.resize(values.size() * 4);
    std::memcpy(b.data(), values.data(), b.size());
    tensor(name).bytes = b;
    tensor(name).shape = {static_cast<int64_t>(values.size())};
  }
  std::vector<int32_t> i32(const std::string& name) {
    const auto& b = owned.inputs.at(name);
    std::vector<int32_t> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), b.size());
    return v;
  }
  Status load() {
    std::vector<uint8_t> file;
    Status s = serialize_safetensors(tensors, metadata, &file);
    if (!s.ok()) return s;
    OwnedCase out;
    return parse_case(file.data(), file.size(), &out);
  }
};

void expect_case_error(RawCase& r, const std::string& needle) {
  Status s = r.load();
  EXPECT_EQ(s.code(), ErrorCode::kParseError) << s.to_string();
  EXPECT_NE(s.message().find(needle), std::string::npos)
      << "message should mention '" << needle << "': " << s.message();
}

TEST(CaseFileTest, MalformedCasesAreParseErrors) {
  {
    RawCase r;
    ASSERT_TRUE(r.load().ok()) << r.load().to_string();
  }
  {
    RawCase r;
    r.metadata.erase("op");
    expect_case_error(r, "lacks \"op\"");
  }
  {
    RawCase r;
    r.metadata["casual"] = "true";
    expect_case_error(r, "\"casual\" is not a problem parameter");
  }
  {
    RawCase r;
    r.metadata["kv_data_type"] = "fp4";
    expect_case_error(r, "kv_data_type = \"fp4\"");
  }
  {
    RawCase r;
    r.metadata["causal"] = "yes";
    expect_case_error(r, "causal");
  }
  {
    RawCase r;
    r.erase("kv_indices");
    expect_case_error(r, "\"kv_indices\" is missing");
  }
  {
    RawCase r;
    r.tensors.push_back(r.tensor("q"));
    r.tensors.back().name = "k";
    expect_case_error(r, "\"k\" is not an input");
  }
  {
    RawCase r;
    r.tensor("q").dtype = DType::kF16;
    expect_case_error(r, "dtype F16, expected BF16");
  }
  {
    RawCase r;
    r.metadata["page_size"] = "8";
    expect_case_error(r, "paged_k_cache\" has shape");
  }
  {
    RawCase r;
    r.metadata["num_kv_heads"] = "4";
    expect_case_error(r, "has shape");
  }
  {
    RawCase r;
    std::vector<int32_t> indptr = r.i32("kv_indptr");
    std::swap(indptr[1], indptr[2]);
    if (indptr[1] == indptr[2]) indptr[1] += 1;
    r.set_i32("kv_indptr", indptr);
    expect_case_error(r, "kv_indptr");
  }
  {
    RawCase r;
    std::vector<int32_t> pages = r.i32("kv_indices");
    pages[0] = 1000;
    r.set_i32("kv_indices", pages);
    expect_case_error(r, "kv_indices[0] = 1000");
  }
  {
    RawCase r;
    std::vector<int32_t> last = r.i32("kv_last_page_len");
    last[0] = 0;
    r.set_i32("kv_last_page_len", last);
    expect_case_error(r, "kv_last_page_len[0] = 0");
  }
  {
    RawCase r;
    std::vector<int32_t> qo = r.i32("qo_indptr");
    qo.back() -= 1;
    r.set_i32("qo_indptr", qo);
    expect_case_error(r, "qo_indptr");
  }
  {
    RawCase r;
    r.erase("custom_mask");
    expect_case_error(r, "no custom_mask tensor");
  }
  {
    RawCase r;
    r.tensor("custom_mask").shape[0] -= 1;
    r.tensor("custom_mask").bytes =
        r.tensor("custom_mask").bytes.first(static_cast<size_t>(r.tensor("custom_mask").shape[0]));
    expect_case_error(r, "custom_mask\" has");
  }
  {
    RawCase r;
    r.metadata["causal"] = "true";
    expect_case_error(r, "exclude");
  }
  {
    RawCase r;
    r.metadata["kv_len"] = "1,2,3";
    expect_case_error(r, "but the tensors give");
  }
  {
    RawCase r;
    r.metadata["num_qo_heads"] = "3";
    expect_case_error(r, "problem:");
  }
  {
    RawCase r;
    r.metadata["batch_size"] = "2";
    expect_case_error(r, "qo_indptr");
  }
  OwnedCase out;
  const uint8_t junk[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(parse_case(junk, sizeof junk, &out).code(), ErrorCode::kParseError);
}

// Random corruptions of a case file load or fail with kParseError, never crash (ASan in CI).
TEST(CaseFileTest, CorruptedCaseFilesNeverCrash) {
  RawCase r;
  std::vector<uint8_t> file;
  ASSERT_TRUE(serialize_safetensors(r.tensors, r.metadata, &file).ok());
  std::mt19937 rng(11);
  int loaded = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> f = file;
    for (int i = 0, n = 1 + static_cast<int>(rng() % 3); i < n; ++i) {
      f[rng() % f.size()] = static_cast<uint8_t>(rng());
    }
    if (rng() % 8 == 0) f.resize(rng() % f.size());
    std::unique_ptr<uint8_t[]> exact(new uint8_t[f.size() + 1]);
    std::memcpy(exact.get(), f.data(), f.size());
    OwnedCase c;
    Status s = parse_case(exact.get(), f.size(), &c);
    if (s.ok()) {
      ++loaded;
    } else {
      ++rejected;
      EXPECT_EQ(s.code(), ErrorCode::kParseError) << s.to_string();
    }
  }
  EXPECT_GT(loaded, 0);
  EXPECT_GT(rejected, 0);
}

TEST(CaseFileTest, CaptureRejectsViewsOutsideTheirBuffer) {
  testing::Case c = testing::Case::make(base_spec(Op::kSinglePrefill, KVLayout::kNHD));
  AttentionArgs a = c.args();
  a.k.buffer_bytes -= 2;
  OwnedCase out;
  EXPECT_EQ(capture_case(c.problem(), a, &out).code(), ErrorCode::kOutOfBounds);
  a = c.args();
  a.q.dtype = DType::kF32;
  EXPECT_EQ(capture_case(c.problem(), a, &out).code(), ErrorCode::kInvalidDType);
}

}  // namespace
}  // namespace kvattn::io
