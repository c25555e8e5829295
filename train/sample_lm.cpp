// sample_language_model: a one-step graph at batch 1 whose state is fed back each step;
// characters are drawn on the host.
#include <cmath>

#include "backends/compile.h"
#include "core/safetensors.h"
#include "graph/op.h"
#include "models/char_lstm.h"
#include "train/checkpoint.h"
#include "data/text_dataset.h"
#include "train/train_lm.h"

namespace kiln {
namespace {

std::int64_t setting(const std::map<std::string, std::string>& m, const std::string& key,
                     std::int64_t fallback) {
  auto it = m.find(key);
  if (it == m.end()) return fallback;
  try {
    return std::stoll(it->second);
  } catch (const std::exception&) {
    throw Error(fmt::format("checkpoint metadata '{}' is '{}', not a number", key, it->second));
  }
}

// The architecture recorded in the checkpoint (the config's values where it has none).
CharLstmOptions checkpoint_options(const TrainConfig& c) {
  const std::map<std::string, std::string> m = load_safetensors(c.resume_path).metadata;
  auto model = m.find("model");
  KILN_CHECK(model == m.end() || model->second == "char-lstm",
             "{} is a checkpoint of '{}', not of char-lstm", c.resume_path, model->second);
  auto cell = m.find("cell");
  return {.embedding = setting(m, "embedding", c.embedding),
          .hidden = setting(m, "hidden", c.hidden),
          .layers = setting(m, "layers", c.layers),
          .cell = nn::cell_kind_from_name(cell == m.end() ? c.cell : cell->second)};
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

std::string sample_language_model(const TrainConfig& c) {
  KILN_CHECK(!c.resume_path.empty(), "--sample needs --resume CHECKPOINT (a trained char-lstm)");
  KILN_CHECK(c.sample_chars >= 1, "--sample {}: at least one character", c.sample_chars);
  KILN_CHECK(std::isfinite(c.temperature) && c.temperature > 0,
             "--temperature must be positive (got {})", c.temperature);
  Philox init(c.seed);
  CharLstm model(checkpoint_options(c), init);
  load_checkpoint(c.resume_path, model.parameters(), {});
  std::unique_ptr<Program> program = compile_sampler(model, c.device);

  std::vector<Feed> feeds;  // the state, then the token
  for (const Node& n : program->graph().nodes())
    if (n.op->name == "input" && n.name != "x")
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
  Philox rng(c.seed);
  for (std::int64_t i = 0; i < c.sample_chars; ++i) {
    const std::int64_t token = draw(logits, c.temperature, rng);
    text += char_of(token);
    if (i + 1 < c.sample_chars) logits = step(token);
  }
  return text;
}

}  // namespace kiln
