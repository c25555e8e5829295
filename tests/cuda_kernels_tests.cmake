# Tests of backends/cuda (kiln_cuda_kernels) against the CPU reference kernels; included
# from tests/CMakeLists.txt when the CUDA toolkit is found. GPU cases skip without a GPU;
# the NVRTC compilation of every hand-written kernel is checked everywhere.
add_executable(cuda_kernels_tests cuda_kernels_test.cpp cuda_kernels_bench.cpp conv_classes_test.cpp conv_direct_test.cpp $<TARGET_OBJECTS:kiln_test_main>)
target_link_libraries(cuda_kernels_tests PRIVATE kiln_cuda_kernels kiln_graph doctest::doctest)
kiln_warnings(cuda_kernels_tests)
doctest_discover_tests(cuda_kernels_tests PROPERTIES ENVIRONMENT "KILN_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
