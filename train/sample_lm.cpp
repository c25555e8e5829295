// sample_language_model: a one-step graph at batch 1 whose state is fed back each step;
// characters are drawn on the host.
#include <cmath>

#include "backends/compile.h"
#include "core/safetensors.h"
#include "graph/op.h"
#include "models/char_lstm.h"
#include "train/checkpoint.h"
#include "train/saved_classifier.h"
#include "data/text_dataset.h"
#include "train/lm_task.h"

namespace kiln {
namespace {

// The architecture recorded in the checkpoint (kiln.config, or an older one's loose keys);
// the config's for a checkpoint that names no model.
CharLstmOptions checkpoint_options(const Checkpoint& checkpoint, const LmSettings& fallback) {
  const std::string model = checkpoint.metadata_value("model");
  KILN_CHECK(model.empty() || model == "char-lstm", "{} is a checkpoint of '{}', not of char-lstm",
             checkpoint.path().string(), model.substr(0, 60));
  const LmSettings lm = model.empty() ? fallback : checkpoint_config(checkpoint).lm;
  return {.embedding = lm.embedding,
          .hidden = lm.hidden,
          .layers = lm.layers,
          .cell = nn::cell_kind_from_name(lm.cell)};
}

// A token drawn from softmax(logits / temperature) with one Philox block.
std::int64_t draw(const Tensor& logits, double temperature, Philox& rng) {
  const float* l = logits.data<float>();
  const std::int64_t n = logits.numel();
  double top = l[0];
  for (std::int64_t i = 1; i < n; ++i) top = std::max(top, static_cast<double>(l[i]));
  std::vector<double> weights(static_cast<std::size_t>(n));
  double total = 0;
  for (std::int64_t i = 0; i < n; ++i)
    total += weights[static_cast<std::size_t>(i)] = std::exp((l[i] - top) / temperature);
  const double u =
      static_cast<double>(rng.next_below(std::uint64_t{1} << 32)) / 4294967296.0 * total;
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    sum += weights[static_cast<std::size_t>(i)];
    if (u < sum) return i;
  }
  return n - 1;
}

// The one-step graph: inputs "x" [1, 1], "h<k>", "c<k>" [1, H]; outputs "logits", "h<k>", "c<k>".
std::unique_ptr<Program> compile_sampler(CharLstm& model, const Device& device) {
  Graph g;
  nn::RecurrentState state;
  const std::int64_t h = model.options().hidden;
  const bool lstm = model.options().cell == nn::CellKind::lstm;
  for (std::int64_t k = 0; k < model.options().layers; ++k) {
    state.h.push_back(g.input(fmt::format("h{}", k), {1, h}));
    if (lstm) state.c.push_back(g.input(fmt::format("c{}", k), {1, h}));
  }
  const CharLstm::Result r = model.forward(g.input("x", {1, 1}, DType::i64), state);
  g.output("logits", r.logits);
  for (std::size_t k = 0; k < r.state.h.size(); ++k) g.output(fmt::format("h{}", k), r.state.h[k]);
  for (std::size_t k = 0; k < r.state.c.size(); ++k) g.output(fmt::format("c{}", k), r.state.c[k]);
  return compile(g, {.device = device});
}

}  // namespace

std::string sample_language_model(const TrainConfig& config) {
  const LmSettings& c = config.lm;
  KILN_CHECK(!config.loop.resume.empty(),
             "--sample needs --resume CHECKPOINT (a trained char-lstm)");
  KILN_CHECK(c.sample >= 1, "--sample {}: at least one character", c.sample);
  KILN_CHECK(std::isfinite(c.temperature) && c.temperature > 0,
             "--temperature must be positive (got {})", c.temperature);
  Philox init(config.loop.seed);
  const Checkpoint checkpoint(config.loop.resume);
  const CharLstmOptions options = checkpoint_options(checkpoint, c);
  std::unique_ptr<CharLstm> model;
  try {  // a size in the metadata the host cannot allocate names the checkpoint too
    model = std::make_unique<CharLstm>(options, init);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", checkpoint.path().string(), e.what()));
  }
  checkpoint.restore(model->parameters(), {});
  std::unique_ptr<Program> program = compile_sampler(*model, resolve_device(config.device.name));

  std::vector<Feed> feeds;  // the state, then the token
  for (const Node& n : program->graph().nodes())
    if (n.op->id == OpId::input && n.name != "x")
      feeds.emplace_back(n.name, Tensor::zeros(n.outputs[0].shape, DType::f32));
  feeds.emplace_back("x", Tensor::zeros({1, 1}, DType::i64));
  auto step = [&](std::int64_t token) {
    feeds.back().tensor.data<std::int64_t>()[0] = token;
    Outputs out = program->run(feeds);
    for (std::size_t k = 0; k + 1 < feeds.size(); ++k) feeds[k].tensor = out.at(feeds[k].name);
    return out.at("logits");
  };
  const std::string prime = normalize_text(c.prime);
  std::string text = prime;
  Tensor logits;
  for (char ch : prime.empty() ? std::string("\n") : prime) logits = step(token_of(ch));
  Philox rng(config.loop.seed);
  for (std::int64_t i = 0; i < c.sample; ++i) {
    const std::int64_t token = draw(logits, c.temperature, rng);
    text += char_of(token);
    if (i + 1 < c.sample) logits = step(token);
  }
  return text;
}

}  // namespace kiln
