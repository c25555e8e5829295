// trainer eval / predict: load the checkpoint's model, run it forward, print.
#include "tools/trainer_commands.h"

#include <fmt/format.h>

#include <span>

#include "core/atomic_file.h"
#include "train/classifier_task.h"
#include "train/evaluate.h"
#include "train/saved_classifier.h"

namespace kiln::tools {
namespace {

void add_common_options(CLI::App& command, InferenceArgs& args) {
  command
      .add_option("--checkpoint", args.checkpoint, "a checkpoint written by trainer --checkpoint")
      ->required()
      ->check(CLI::ExistingFile);
  command.add_option("--batch", args.batch, "images per forward step")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  command.add_option("--device", args.device, "cpu, cuda or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  command
      .add_option("--precision", args.precision,
                  "fp32, tf32, bf16 or fp16 (default: the precision it was trained in)")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}));
  command.add_option("--threads", args.threads, "CPU threads (0: all cores)")
      ->check(CLI::Range(0, 4096));
}

// What the data of a config is called in eval's line.
std::string data_name(const TrainConfig& c) {
  if (c.images.synthetic) return "synthetic";
  const std::string kind = parse_data_source(c.images.data).kind;
  return kind == "fashion-mnist" ? "Fashion-MNIST" : kind;
}

// The forward's compile options: the given precision, else the checkpoint's.
CompileOptions inference_options(const InferenceArgs& args, const SavedClassifier& saved,
                                 Device device) {
  const Precision precision = args.precision.empty() ? precision_of(saved.config.device)
                                                     : *precision_from_name(args.precision);
  return {.device = device, .precision = precision};
}

}  // namespace

CLI::App* add_eval_command(CLI::App& app, InferenceArgs& args) {
  CLI::App* eval =
      app.add_subcommand("eval", "evaluate a checkpoint on the test set: accuracy and loss");
  add_common_options(*eval, args);
  eval->add_option("--data-dir", args.data_dir,
                   "directory with the IDX files (default: the one the checkpoint was trained on)");
  eval->add_option("--data", args.data,
                   "the test set of this --data source (default: the checkpoint's)");
  eval->add_flag("--synthetic", args.synthetic,
                 "the synthetic test set (default when the checkpoint was trained on one)");
  return eval;
}

CLI::App* add_predict_command(CLI::App& app, InferenceArgs& args) {
  CLI::App* predict = app.add_subcommand(
      "predict",
      "predict the class of every image of an IDX file or of image files, one line per image");
  add_common_options(*predict, args);
  predict
      ->add_option("--images", args.images,
                   "an IDX image file (u8 [N, H, W], plain or .gz), or PNG/JPEG/BMP files")
      ->required()
      ->check(CLI::ExistingFile);
  predict->add_option("--output", args.output, "write the predictions here instead of stdout");
  return predict;
}

void run_eval(const InferenceArgs& args, Device device) {
  SavedClassifier saved = load_classifier(args.checkpoint);
  TrainConfig data =
      saved.config;  // the test set it was trained against, unless the flags say otherwise
  if (!args.data_dir.empty()) {
    data.images.data_dir = args.data_dir;
    data.images.data = "fashion-mnist";
    data.images.synthetic = false;
  }
  if (!args.data.empty()) {
    data.images.data = args.data;
    data.images.synthetic = false;
  }
  if (args.synthetic) data.images.synthetic = true;
  const Dataset test = classifier_images(data).test;
  const CompileOptions options = inference_options(args, saved, device);
  Evaluator evaluator(*saved.model, saved.example, args.batch, options);
  const EvalResult r = evaluator.evaluate(test);
  fmt::print("{}: model {} after {} steps, {} test set of {} images on {}{}\n", args.checkpoint,
             saved.config.model, saved.step, data_name(data), r.examples, device.str(),
             options.precision == Precision::fp32
                 ? ""
                 : fmt::format(" in {}", precision_name(options.precision)));
  fmt::print("test accuracy {:.2f}% ({} of {}), test loss {:.4f}\n", 100.0 * r.accuracy, r.correct,
             r.examples, r.loss);
}

void run_predict(const InferenceArgs& args, Device device) {
  SavedClassifier saved = load_classifier(args.checkpoint);
  const bool files = is_image_file(args.images[0]);
  const Tensor images = prediction_inputs(args.images, saved);
  Evaluator evaluator(*saved.model, saved.example, args.batch,
                      inference_options(args, saved, device));
  const Tensor classes = predicted_classes(evaluator.logits(images));
  std::string lines;
  for (std::int64_t i = 0; i < classes.numel(); ++i) {
    const std::int64_t c = classes.data<std::int64_t>()[i];
    const std::string& name = saved.classes.at(static_cast<std::size_t>(c));
    if (files)
      lines += fmt::format("{}\t{}\t{}\n", args.images[static_cast<std::size_t>(i)], c, name);
    else
      lines += fmt::format("{}\t{}\n", c, name);
  }
  if (args.output.empty() || args.output == "-") {
    fmt::print("{}", lines);
    return;
  }
  // Atomically: a failed or interrupted write leaves the previous file, never half of one.
  try {
    write_file_atomically(
        args.output, std::span(reinterpret_cast<const std::uint8_t*>(lines.data()), lines.size()));
  } catch (const Error& e) {
    throw Error(fmt::format("--output {}", e.what()));
  }
}

}  // namespace kiln::tools
