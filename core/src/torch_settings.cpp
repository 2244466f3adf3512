// libtorch's global settings that tch does not expose, set and read back through
// at::globalContext(): TF32 for fp32 convolutions (cuDNN) and matmuls (cuBLAS), and
// cuDNN's benchmark mode. The legacy setters keep PyTorch's two views of TF32 (the
// allow_tf32 flags and the fp32_precision table) consistent; its getters check that.
// Every entry point catches what libtorch throws and returns it as text.
#include <ATen/Context.h>

#include <cstdio>
#include <exception>

namespace {
int fail(const std::exception& e, char* err, size_t len) {
  std::snprintf(err, len, "%s", e.what());
  return 1;
}
}  // namespace

extern "C" {

int millrace_set_tf32(bool cudnn, bool cublas, char* err, size_t len) {
  try {
    auto& ctx = at::globalContext();
    ctx.setAllowTF32CuDNN(cudnn);
    ctx.setAllowTF32CuBLAS(cublas);
    return 0;
  } catch (const std::exception& e) {
    return fail(e, err, len);
  }
}

int millrace_tf32(bool* cudnn, bool* cublas, char* err, size_t len) {
  try {
    const auto& ctx = at::globalContext();
    *cudnn = ctx.allowTF32CuDNN();
    *cublas = ctx.allowTF32CuBLAS();
    return 0;
  } catch (const std::exception& e) {
    return fail(e, err, len);
  }
}

int millrace_set_cudnn_benchmark(bool on, char* err, size_t len) {
  try {
    at::globalContext().setBenchmarkCuDNN(on);
    return 0;
  } catch (const std::exception& e) {
    return fail(e, err, len);
  }
}

bool millrace_cudnn_benchmark() { return at::globalContext().benchmarkCuDNN(); }

}  // extern "C"
