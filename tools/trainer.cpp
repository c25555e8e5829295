// trainer: trains a model from the command line; evaluates or applies a trained one.
//   trainer --model lenet --epochs 2 --checkpoint c.safetensors
//   trainer eval --checkpoint c.safetensors
//   trainer predict --checkpoint c.safetensors --images t10k-images-idx3-ubyte.gz
// Exit codes: 0 done, 1 a runtime error (bad data, divergence), 2 a bad flag or value.
#include "tools/tool_main.h"

int main(int argc, char** argv) { return kiln::trainer_main(argc, argv); }
