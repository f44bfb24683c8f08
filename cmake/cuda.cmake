# Optional CUDA path (FT_CUDA=AUTO|ON|OFF), included by the root CMakeLists after the CPU libraries.
# AUTO builds it when nvcc, cuDNN and NCCL are all found; ON fails when one is missing; OFF skips.
# When on, every folder library compiles its own .cu kernels (and ft_core core/cuda/*, ft_comm
# comm/nccl/*), ft_core carries the PUBLIC definition FT_HAVE_CUDA=1, and the interface target
# ft_cuda names the lot for the binary and the tests.

# The per-folder globs of ft_core and ft_comm also match core/cuda/*.cpp and comm/nccl/*.cpp.
# Those need CUDA headers: take them out of the CPU libraries here, and put them back (with every
# folder's .cu kernels) below when CUDA is on.
foreach(cpu_library ft_core ft_comm)
  get_target_property(cpu_sources ${cpu_library} SOURCES)
  list(FILTER cpu_sources EXCLUDE REGEX "/core/cuda/|/comm/nccl/")
  set_property(TARGET ${cpu_library} PROPERTY SOURCES ${cpu_sources})
endforeach()

string(TOUPPER "${FT_CUDA}" FT_CUDA_MODE)
if(NOT FT_CUDA_MODE MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "FT_CUDA='${FT_CUDA}' is not valid; allowed values: AUTO, ON, OFF")
endif()

# Reports why CUDA is unavailable: fatal under ON, a status line (and CUDA off) under AUTO.
macro(ft_cuda_unavailable reason)
  if(FT_CUDA_MODE STREQUAL "ON")
    message(FATAL_ERROR "FT_CUDA=ON but ${reason}")
  endif()
  message(STATUS "fusiontrain: CUDA path OFF (FT_CUDA=AUTO: ${reason})")
  set(FT_CUDA_ENABLED FALSE)
endmacro()

set(FT_CUDA_ENABLED FALSE)
if(FT_CUDA_MODE STREQUAL "OFF")
  message(STATUS "fusiontrain: CUDA path OFF (FT_CUDA=OFF)")
else()
  set(FT_CUDA_ENABLED TRUE)
  # nvcc must use the same host compiler as the C++ code, or the C++ ABIs may differ.
  if(NOT CMAKE_CUDA_HOST_COMPILER AND NOT DEFINED ENV{CUDAHOSTCXX})
    set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER} CACHE FILEPATH "nvcc host compiler")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  # check_language only searches PATH; a fresh shell often lacks /usr/local/cuda/bin.
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "CUDA compiler" FORCE)
  endif()
  if(NOT CMAKE_CUDA_COMPILER)
    ft_cuda_unavailable("no CUDA compiler (nvcc) was found; set CMAKE_CUDA_COMPILER")
  endif()
endif()

if(FT_CUDA_ENABLED)
  # H200 (Hopper) is sm_90; pass -DCMAKE_CUDA_ARCHITECTURES=... to build for other GPUs.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)

  set(ft_cuda_hints ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR} $ENV{CUDNN_ROOT}
                    $ENV{NCCL_ROOT} /usr/local/cuda)
  find_path(FT_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${ft_cuda_hints}
            PATH_SUFFIXES include)
  find_library(FT_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} ${ft_cuda_hints}
               PATH_SUFFIXES lib64 lib)
  find_path(FT_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${ft_cuda_hints}
            PATH_SUFFIXES include)
  find_library(FT_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${ft_cuda_hints}
               PATH_SUFFIXES lib64 lib)
  if(NOT TARGET CUDA::cublasLt)
    ft_cuda_unavailable("cuBLASLt was not found in the CUDA toolkit")
  elseif(NOT FT_CUDNN_INCLUDE_DIR OR NOT FT_CUDNN_LIBRARY)
    ft_cuda_unavailable("cuDNN (cudnn.h, libcudnn) was not found; set CUDNN_ROOT")
  elseif(NOT FT_NCCL_INCLUDE_DIR OR NOT FT_NCCL_LIBRARY)
    ft_cuda_unavailable("NCCL (nccl.h, libnccl) was not found; set NCCL_ROOT")
  endif()
endif()

if(FT_CUDA_ENABLED)
  # Imported targets, so their headers are SYSTEM includes and -Werror ignores their warnings.
  add_library(ft_cudnn UNKNOWN IMPORTED)
  set_target_properties(ft_cudnn PROPERTIES IMPORTED_LOCATION ${FT_CUDNN_LIBRARY}
                                            INTERFACE_INCLUDE_DIRECTORIES ${FT_CUDNN_INCLUDE_DIR})
  add_library(ft_nccl UNKNOWN IMPORTED)
  set_target_properties(ft_nccl PROPERTIES IMPORTED_LOCATION ${FT_NCCL_LIBRARY}
                                           INTERFACE_INCLUDE_DIRECTORIES ${FT_NCCL_INCLUDE_DIR})

  # Each op's CUDA kernels live beside its CPU kernels (kernels/gelu.cpp and gelu.cu), so each
  # folder library takes its own .cu files; FT_HAVE_CUDA=1 is public on ft_core, so every target
  # above it compiles its CUDA dispatch. ft_cuda stays as the one name tests and tools link.
  foreach(folder core kernels model fusion comm)
    file(GLOB folder_cuda_sources CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/${folder}/*.cu
         ${CMAKE_SOURCE_DIR}/${folder}/*/*.cu)
    if(folder STREQUAL "core")
      file(GLOB cuda_host_sources CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/core/cuda/*.cpp)
      list(APPEND folder_cuda_sources ${cuda_host_sources})
    elseif(folder STREQUAL "comm")
      file(GLOB cuda_host_sources CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/comm/nccl/*.cpp)
      list(APPEND folder_cuda_sources ${cuda_host_sources})
    endif()
    target_sources(ft_${folder} PRIVATE ${folder_cuda_sources})
    # One cudart for the whole process: the shared one, which cuDNN and NCCL also expect.
    # The folder libraries exist before enable_language(CUDA), so they need the architectures
    # set explicitly.
    set_target_properties(ft_${folder} PROPERTIES CUDA_RUNTIME_LIBRARY Shared
                                                  CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}"
                                                  POSITION_INDEPENDENT_CODE ON)
    target_compile_options(ft_${folder} PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Werror --Werror=all-warnings>)
    # ptxas's report of every kernel's registers, stack, spills and shared memory, kept beside
    # each object (cmake/keep_resource_usage.sh) for the ctest cuda.kernel_resources.
    target_compile_options(ft_${folder} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--resource-usage>)
    set_target_properties(ft_${folder} PROPERTIES
      CUDA_COMPILER_LAUNCHER ${CMAKE_SOURCE_DIR}/cmake/keep_resource_usage.sh)
  endforeach()
  target_compile_definitions(ft_core PUBLIC FT_HAVE_CUDA=1)
  # core/cuda/cuda_check.cpp names the errors of all four libraries, so ft_core links them all.
  target_link_libraries(ft_core PUBLIC CUDA::cudart CUDA::cublasLt ft_cudnn ft_nccl)
  add_library(ft_cuda INTERFACE)
  target_link_libraries(ft_cuda INTERFACE ft_core ft_comm)
  message(STATUS "fusiontrain: CUDA path ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                 "sm_${CMAKE_CUDA_ARCHITECTURES}, cuDNN ${FT_CUDNN_LIBRARY}, "
                 "NCCL ${FT_NCCL_LIBRARY})")
endif()
