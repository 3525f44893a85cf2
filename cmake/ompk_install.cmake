# Install rules: headers under include/ompk/, libompk.so.<soversion>, ompk-info and ompk-bench,
# the CMake package (find_package(ompk) -> ompk::ompk) and ompk.pc.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Before 1.0 every minor release may change the ABI, so the SONAME carries major.minor.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(OMPK_SOVERSION "0.${PROJECT_VERSION_MINOR}")
else()
  set(OMPK_SOVERSION "${PROJECT_VERSION_MAJOR}")
endif()
set_target_properties(ompk PROPERTIES VERSION ${PROJECT_VERSION} SOVERSION ${OMPK_SOVERSION}
                                      EXPORT_NAME ompk)
add_library(ompk::ompk ALIAS ompk)

# Installed binaries find libompk next to them and the LLVM OpenMP runtimes (libomp,
# libomptarget and its CUDA plugin) where clang's package put them, without LD_LIBRARY_PATH.
set(_ompk_rpath "\$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
set(_ompk_lib_rpath "")
if(OMPK_LLVM_LIBDIR)
  list(APPEND _ompk_rpath "${OMPK_LLVM_LIBDIR}")
  set(_ompk_lib_rpath "${OMPK_LLVM_LIBDIR}")
endif()
# libompk needs the same RUNPATH in the build tree as installed; one value leaves CMake no padding
# to add (an empty RUNPATH entry, which means the current directory).
set_target_properties(ompk PROPERTIES INSTALL_RPATH "${_ompk_lib_rpath}" BUILD_WITH_INSTALL_RPATH ON)
set_target_properties(ompk-info ompk-bench PROPERTIES INSTALL_RPATH "${_ompk_rpath}")
# DT_RUNPATH (not DT_RPATH), so LD_LIBRARY_PATH can still override a library when wanted.
target_link_options(ompk PRIVATE "LINKER:--enable-new-dtags")
target_link_options(ompk-info PRIVATE "LINKER:--enable-new-dtags")
target_link_options(ompk-bench PRIVATE "LINKER:--enable-new-dtags")

if(NOT OMPK_LIBRARY_TYPE STREQUAL "SHARED")
  # A static libompk carries device-link flags that point into this build tree.
  message(STATUS "ompk: install rules cover the SHARED library only (OMPK_LIBRARY_TYPE=${OMPK_LIBRARY_TYPE})")
  return()
endif()

install(TARGETS ompk EXPORT ompkTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(OMPK_MPI_BUILT)
  # find_package(ompk) -> ompk::ompk_mpi as well (MPI found through find_dependency)
  set_target_properties(ompk_mpi PROPERTIES VERSION ${PROJECT_VERSION} SOVERSION ${OMPK_SOVERSION}
                                            EXPORT_NAME ompk_mpi)
  install(TARGETS ompk_mpi EXPORT ompkTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(DIRECTORY include/ompk DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
else()
  install(DIRECTORY include/ompk DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h"
          PATTERN "moe_ep.h" EXCLUDE)
endif()
install(TARGETS ompk-info ompk-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(OMPK_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/ompk")
install(EXPORT ompkTargets NAMESPACE ompk:: DESTINATION ${OMPK_CMAKE_DIR})
configure_package_config_file(cmake/ompkConfig.cmake.in ${PROJECT_BINARY_DIR}/ompkConfig.cmake
                              INSTALL_DESTINATION ${OMPK_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ompkConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ompkConfig.cmake ${PROJECT_BINARY_DIR}/ompkConfigVersion.cmake
        DESTINATION ${OMPK_CMAKE_DIR})

# pkg-config: the public compile definitions of ompk (which families, whether GPU images are in).
set(OMPK_PC_CFLAGS "")
foreach(fam IN LISTS OMPK_FAMILIES)
  string(TOUPPER "${fam}" FAM)
  string(APPEND OMPK_PC_CFLAGS " -DOMPK_HAVE_${FAM}=1")
endforeach()
if(OMPK_OFFLOAD_ACTIVE)
  string(APPEND OMPK_PC_CFLAGS " -DOMPK_OFFLOAD_BUILD=1")
endif()
set(OMPK_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
# ompk.pc finds the prefix from its own place, so `cmake --install --prefix P` may pick any P.
file(RELATIVE_PATH OMPK_PC_UP "/root/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/root")
string(REGEX REPLACE "/$" "" OMPK_PC_UP "${OMPK_PC_UP}")
set(OMPK_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
configure_file(cmake/ompk.pc.in ${PROJECT_BINARY_DIR}/ompk.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ompk.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
