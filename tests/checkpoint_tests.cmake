# safetensors reading and writing, atomic saves (full disk, killed writer, unwritable
# directory) and the fuzzers' regression inputs; included from tests/CMakeLists.txt.
kiln_suite(checkpoint_tests checkpoint_test.cpp file_safety_test.cpp)
