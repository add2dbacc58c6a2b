// main of kvattn_fa2_gpu_bench / kvattn_fa3_gpu_bench: the benchmark's entry point, named by
// KVATTN_BENCH_ENTRY (tests/cuda/CMakeLists.txt), so the GPU bundle's one binary can hold both.
int KVATTN_BENCH_ENTRY(int argc, char** argv);

int main(int argc, char** argv) { return KVATTN_BENCH_ENTRY(argc, argv); }
