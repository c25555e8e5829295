// dump: shows a model's graph before and after fusion, the fused kernels and their CUDA
// source.   dump --model lenet --stage train --format text|dot|json [--kernels]
// Exit codes: 0 done, 1 an error, 2 a bad flag.
#include "tools/tool_main.h"

int main(int argc, char** argv) { return kiln::dump_main(argc, argv); }
