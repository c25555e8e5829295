# Tests of fusion/jit (NVRTC, kernel cache, launching); included from tests/CMakeLists.txt.
# Links kiln_jit alone (not kiln_train, as kiln_suite does) so it builds independently.
add_executable(jit_tests jit_test.cpp $<TARGET_OBJECTS:kiln_test_main>)
target_link_libraries(jit_tests PRIVATE kiln_jit doctest::doctest)
kiln_warnings(jit_tests)
doctest_discover_tests(jit_tests PROPERTIES ENVIRONMENT "KILN_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
