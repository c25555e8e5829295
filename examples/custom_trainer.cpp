// Your model in kiln's trainer: TinyCnn (tiny_cnn.h) registered as "tiny-cnn" beside the zoo's
// models, then the trainer's command line, so it trains with every trainer flag and has eval,
// predict and data parallelism (--ranks N runs this program N times).
//   custom_trainer --model tiny-cnn --epochs 2 --checkpoint tiny.safetensors
//   custom_trainer eval --checkpoint tiny.safetensors
#include "tiny_cnn.h"
#include "tools/tool_main.h"

int main(int argc, char** argv) {
  register_tiny_cnn();
  return kiln::trainer_main(argc, argv);
}
