// Compile-once for CUDA custom kernels (see mlx_serve_ext.h).
//
// MLX's CUDA backend keeps the kernels it compiles with NVRTC in a folder
// (MLX_PTX_CACHE_DIR, else <temp>/mlx/<version>/ptx) and reads a module from
// there before compiling it: later processes start without compiling. Custom
// kernels (mx.fast.cuda_kernel) are read from that folder the same way but
// never written to it, so a process that uses ours compiles every one of
// them again: tens of seconds at each server start. This file writes them:
// for a custom kernel's lazy output it compiles the primitive's source as
// MLX would (same NVRTC, options, target and module name) and puts the
// result where MLX looks, before MLX evaluates it.
//
// MLX's compiler gives NVRTC its device headers from inside libmlx; the
// source of a custom kernel includes one of them ("utils.cuh"), for the
// types its generated signature uses. Here that header is ours (kUtilsStub),
// declaring those types as MLX does (Shape and Strides sized by MAX_NDIM from
// the config.h MLX's wheel ships). A kernel that includes any other MLX
// device header fails to compile here and MLX compiles it itself, as before.

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "mlx/c/error.h"
#include "mlx/c/private/array.h"
#include "mlx/c/private/enums.h"
#include "mlx/c/private/stream.h"
#include "mlx/c/private/string.h"
#include "mlx/c/private/vector.h"
#include "mlx/fast_primitives.h"
#include "mlx/mlx.h"
#include "mlx/version.h"
#include "mlx_serve_ext.h"

namespace fs = std::filesystem;
namespace mx = mlx::core;

namespace {

// What a custom kernel's generated source needs of MLX's utils.cuh: its
// parameter types. scripts/check-cuda-kernels.py compiles our kernels with
// this same text (it reads it from this file, between the markers).
constexpr const char* kUtilsStub = R"stub(// mlx-serve's stand-in for MLX's utils.cuh
#pragma once
#include "mlx/backend/cuda/device/config.h"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/array>
#include <cuda/std/cstdint>
using cuda::std::int32_t; using cuda::std::int64_t; using cuda::std::uint8_t; using cuda::std::uint32_t;
namespace mlx::core::cu {
using Shape = cuda::std::array<int32_t, MAX_NDIM>;
using Strides = cuda::std::array<int64_t, MAX_NDIM>;
}
)stub";
constexpr const char* kUtilsName = "mlx/backend/cuda/device/utils.cuh";

// NVRTC and the CUDA driver, found among the libraries MLX's CUDA build
// already loaded (libmlx links both): nothing here links them, so the same
// library serves MLX's CPU build, where this file has nothing to do.
using nvrtcProgram = void*;
struct Cuda {
  int (*nvrtcVersion)(int*, int*);
  int (*nvrtcCreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*);
  int (*nvrtcDestroyProgram)(nvrtcProgram*);
  int (*nvrtcAddNameExpression)(nvrtcProgram, const char*);
  int (*nvrtcCompileProgram)(nvrtcProgram, int, const char* const*);
  int (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t*);
  int (*nvrtcGetProgramLog)(nvrtcProgram, char*);
  int (*nvrtcGetLoweredName)(nvrtcProgram, const char*, const char**);
  int (*nvrtcGetCUBINSize)(nvrtcProgram, size_t*);
  int (*nvrtcGetCUBIN)(nvrtcProgram, char*);
  int (*nvrtcGetPTXSize)(nvrtcProgram, size_t*);
  int (*nvrtcGetPTX)(nvrtcProgram, char*);
  int (*cuInit)(unsigned);
  int (*cuDeviceGet)(int*, int);
  int (*cuDeviceGetAttribute)(int*, int, int);
  bool found = false;
};

template <typename F>
bool bind(F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
  return f != nullptr;
}

const Cuda& cuda() {
  static const Cuda c = [] {
    Cuda c{};
    c.found = bind(c.nvrtcVersion, "nvrtcVersion") && bind(c.nvrtcCreateProgram, "nvrtcCreateProgram") &&
        bind(c.nvrtcDestroyProgram, "nvrtcDestroyProgram") &&
        bind(c.nvrtcAddNameExpression, "nvrtcAddNameExpression") &&
        bind(c.nvrtcCompileProgram, "nvrtcCompileProgram") &&
        bind(c.nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize") &&
        bind(c.nvrtcGetProgramLog, "nvrtcGetProgramLog") && bind(c.nvrtcGetLoweredName, "nvrtcGetLoweredName") &&
        bind(c.nvrtcGetCUBINSize, "nvrtcGetCUBINSize") && bind(c.nvrtcGetCUBIN, "nvrtcGetCUBIN") &&
        bind(c.nvrtcGetPTXSize, "nvrtcGetPTXSize") && bind(c.nvrtcGetPTX, "nvrtcGetPTX") &&
        bind(c.cuInit, "cuInit") && bind(c.cuDeviceGet, "cuDeviceGet") &&
        bind(c.cuDeviceGetAttribute, "cuDeviceGetAttribute");
    return c;
  }();
  return c;
}

void check(int status, const char* what) {
  if (status != 0) {
    throw std::runtime_error(std::string(what) + " failed (status " + std::to_string(status) + ")");
  }
}

// MLX's folder for compiled kernels, chosen as MLX chooses it (once a
// process, like MLX); empty where it cannot be made (MLX then keeps none).
const fs::path& cache_dir() {
  static const fs::path dir = []() -> fs::path {
    try {
      fs::path d;
      if (const char* c = std::getenv("MLX_PTX_CACHE_DIR"); c) {
        d = c;
      } else {
        d = fs::temp_directory_path() / "mlx" / mx::version() / "ptx";
      }
      std::error_code error;
      if (!fs::exists(d) && !fs::create_directories(d, error)) {
        return {};
      }
      return d;
    } catch (const std::exception&) {
      return {};
    }
  }();
  return dir;
}

// Where MLX reads module `name`: names longer than a file name may be are
// cut into folders of 245 characters, as MLX cuts them.
fs::path module_path(const std::string& name) {
  constexpr size_t max_len = 245;
  fs::path p = cache_dir();
  size_t offset = 0;
  while (name.size() - offset > max_len) {
    p /= name.substr(offset, max_len);
    offset += max_len;
  }
  return p / (name.substr(offset) + ".ptx");
}

// NVRTC's include folders as MLX passes them: the headers shipped beside
// libmlx, CCCL's, then the CUDA runtime's (the Python package's, else the
// toolkit's).
std::vector<std::string> include_args(int nvrtc_major) {
  Dl_info info;
  if (!dladdr(reinterpret_cast<void*>(&mx::version), &info) || info.dli_fname == nullptr) {
    throw std::runtime_error("cannot find libmlx's folder");
  }
  fs::path root = fs::path(info.dli_fname).parent_path().parent_path();
  std::vector<std::string> args;
  fs::path path = root / "include";
  if (fs::exists(path)) {
    args.push_back("--include-path=" + path.string());
  }
  path = path / "cccl";
  if (!fs::exists(path)) {
    const char* (*cccl_dir)() = nullptr;
    if (bind(cccl_dir, "_ZN3mlx4core2cu8cccl_dirEv") && cccl_dir() != nullptr) {
      path = cccl_dir();
    }
  }
  if (fs::exists(path)) {
    args.push_back("--include-path=" + path.string());
  }
  path = root.parent_path() / "nvidia" / (nvrtc_major >= 13 ? "cu13" : "cuda_runtime") / "include";
  if (!fs::exists(path)) {
    const char* home = std::getenv("CUDA_HOME");
    if (home == nullptr) {
      home = std::getenv("CUDA_PATH");
    }
    path = fs::path(home ? home : "/usr/local/cuda") / "include";
    if (!fs::exists(path)) {
      throw std::runtime_error("cannot find the CUDA headers (set CUDA_HOME or CUDA_PATH)");
    }
  }
  args.push_back("--include-path=" + path.string());
  return args;
}

// `source` compiled as MLX compiles a kernel for device `device`: a cubin
// for the device's architecture where NVRTC knows it (every NVRTC from 11.8),
// else PTX; with the lowered name of `kernel`.
std::pair<std::string, std::string> compile(const std::string& module, const std::string& source,
                                            const std::string& kernel, int device) {
  const Cuda& c = cuda();
  int major = 0, minor = 0, cc_major = 0, cc_minor = 0, dev = 0;
  check(c.nvrtcVersion(&major, &minor), "nvrtcVersion");
  check(c.cuInit(0), "cuInit");
  check(c.cuDeviceGet(&dev, device), "cuDeviceGet");
  check(c.cuDeviceGetAttribute(&cc_major, 75, dev), "cuDeviceGetAttribute");  // compute capability major
  check(c.cuDeviceGetAttribute(&cc_minor, 76, dev), "cuDeviceGetAttribute");  // and minor
  // NVRTC before 11.8 cannot target every device: MLX gives those PTX.
  bool sass = major > 11 || (major == 11 && minor >= 8);
  std::string arch = std::string("--gpu-architecture=") + (sass ? "sm_" : "compute_") +
      std::to_string(cc_major) + std::to_string(cc_minor) + (cc_major >= 9 ? "a" : "");
  std::vector<std::string> includes = include_args(major);
  std::vector<const char*> args = {"--device-as-default-execution-space", arch.c_str()};
  for (const auto& i : includes) {
    args.push_back(i.c_str());
  }

  const char* headers[] = {kUtilsStub};
  const char* names[] = {kUtilsName};
  nvrtcProgram prog = nullptr;
  check(c.nvrtcCreateProgram(&prog, source.c_str(), (module + ".cu").c_str(), 1, headers, names),
        "nvrtcCreateProgram");
  std::unique_ptr<nvrtcProgram, std::function<void(nvrtcProgram*)>> freer(
      &prog, [&c](nvrtcProgram* p) { c.nvrtcDestroyProgram(p); });
  check(c.nvrtcAddNameExpression(prog, kernel.c_str()), "nvrtcAddNameExpression");
  if (c.nvrtcCompileProgram(prog, static_cast<int>(args.size()), args.data()) != 0) {
    size_t size = 0;
    c.nvrtcGetProgramLogSize(prog, &size);
    std::string log(size, '\0');
    c.nvrtcGetProgramLog(prog, log.data());
    throw std::runtime_error("NVRTC could not compile " + module + ": " + log.c_str());
  }
  const char* lowered = nullptr;
  check(c.nvrtcGetLoweredName(prog, kernel.c_str(), &lowered), "nvrtcGetLoweredName");
  std::string mangled = lowered;
  size_t size = 0;
  check(sass ? c.nvrtcGetCUBINSize(prog, &size) : c.nvrtcGetPTXSize(prog, &size), "nvrtcGet*Size");
  std::string image(size, '\0');
  check(sass ? c.nvrtcGetCUBIN(prog, image.data()) : c.nvrtcGetPTX(prog, image.data()), "nvrtcGet*");
  return {image, mangled};
}

// `bytes` into `path` by a temporary file of this call's own and a rename:
// MLX (or another process) never reads half a file.
void write_whole(const fs::path& path, const std::string& bytes) {
  static std::atomic<unsigned long> writes{0};
  fs::create_directories(path.parent_path());
  fs::path tmp = path;
  tmp += "." + std::to_string(getpid()) + "." + std::to_string(writes.fetch_add(1)) + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f.good()) {
      throw std::runtime_error("cannot write " + tmp.string());
    }
  }
  fs::rename(tmp, path);
}

// `out`'s CUDA custom kernel, not a precompiled one, where MLX keeps a
// kernel cache and NVRTC is there; else null.
mx::fast::CustomKernel* custom_kernel(const mx::array& out) {
  if (!out.has_primitive() || std::string(out.primitive().name()) != "CustomKernel") {
    return nullptr;
  }
  // A static downcast: libmlx exports no type information for dynamic_cast.
  auto& kernel = static_cast<mx::fast::CustomKernel&>(out.primitive());
  bool precompiled = std::get<8>(kernel.state());
  if (precompiled || kernel.stream().device != mx::Device::gpu || cache_dir().empty() || !cuda().found) {
    return nullptr;
  }
  return &kernel;
}

// The name MLX gives module `name` of `source`: "{name}_{hash of the source, hex}".
std::string module_name(const std::string& name, const std::string& source) {
  char hash[24];
  std::snprintf(hash, sizeof hash, "%zx", std::hash<std::string>{}(source));
  return name + "_" + hash;
}

// Module `module` (the function `kernel`, of `source`) where MLX reads it,
// compiled unless it is there; kernel list first: MLX takes the module as
// present once its image is. `listed` is the kernel's name in the list, as
// MLX looks it up.
int keep_module(const std::string& module, const std::string& source, const std::string& kernel,
                const std::string& listed, int device) {
  fs::path ptx = module_path(module);
  std::error_code error;
  if (fs::exists(ptx, error)) {
    return MLXS_KERNEL_CACHED;
  }
  auto [image, mangled] = compile(module, source, kernel, device);
  fs::path txt = ptx;
  txt.replace_extension(".txt");
  write_whole(txt, listed + "\t" + mangled + "\n");
  write_whole(ptx, image);
  return MLXS_KERNEL_WRITTEN;
}

int cache_kernel(const mx::array& out) {
  mx::fast::CustomKernel* kernel = custom_kernel(out);
  if (kernel == nullptr) {
    return MLXS_KERNEL_NOT_CACHED;
  }
  auto state = kernel->state();
  const std::string& name = std::get<0>(state);
  std::string kernel_name = "mlx::core::cu::" + name;
  return keep_module(module_name(name, std::get<1>(state)), std::get<1>(state), kernel_name, kernel_name,
                     kernel->stream().device.index);
}

} // namespace

extern "C" int mlxs_cuda_kernel_cache(mlx_array out, int* status) {
  try {
    *status = cache_kernel(mlx_array_get_(out));
  } catch (std::exception& e) {
    *status = MLXS_KERNEL_NOT_CACHED;
    mlx_error(e.what());
    return 1;
  }
  return 0;
}

extern "C" int mlxs_cuda_kernel_source(mlx_array out, mlx_string* name, mlx_string* source, int* shared_memory,
                                       bool* ensure_row_contiguous, bool* found) {
  try {
    *found = false;
    mx::fast::CustomKernel* kernel = custom_kernel(mlx_array_get_(out));
    if (kernel == nullptr) {
      return 0;
    }
    auto state = kernel->state();
    mlx_string_set_(*name, std::get<0>(state));
    mlx_string_set_(*source, std::get<1>(state));
    *ensure_row_contiguous = std::get<5>(state);
    *shared_memory = std::get<9>(state);
    *found = true;
  } catch (std::exception& e) {
    mlx_error(e.what());
    return 1;
  }
  return 0;
}

extern "C" int mlxs_cuda_kernel_precompile(mlx_array out, const char* kernel, const char* token, const char* source,
                                           int* status) {
  try {
    *status = MLXS_KERNEL_NOT_CACHED;
    if (cache_dir().empty() || !cuda().found) {
      throw std::runtime_error("no kernel cache folder or no NVRTC in this process");
    }
    // A precompiled kernel's module: "{kernel}_{hash of the token}", its
    // function listed under its own name (MLX looks it up by `kernel`). The
    // function is extern "C" in MLX's namespace, as the kernel it calls.
    *status = keep_module(module_name(kernel, token), source, std::string("mlx::core::cu::") + kernel, kernel,
                          mlx_array_get_(out).primitive().stream().device.index);
  } catch (std::exception& e) {
    mlx_error(e.what());
    return 1;
  }
  return 0;
}

extern "C" int mlxs_precompiled_cuda_kernel(mlx_vector_array* res, const char* kernel, const char* token,
                                            const mlx_array* inputs, size_t num_inputs, const int* output_shapes,
                                            const size_t* output_ndims, const mlx_dtype* output_dtypes,
                                            size_t num_outputs, const int* scalars, size_t num_scalars, int grid_x,
                                            int grid_y, int grid_z, int group_x, int group_y, int group_z,
                                            int shared_memory, const float* init_value, bool ensure_row_contiguous,
                                            mlx_stream stream) {
  try {
    std::vector<mx::array> ins;
    ins.reserve(num_inputs);
    for (size_t i = 0; i < num_inputs; ++i) {
      ins.push_back(mlx_array_get_(inputs[i]));
    }
    std::vector<mx::Shape> shapes;
    std::vector<mx::Dtype> dtypes;
    shapes.reserve(num_outputs);
    dtypes.reserve(num_outputs);
    for (size_t i = 0; i < num_outputs; ++i) {
      shapes.emplace_back(output_shapes, output_shapes + output_ndims[i]);
      output_shapes += output_ndims[i];
      dtypes.push_back(mlx_dtype_to_cpp(output_dtypes[i]));
    }
    std::vector<mx::fast::ScalarArg> args(scalars, scalars + num_scalars);
    std::optional<float> init;
    if (init_value != nullptr) {
      init = *init_value;
    }
    mlx_vector_array_set_(*res, mx::fast::precompiled_cuda_kernel(
                                    kernel, token, ins, shapes, dtypes, args, {grid_x, grid_y, grid_z},
                                    {group_x, group_y, group_z}, shared_memory, init, ensure_row_contiguous,
                                    mlx_stream_get_(stream)));
  } catch (std::exception& e) {
    mlx_error(e.what());
    return 1;
  }
  return 0;
}
