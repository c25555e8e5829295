# Tests of fusion/jit (NVRTC, kernel cache, launching); included from tests/CMakeLists.txt.
