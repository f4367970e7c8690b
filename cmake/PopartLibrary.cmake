# libpopart-cpu.so and its installation (README.md, "Install / use as a library"; docs/architecture.md).
#
# The runtime's folders stay static libraries (the tests link them). The shared library is made of
# their object files, so each source is compiled once. A new runtime library must be added to
# POPART_RUNTIME_LIBS; popart_cli_support and the tests are not part of the runtime.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
find_package(Threads REQUIRED)

set(POPART_RUNTIME_LIBS popart_core popart_ir popart_onnx_import popart_autodiff popart_optimizer
  popart_backend_cpu popart_comm popart_session)

# Position-independent objects, usable in the shared library. No interposition of the runtime's
# functions is supported, which keeps GCC inlining across them as in an executable.
set_target_properties(${POPART_RUNTIME_LIBS} PROPERTIES POSITION_INDEPENDENT_CODE ON)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  foreach(lib ${POPART_RUNTIME_LIBS})
    target_compile_options(${lib} PRIVATE -fno-semantic-interposition)
  endforeach()
endif()

set(POPART_LIBRARY_OBJECTS "")
foreach(lib ${POPART_RUNTIME_LIBS})
  list(APPEND POPART_LIBRARY_OBJECTS $<TARGET_OBJECTS:${lib}>)
endforeach()
add_library(popart_cpu SHARED ${POPART_LIBRARY_OBJECTS})
add_library(popart::popart ALIAS popart_cpu)
set_target_properties(popart_cpu PROPERTIES OUTPUT_NAME popart-cpu EXPORT_NAME popart
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})
# Every symbol of the library is linked from its objects; the static libraries after them add
# nothing but their own dependencies (oneDNN, onnx, protobuf, MPI, OpenMP, spdlog ...), so that a
# dependency added to a runtime library reaches the shared one too. No undefined symbol may remain.
target_link_libraries(popart_cpu PRIVATE ${POPART_RUNTIME_LIBS} PUBLIC Threads::Threads)
target_link_options(popart_cpu PRIVATE -Wl,--no-undefined)
target_include_directories(popart_cpu PUBLIC $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(popart_cpu PUBLIC cxx_std_20)

# Installed programs find the library relative to themselves, wherever the tree is unpacked.
file(RELATIVE_PATH POPART_BIN_TO_LIB /prefix/${CMAKE_INSTALL_BINDIR} /prefix/${CMAKE_INSTALL_LIBDIR})
set(POPART_INSTALL_RPATH "$ORIGIN/${POPART_BIN_TO_LIB}")

set(POPART_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/PopartCpu)
install(TARGETS popart_cpu EXPORT PopartCpuTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
# The public headers are include/popart/ and nothing else (tests/install checks they stand alone).
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/popart DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.hpp")
install(EXPORT PopartCpuTargets NAMESPACE popart:: DESTINATION ${POPART_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/PopartCpuConfig.cmake.in
  ${CMAKE_BINARY_DIR}/PopartCpuConfig.cmake INSTALL_DESTINATION ${POPART_CMAKE_DIR})
# 0.x releases keep the SONAME's ABI within a major version, like the SOVERSION says.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/PopartCpuConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/PopartCpuConfig.cmake ${CMAKE_BINARY_DIR}/PopartCpuConfigVersion.cmake
  DESTINATION ${POPART_CMAKE_DIR})

# pkg-config: paths relative to the .pc file, since cpack installs under another prefix than the
# configured one and an unpacked package may live anywhere.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(POPART_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(POPART_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  file(RELATIVE_PATH POPART_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
  string(REGEX REPLACE "/$" "" POPART_PC_TO_PREFIX "${POPART_PC_TO_PREFIX}")
  set(POPART_PC_LIBDIR "\${pcfiledir}/${POPART_PC_TO_PREFIX}/${CMAKE_INSTALL_LIBDIR}")
  set(POPART_PC_INCLUDEDIR "\${pcfiledir}/${POPART_PC_TO_PREFIX}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/popart-cpu.pc.in ${CMAKE_BINARY_DIR}/popart-cpu.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/popart-cpu.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# Debian package (cpack -G DEB; scripts/package.sh): one package with the library, popart-run,
# the headers and the CMake and pkg-config files. dpkg-shlibdeps computes Depends.
set(CPACK_PACKAGE_NAME popart-cpu)
set(CPACK_PACKAGE_VENDOR "popart-cpu")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "ONNX training and inference runtime for the CPU (PopART-like API, oneDNN)")
set(CPACK_PACKAGE_CONTACT "popart-cpu maintainers <maintainers@users.noreply.a-seed-8eaced56.example>")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${CPACK_PACKAGE_CONTACT}")
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY "=")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
include(CPack)
