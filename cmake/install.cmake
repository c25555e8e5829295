# `cmake --install build --prefix P`: headers under P/include/kiln (core/, graph/, ... as in
# the source tree), the libraries, the tools, and the CMake package kiln (kiln::kiln links
# everything) so that another project's find_package(kiln) works.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(kiln_libraries kiln_core kiln_graph kiln_gpu kiln_fusion kiln_backends kiln_distributed kiln_data kiln_models kiln_train
                   kiln_openmp_defaults kiln_cli)
if(TARGET kiln_cuda_kernels)
  list(APPEND kiln_libraries kiln_cuda_kernels)
endif()

# Headers are included as "core/tensor.h": the source root while building, include/kiln once installed.
target_include_directories(kiln_core PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
                                            $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/kiln>)

add_library(kiln INTERFACE)  # the one target users link (the trainer's command line included)
target_link_libraries(kiln INTERFACE kiln_train kiln_cli)
add_library(kiln::kiln ALIAS kiln)

install(TARGETS kiln ${kiln_libraries} EXPORT kilnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS trainer dump bench kiln-cache RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
foreach(folder core graph gpu fusion backends distributed data models train)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${folder} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln FILES_MATCHING PATTERN "*.h")
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/tools/tool_main.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln/tools)

set(kiln_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)
install(EXPORT kilnTargets NAMESPACE kiln:: DESTINATION ${kiln_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kilnConfig.cmake.in ${PROJECT_BINARY_DIR}/kilnConfig.cmake
                              INSTALL_DESTINATION ${kiln_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kilnConfig.cmake ${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake DESTINATION ${kiln_cmake_dir})
