// Your model in kiln's trainer: TinyCnn (tiny_cnn.h) registered as "tiny-cnn" beside the zoo's
// models, then the trainer's command line, so it trains with every trainer flag and has eval,
// predict and data parallelism (--ranks N runs this program N times).
//   custom_trainer --model tiny-cnn --epochs 2 --checkpoint tiny.safetensors
//   custom_trainer eval --checkpoint tiny.safetensors
#include <memory>

#include "models/registry.h"
#include "tiny_cnn.h"
#include "tools/trainer_main.h"

int main(int argc, char** argv) {
  kiln::register_classifier(
      {.name = "tiny-cnn",
       .description = "2 conv + 2 linear layers for 28x28 images (examples/tiny_cnn.h)",
       .input_shape = kiln::Shape{1, 28, 28},
       .classes = 10},
      [](kiln::Philox& rng, const kiln::Shape&, std::int64_t) {
        return std::make_unique<TinyCnn>(rng);
      });
  return kiln::trainer_main(argc, argv);
}
