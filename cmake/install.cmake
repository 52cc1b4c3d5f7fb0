# cmake/install.cmake: devmem as a library other builds consume (README.md, "Using
# devmem from another build").
#
#   devmem::devmem  the C++ libraries (tensor, runtime, allocator and, where it is built,
#                   the CUDA backend, linked whole-archive so it registers itself), with
#                   the include root: #include "runtime/runtime.h" or
#                   <devmem/runtime/runtime.h>.
#   devmem::capi    libdevmem.so, the C ABI: #include <devmem/devmem.h>.
#
# The same two names exist three ways: as ALIAS targets here (add_subdirectory), as the
# imported targets of the installed CMake package (find_package(devmem CONFIG)), and as
# pkg-config's devmem.pc (the C ABI). Installed layout under the prefix P:
#   P/include/devmem/{allocator,runtime,tensor}/*.h, devmem.h, devmem_version.h
#   P/lib/libdevmem_*.a, libdevmem.so.VERSION and its links
#   P/lib/cmake/devmem/, P/lib/pkgconfig/devmem.pc, P/bin/ (the tools, when built)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(DEVMEM_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/devmem)
set(DEVMEM_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/devmem)

# The include root as a usage requirement: devmem's own directories add it with
# include_directories(), a consumer gets it through the targets. Both roots: headers
# say "allocator/x.h", consumers may say <devmem/allocator/x.h>. In the build tree the
# generated root (devmem/devmem_version.h) is devmem::devmem's and devmem::capi's, not
# the libraries' own: they do not include from it, and their compile lines stay free
# of the binary directory (top-level CMakeLists.txt says why).
target_include_directories(devmem_allocator PUBLIC
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
  $<INSTALL_INTERFACE:${DEVMEM_INSTALL_INCLUDEDIR}>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

# capi/devmem.h is devmem/devmem.h for consumers: in the build tree a generated
# include/devmem/devmem.h forwards to it, installed it is the file itself.
file(WRITE ${PROJECT_BINARY_DIR}/include/devmem/devmem.h.tmp
  "/* Generated: forwards to capi/devmem.h (cmake/install.cmake). */\n"
  "#include \"${PROJECT_SOURCE_DIR}/capi/devmem.h\"\n")
file(COPY_FILE ${PROJECT_BINARY_DIR}/include/devmem/devmem.h.tmp
  ${PROJECT_BINARY_DIR}/include/devmem/devmem.h ONLY_IF_DIFFERENT)
target_include_directories(devmem_capi INTERFACE
  $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

# devmem::devmem: an interface target over the static libraries.
add_library(devmem_devmem INTERFACE)
target_include_directories(devmem_devmem INTERFACE
  $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>)
set(devmem_libs devmem_allocator devmem_runtime)
if(TARGET devmem_tensor)
  list(APPEND devmem_libs devmem_tensor)
  target_link_libraries(devmem_devmem INTERFACE devmem_tensor)
endif()
target_link_libraries(devmem_devmem INTERFACE devmem_runtime devmem_allocator)
if(TARGET devmem_cuda)
  list(APPEND devmem_libs devmem_cuda)
  # Whole-archive, as devmem_link_backends() does for devmem's executables: the
  # backend registers itself from a static initializer nothing else references. The
  # genex is exported verbatim, so it names the target by the name that exists in
  # both places: the alias here, the imported target in the package.
  add_library(devmem::cuda ALIAS devmem_cuda)
  target_link_libraries(devmem_devmem INTERFACE "$<LINK_LIBRARY:WHOLE_ARCHIVE,devmem::cuda>")
endif()
set_target_properties(devmem_devmem PROPERTIES EXPORT_NAME devmem)
foreach(lib IN LISTS devmem_libs)
  string(REPLACE "devmem_" "" name ${lib})
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${name})
endforeach()
set_target_properties(devmem_capi PROPERTIES EXPORT_NAME capi)
add_library(devmem::devmem ALIAS devmem_devmem)
add_library(devmem::capi ALIAS devmem_capi)

if(NOT DEVMEM_INSTALL)
  return()
endif()

foreach(dir allocator runtime tensor)
  if(EXISTS ${PROJECT_SOURCE_DIR}/${dir})
    install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION ${DEVMEM_INSTALL_INCLUDEDIR}/${dir}
      COMPONENT devel FILES_MATCHING PATTERN "*.h")
  endif()
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/capi/devmem.h
  ${PROJECT_BINARY_DIR}/include/devmem/devmem_version.h
  DESTINATION ${DEVMEM_INSTALL_INCLUDEDIR} COMPONENT devel)

install(TARGETS ${devmem_libs} devmem_devmem devmem_capi EXPORT devmemTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT devel
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT devel
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(EXPORT devmemTargets NAMESPACE devmem:: DESTINATION ${DEVMEM_INSTALL_CMAKEDIR}
  COMPONENT devel)

# The tools, and the converter memtrace import --from pytorch-snapshot runs from
# memtrace's own directory.
foreach(tool devmem-demo devmem-bench memtrace)
  if(TARGET ${tool})
    install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
  endif()
endforeach()
if(TARGET memtrace)
  install(PROGRAMS ${PROJECT_SOURCE_DIR}/tools/import/import_pytorch_snapshot.py
    DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
endif()

# What devmemConfig.cmake must find again for the imported targets' dependencies.
set(DEVMEM_CONFIG_HAVE_CUDA ${DEVMEM_HAVE_CUDA})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/devmemConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/devmemConfig.cmake INSTALL_DESTINATION ${DEVMEM_INSTALL_CMAKEDIR})
# 0.x: a new minor version may break the API (the SONAME carries major.minor too).
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/devmemConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/devmemConfig.cmake
  ${PROJECT_BINARY_DIR}/cmake/devmemConfigVersion.cmake
  DESTINATION ${DEVMEM_INSTALL_CMAKEDIR} COMPONENT devel)

# pkg-config: the C ABI only (the C++ libraries' dependencies are CMake packages).
# The prefix is computed from the .pc file's own location, so the prefix can move.
configure_file(${PROJECT_SOURCE_DIR}/cmake/devmem.pc.in ${PROJECT_BINARY_DIR}/cmake/devmem.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/cmake/devmem.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT devel)
