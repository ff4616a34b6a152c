# QrunCuda.cmake - how qrun builds CUDA code, the same for in-tree kernels and third-party plugins
# (installed with the SDK's CMake package; qrun_add_plugin(... CUDA) uses it).
#
#   qrun_cuda_drop_torch_gencode()           after find_package(Torch), in the directory scope
#   qrun_cuda_target(<target> [MIN_ARCH n])  CUDA architectures, dialect and runtime of a target
#
# Variables read: QRUN_CUDA_ARCH (in-tree setting, e.g. "90" or "90;100"), else QRUN_SDK_CUDA_ARCH
# (what the installed qrun was built for), else CMAKE_CUDA_ARCHITECTURES when a standalone
# project names it, else 90.
include_guard(GLOBAL)

# CMake before 3.26 cannot spell the C++20 dialect for nvcc 13; name it, so that a CUDA target
# linking qrun::sdk (compile feature cxx_std_20) configures. Newer CMake sets these itself.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()

# LibTorch's CMake (find_package(Torch) with CUDA) turns CMAKE_CUDA_ARCHITECTURES off and appends
# -gencode flags for TORCH_CUDA_ARCH_LIST to CMAKE_CUDA_FLAGS. Left so, every CUDA target builds
# for plain sm_90 beside or instead of what it asks for, and code that needs sm_90a (wgmma,
# setmaxnreg) silently takes its fallback path. Drop those flags so that each target's
# CUDA_ARCHITECTURES alone decide. A macro: it edits the caller's CMAKE_CUDA_FLAGS.
macro(qrun_cuda_drop_torch_gencode)
  string(REGEX REPLACE "-gencode[ =]+arch=compute_[0-9a-z]+,code=[^ ]+" "" CMAKE_CUDA_FLAGS
         "${CMAKE_CUDA_FLAGS}")
endmacro()

# The architectures to build, as CUDA_ARCHITECTURES entries: sm_90 becomes 90a, the arch-specific
# target whose wgmma and setmaxnreg instructions the Hopper kernels use (sm_90a code runs on every
# sm_90 GPU: H100, H200); "-real" embeds SASS only, no PTX to JIT at load time.
function(qrun_cuda_archs out_var)
  if(QRUN_CUDA_ARCH)
    set(_archs ${QRUN_CUDA_ARCH})
  elseif(QRUN_SDK_CUDA_ARCH)
    set(_archs ${QRUN_SDK_CUDA_ARCH})
  elseif(CMAKE_CUDA_ARCHITECTURES AND NOT CMAKE_CUDA_ARCHITECTURES STREQUAL "OFF")
    set(_archs ${CMAKE_CUDA_ARCHITECTURES})
  else()
    set(_archs 90)
  endif()
  list(TRANSFORM _archs REPLACE "-(real|virtual)$" "")
  list(TRANSFORM _archs REPLACE "^90$" "90a")
  list(TRANSFORM _archs APPEND "-real")
  set(${out_var} "${_archs}" PARENT_SCOPE)
endfunction()

# CUDA settings of one target (a kernel library or a plugin): its architectures (above), C++20 for
# nvcc (spelled out: CMake before 3.26 cannot name the CUDA20 dialect for nvcc 13), line info for
# profilers, position-independent code (it ends up in a shared library), no separable
# compilation, and the CUDA runtime. MIN_ARCH n stops the configure step with a message when an
# architecture below sm_<n> is asked for, instead of a ptxas error about PTX features.
function(qrun_cuda_target target)
  cmake_parse_arguments(C "" "MIN_ARCH" "" ${ARGN})
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "qrun_cuda_target(${target}): CUDA is not enabled in this project. Install "
                        "the CUDA toolkit (nvcc) and call enable_language(CUDA) or project(... CUDA) "
                        "first.")
  endif()
  qrun_cuda_archs(_archs)
  if(C_MIN_ARCH)
    foreach(_a IN LISTS _archs)
      string(REGEX MATCH "^[0-9]+" _num "${_a}")
      if(_num LESS C_MIN_ARCH)
        message(FATAL_ERROR "${target}: CUDA architecture '${_a}' is not supported; the code needs "
                            "sm_${C_MIN_ARCH} or newer. Set QRUN_CUDA_ARCH (or "
                            "CMAKE_CUDA_ARCHITECTURES in a standalone build) to ${C_MIN_ARCH}.")
      endif()
    endforeach()
  endif()
  set_target_properties(${target} PROPERTIES
    CUDA_ARCHITECTURES "${_archs}"
    CUDA_SEPARABLE_COMPILATION OFF
    POSITION_INDEPENDENT_CODE ON)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 -lineinfo>)
  find_package(CUDAToolkit REQUIRED)
  target_link_libraries(${target} PRIVATE CUDA::cudart)
endfunction()
