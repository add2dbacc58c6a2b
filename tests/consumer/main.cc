// Uses only the installed public headers: selection for the founding case, and a tiny
// decode on the CPU that must give the mean of V (every score equal).
#include <kvattn/kvattn.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  kvattn::Problem p;
  p.op = kvattn::Op::kBatchPrefillPaged;
  p.q_dtype = kvattn::DType::kBF16;
  p.kv_dtype = kvattn::DType::kE4M3;
  kvattn::Explanation e = kvattn::explain(p, kvattn::Device::cuda_sm(90));
  std::printf("kvattn %s: sm90 bf16 q + e4m3 kv -> %s\n", kvattn::version_string(),
              e.selected ? e.selected->c_str() : "none");
  if (!e.selected || *e.selected != "fa2") return 1;

  kvattn::Problem d;
  d.op = kvattn::Op::kSingleDecode;
  d.num_qo_heads = d.num_kv_heads = 1;
  d.head_dim_qk = d.head_dim_vo = 2;
  d.q_dtype = d.kv_dtype = d.o_dtype = kvattn::DType::kF32;
  std::vector<float> q = {0, 0}, k = {1, 2, 3, 4}, v = {1, 2, 3, 4}, out(2, NAN);
  kvattn::AttentionArgs a;
  a.q = kvattn::TensorView::contiguous(q.data(), kvattn::DType::kF32, {1, 2});
  a.k = kvattn::TensorView::contiguous(k.data(), kvattn::DType::kF32, {2, 1, 2});
  a.v = kvattn::TensorView::contiguous(v.data(), kvattn::DType::kF32, {2, 1, 2});
  a.out = kvattn::TensorView::contiguous(out.data(), kvattn::DType::kF32, {1, 2});
  kvattn::Status s = kvattn::run(d, a);
  std::printf("single decode: %s, out = [%g, %g]\n", s.to_string().c_str(), out[0], out[1]);
  return s.ok() && std::fabs(out[0] - 2) < 1e-6 && std::fabs(out[1] - 3) < 1e-6 ? 0 : 1;
}
