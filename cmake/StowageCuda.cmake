# STOWAGE_CUDA=AUTO|ON|OFF decides whether the CUDA backend is built. The toolkit (and NCCL with
# it) is looked for under CUDAToolkit_ROOT, else /usr/local/cuda. Sets STOWAGE_HAVE_CUDA (and
# STOWAGE_HAVE_NCCL).
set(STOWAGE_HAVE_CUDA OFF)
set(STOWAGE_HAVE_NCCL OFF)
if(NOT STOWAGE_CUDA STREQUAL "OFF")
  if(NOT DEFINED CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS "${CUDAToolkit_BIN_DIR}/nvcc")
      set(CMAKE_CUDA_COMPILER "${CUDAToolkit_BIN_DIR}/nvcc")
    endif()
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Hopper (H100/H200), Blackwell (B200/GB200, RTX), plus PTX so newer GPUs can JIT.
      set(CMAKE_CUDA_ARCHITECTURES "90-real;100-real;120-real;120-virtual")
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 20)
    set(STOWAGE_HAVE_CUDA ON)
    message(STATUS "CUDA toolkit ${CUDAToolkit_VERSION} at ${CUDAToolkit_LIBRARY_ROOT}")
    # NCCL, from the same toolkit tree. The runtime compiles against nccl.h only and takes NCCL's
    # functions from the process (runtime/nccl_agreement.cc, Note [NCCL from the process]), so
    # nothing links it (the library must still exist: a header alone is no NCCL).
    find_path(STOWAGE_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(STOWAGE_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
    if(STOWAGE_NCCL_INCLUDE_DIR AND STOWAGE_NCCL_LIBRARY)
      set(STOWAGE_HAVE_NCCL ON)
      message(STATUS "NCCL at ${STOWAGE_NCCL_LIBRARY}")
    endif()
  elseif(STOWAGE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "STOWAGE_CUDA=ON but no CUDA toolkit was found; set CUDAToolkit_ROOT")
  endif()
endif()
