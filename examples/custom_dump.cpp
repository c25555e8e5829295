// Your model in kiln's dump: the graphs of tiny-cnn's step before and after fusion, its fused
// kernels and their generated source.
//   custom_dump --model tiny-cnn [--kernels] [--precision bf16]
#include "tiny_cnn.h"
#include "tools/tool_main.h"

int main(int argc, char** argv) {
  register_tiny_cnn();
  return kiln::dump_main(argc, argv);
}
