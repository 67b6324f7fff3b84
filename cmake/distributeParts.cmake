# What distribute's optional parts need, looked up once for both ways CMake meets the library: the
# root CMakeLists.txt (add_subdirectory, FetchContent) includes this file from cmake/, and the
# installed distributeConfig.cmake (find_package) from its own directory. Every lookup is QUIET:
# a part whose dependencies are missing is simply not offered, and the variable
# distribute_<part>_REASON says why.
#
# _distribute_find_parts() sets, in the caller's scope:
#   distribute_cluster_FOUND, distribute_cluster_LINK, distribute_cluster_REASON
#       cluster/, net/, ps/, checkpoint/ and the strategies built on them (MultiWorkerMirrored,
#       ParameterServer): Boost >= 1.75 (Asio, Beast: headers; Boost.JSON: libboost_json),
#       OpenSSL's libcrypto (HMAC-SHA256 of the cluster token, RAND_bytes) and, where found,
#       cereal (header-only; the parameter-server service's messages).
#   distribute_cuda_FOUND, distribute_cuda_LINK, distribute_cuda_DEFINITIONS,
#   distribute_cuda_INCLUDE_DIRS, distribute_cuda_REASON, distribute_WITH_NCCL
#       the ds::cuda backend: CUDA::cudart (CMake >= 3.17, FindCUDAToolkit) and NCCL where found
#       (libnccl + nccl.h; without them DISTRIBUTE_NO_NCCL).
#   distribute_mpi_FOUND, distribute_mpi_LINK, distribute_mpi_REASON
#       CommunicationImplementation::Mpi (net/mpi.hpp): the cluster part + MPI's C library
#       (FindMPI: MPI::MPI_C; Open MPI or MPICH), with DISTRIBUTE_WITH_MPI defined.
macro(_distribute_find_parts)
  # --- cluster
  set(distribute_cluster_FOUND FALSE)
  set(distribute_cluster_LINK "")
  set(distribute_cluster_REASON "")
  # Boost >= 1.75 ships BoostConfig.cmake: CONFIG mode, so no FindBoost (CMP0167 on CMake >= 3.30).
  find_package(Boost 1.75 CONFIG QUIET COMPONENTS json)
  if(NOT Boost_FOUND OR NOT TARGET Boost::json)
    set(distribute_cluster_REASON "Boost >= 1.75 with Boost.JSON was not found (Debian/Ubuntu: libboost-json-dev)")
  else()
    find_package(OpenSSL QUIET)
    if(NOT TARGET OpenSSL::Crypto)
      set(distribute_cluster_REASON "OpenSSL's libcrypto was not found (Debian/Ubuntu: libssl-dev)")
    else()
      set(distribute_cluster_FOUND TRUE)
      set(distribute_cluster_LINK Boost::headers Boost::json OpenSSL::Crypto)
      find_package(cereal CONFIG QUIET)
      if(TARGET cereal::cereal)
        list(APPEND distribute_cluster_LINK cereal::cereal)
      endif()
    endif()
  endif()

  # --- cuda
  set(distribute_cuda_FOUND FALSE)
  set(distribute_cuda_LINK "")
  set(distribute_cuda_DEFINITIONS "")
  set(distribute_cuda_INCLUDE_DIRS "")
  set(distribute_cuda_REASON "")
  set(distribute_WITH_NCCL FALSE)
  if(CMAKE_VERSION VERSION_LESS 3.17)
    set(distribute_cuda_REASON "distribute::cuda needs CMake 3.17 or newer (FindCUDAToolkit)")
  else()
    find_package(CUDAToolkit QUIET)
    if(NOT TARGET CUDA::cudart)
      set(distribute_cuda_REASON "the CUDA toolkit (CUDA::cudart) was not found")
    else()
      set(distribute_cuda_FOUND TRUE)
      # DISTRIBUTE_WITH_CUDA: the ds::cuda backend in files that the host compiler builds too.
      set(distribute_cuda_DEFINITIONS DISTRIBUTE_WITH_CUDA "$<$<COMPILE_LANGUAGE:CUDA>:FMT_USE_CONSTEXPR=1>")
      set(distribute_cuda_LINK CUDA::cudart)
      find_library(DISTRIBUTE_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
      find_path(DISTRIBUTE_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
      if(DISTRIBUTE_NCCL_LIBRARY AND DISTRIBUTE_NCCL_INCLUDE_DIR)
        set(distribute_WITH_NCCL TRUE)
        list(APPEND distribute_cuda_LINK "${DISTRIBUTE_NCCL_LIBRARY}")
        set(distribute_cuda_INCLUDE_DIRS "${DISTRIBUTE_NCCL_INCLUDE_DIR}")
      else()
        list(APPEND distribute_cuda_DEFINITIONS DISTRIBUTE_NO_NCCL)  # nccl.h may be visible without the library
      endif()
    endif()
  endif()

  # --- mpi
  set(distribute_mpi_FOUND FALSE)
  set(distribute_mpi_LINK "")
  set(distribute_mpi_REASON "")
  if(NOT distribute_cluster_FOUND)
    set(distribute_mpi_REASON "distribute::mpi needs distribute::cluster: ${distribute_cluster_REASON}")
  else()
    find_package(MPI QUIET COMPONENTS C)
    if(NOT TARGET MPI::MPI_C)
      set(distribute_mpi_REASON "no MPI C library was found (Debian/Ubuntu: libopenmpi-dev or libmpich-dev)")
    else()
      set(distribute_mpi_FOUND TRUE)
      set(distribute_mpi_LINK MPI::MPI_C)
    endif()
  endif()
endmacro()
