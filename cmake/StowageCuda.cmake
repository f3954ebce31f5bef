# STOWAGE_CUDA=AUTO|ON|OFF decides whether the CUDA backend is built. The toolkit (and NCCL with
# it) is looked for under CUDAToolkit_ROOT, else /usr/local/cuda. Sets STOWAGE_HAVE_CUDA (and
# STOWAGE_HAVE_NCCL).
set(STOWAGE_HAVE_CUDA OFF)
set(STOWAGE_HAVE_NCCL OFF)
if(NOT STOWAGE_CUDA STREQUAL "OFF")
  if(NOT DEFINED CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  # CMake 3.25.1's FindCUDAToolkit (Debian bookworm's cmake) sets a DEPRECATION property on
  # CUDA::nvToolsExt whenever the project requires CMake >= 3.25, without checking that the target
  # exists; CUDA 12.9 and later ship no libnvToolsExt (only the nvtx3 headers), so configure stops
  # with "set_property could not find TARGET CUDA::nvToolsExt". Looking the toolkit up under a
  # lower required version skips that branch; stowage links nothing of nvToolsExt.
  set(stowage_required_version "${CMAKE_MINIMUM_REQUIRED_VERSION}")
  set(CMAKE_MINIMUM_REQUIRED_VERSION 3.24)
  find_package(CUDAToolkit QUIET)
  set(CMAKE_MINIMUM_REQUIRED_VERSION "${stowage_required_version}")
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
    # NCCL's header beside the toolkit: target stowage::nccl and STOWAGE_HAVE_NCCL. The library
    # is not linked but opened at run time (dlopen of libnccl.so.2, then the one found here):
    # at ~200 MiB it would not fit the gpu-check folder, and a binary linked to it would not
    # start on a machine without it.
    find_path(STOWAGE_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(STOWAGE_NCCL_LIBRARY NAMES libnccl.so.2 nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
    if(STOWAGE_NCCL_INCLUDE_DIR)
      set(STOWAGE_HAVE_NCCL ON)
      add_library(stowage_nccl INTERFACE IMPORTED GLOBAL)
      add_library(stowage::nccl ALIAS stowage_nccl)
      target_include_directories(stowage_nccl INTERFACE ${STOWAGE_NCCL_INCLUDE_DIR})
      target_link_libraries(stowage_nccl INTERFACE ${CMAKE_DL_LIBS})
      target_compile_definitions(stowage_nccl INTERFACE STOWAGE_HAVE_NCCL=1)
      if(STOWAGE_NCCL_LIBRARY)
        target_compile_definitions(stowage_nccl INTERFACE
                                   STOWAGE_NCCL_LIBRARY="${STOWAGE_NCCL_LIBRARY}")
      endif()
      message(STATUS "NCCL header: ${STOWAGE_NCCL_INCLUDE_DIR} (library opened at run time)")
    endif()
  elseif(STOWAGE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "STOWAGE_CUDA=ON but no CUDA toolkit was found; set CUDAToolkit_ROOT")
  endif()
endif()
