// bench: times training steps (warm-up, then the median of many) and prints a table; --json
// writes the figures. The speed targets of the issues are checked with this tool.
//   bench --model lenet --batch-size 64 --steps 100
#include "tools/tool_main.h"

int main(int argc, char** argv) { return kiln::bench_main(argc, argv); }
