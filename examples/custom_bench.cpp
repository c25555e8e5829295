// Your model in kiln's bench: tiny-cnn's training step timed (also on N ranks: --ranks N runs
// this program N times).
//   custom_bench --model tiny-cnn --batch-size 64 --steps 50
#include "tiny_cnn.h"
#include "tools/tool_main.h"

int main(int argc, char** argv) {
  register_tiny_cnn();
  return kiln::bench_main(argc, argv);
}
