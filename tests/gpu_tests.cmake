# Tests of gpu/ (NVRTC, kernel cache, launching); included from tests/CMakeLists.txt.
# Links kiln_gpu alone (not kiln_train, as kiln_suite does) so it builds independently.
add_executable(gpu_tests gpu_test.cpp tuning_test.cpp $<TARGET_OBJECTS:kiln_test_main>)
target_link_libraries(gpu_tests PRIVATE kiln_gpu doctest::doctest)
kiln_warnings(gpu_tests)
doctest_discover_tests(gpu_tests PROPERTIES ENVIRONMENT "KILN_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
