// train_language_model: text, char-lstm, one compiled training step and one evaluation
// step, random windows per step, validation bits per character per epoch.
#include "train/train_lm.h"

#include <chrono>
#include <cmath>

#include "backends/compile.h"
#include "core/log.h"
#include "graph/autograd.h"
#include "graph/nn/functional.h"
#include "graph/train_step.h"
#include "models/char_lstm.h"
#include "train/checkpoint.h"
#include "train/lr_schedule.h"
#include "train/metrics.h"
#include "train/progress.h"
#include "train/step_graph.h"
#include "data/text_dataset.h"

namespace kiln {
namespace {

const double kLn2 = std::log(2.0);
static_assert(kVocabulary == kCharLstmVocabulary, "the text's vocabulary is the model's");

CharLstmOptions lm_options(const TrainConfig& c) {
  return {.embedding = c.embedding,
          .hidden = c.hidden,
          .layers = c.layers,
          .cell = nn::cell_kind_from_name(c.cell)};
}

void check_lm_config(const TrainConfig& c) {
  KILN_CHECK(c.epochs >= 1, "epochs must be at least 1 (got {})", c.epochs);
  KILN_CHECK(c.batch_size >= 1, "batch size must be at least 1 (got {})", c.batch_size);
  KILN_CHECK(c.seq_len >= 1, "sequence length must be at least 1 (got {})", c.seq_len);
  KILN_CHECK(c.embedding >= 1 && c.hidden >= 1 && c.layers >= 1,
             "embedding {}, hidden {} and layers {} must be positive", c.embedding, c.hidden,
             c.layers);
  KILN_CHECK(c.clip_grad_norm >= 0 && std::isfinite(c.clip_grad_norm),
             "gradient clipping norm must be >= 0 (got {})", c.clip_grad_norm);
  KILN_CHECK(!c.bidirectional,
             "char-lstm predicts the next character, so it cannot be bidirectional (drop "
             "--bidirectional)");
  nn::cell_kind_from_name(c.cell);
}

// Mean cross-entropy (nats) of next-character predictions: inputs "x", "y" i64 [T, B].
Value lm_loss(CharLstm& model, Graph& g, std::int64_t batch, std::int64_t seq_len) {
  const Value x = g.input("x", {seq_len, batch}, DType::i64);
  const Value y = g.input("y", {seq_len, batch}, DType::i64);
  return cross_entropy(model.forward(x).logits, reshape(y, {seq_len * batch}));
}

// Appends the training step of `model` to `g`: gradients, clipping, the optimizer's update.
void append_lm_step(Graph& g, CharLstm& model, Optimizer& optimizer, const TrainConfig& c) {
  append_training_step(lm_loss(model, g, c.batch_size, c.seq_len), model.parameters(), optimizer,
                       TrainStepOptions{.clip_grad_norm = c.clip_grad_norm});
}

// Bits per character over every validation window, `batch` windows per run.
class LmEvaluator {
 public:
  LmEvaluator(CharLstm& model, const std::vector<std::uint8_t>& tokens, std::int64_t batch,
              std::int64_t seq_len, const CompileOptions& options)
      : windows_(tokens, seq_len), batch_(std::min(batch, windows_.windows())), seq_len_(seq_len) {
    KILN_ASSERT(batch_ >= 1, "validation text without a window of {}", seq_len + 1);
    Graph g;
    g.output("loss", lm_loss(model, g, batch_, seq_len));
    program_ = compile(g, options);
  }

  double bits_per_char() {
    Tensor x = Tensor::empty({seq_len_, batch_}, DType::i64),
           y = Tensor::empty({seq_len_, batch_}, DType::i64);
    const std::int64_t batches = windows_.windows() / batch_;
    double total = 0;
    for (std::int64_t b = 0; b < batches; ++b) {
      windows_.fill(b, x, y);
      total += program_->run({{"x", x}, {"y", y}}).at("loss").item();
    }
    return total / static_cast<double>(batches) / kLn2;
  }

 private:
  TextWindows windows_;
  std::int64_t batch_, seq_len_;
  std::unique_ptr<Program> program_;
};

std::map<std::string, std::string> lm_settings(const TrainConfig& c) {
  return {{"model", c.model},
          {"embedding", std::to_string(c.embedding)},
          {"hidden", std::to_string(c.hidden)},
          {"layers", std::to_string(c.layers)},
          {"cell", c.cell},
          {"seq_len", std::to_string(c.seq_len)},
          {"batch_size", std::to_string(c.batch_size)},
          {"optimizer", c.optimizer},
          {"lr", fmt::format("{}", c.lr)},
          {"lr_schedule", c.lr_schedule},
          {"seed", std::to_string(c.seed)},
          {"epochs", std::to_string(c.epochs)}};
}

// One run: the data, the model, its compiled steps, and where training stands.
class LmRun {
 public:
  explicit LmRun(const TrainConfig& c);
  std::int64_t done() const { return done_; }
  std::int64_t last() const { return last_; }
  LmEpochResult run_epoch(MetricsWriter& metrics);
  std::vector<VariablePtr> parameters() const { return model_.parameters(); }

 private:
  double train_step(std::int64_t epoch, std::int64_t in_epoch, double seconds, Progress& progress,
                    MetricsWriter& metrics);
  void save(std::int64_t done);

  const TrainConfig& c_;
  LrSchedule schedule_;
  TextCorpus corpus_;
  Philox rng_;
  CharLstm model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Program> step_;
  std::unique_ptr<LmEvaluator> evaluator_;
  TextBatcher batcher_;
  std::int64_t per_epoch_, planned_, last_, done_ = 0;
  Tensor x_, y_;
};

LmRun::LmRun(const TrainConfig& c)
    : c_(c),
      schedule_(lr_schedule_of(c)),
      corpus_(load_text_corpus(c.text_path, c.seq_len + 1)),
      rng_(c.seed),
      model_(lm_options(c), rng_),
      optimizer_(make_optimizer({.name = c.optimizer,
                                 .lr = c.lr,
                                 .momentum = c.momentum,
                                 .weight_decay = c.weight_decay})),
      batcher_(corpus_.train, c.batch_size, c.seq_len, c.seed),
      per_epoch_(lm_steps_per_epoch(static_cast<std::int64_t>(corpus_.train.size()), c.batch_size,
                                    c.seq_len)),
      planned_(c.epochs * per_epoch_),
      last_(c.max_steps >= 0 ? std::min(planned_, c.max_steps) : planned_),
      x_(Tensor::empty({c.seq_len, c.batch_size}, DType::i64)),
      y_(Tensor::empty({c.seq_len, c.batch_size}, DType::i64)) {
  log().info("char-lstm: {} ({} training and {} validation characters, {} steps per epoch)",
             corpus_.source, corpus_.train.size(), corpus_.validation.size(), per_epoch_);
  const CompileOptions options{.device = c.device,
                               .cuda_graphs = c.cuda_graphs,
                               .tf32 = c.tf32,
                               .cuda_streams = c.cuda_streams,
                               .check_numerics = c.check_numerics,
                               .deterministic = c.deterministic};
  Graph g;
  append_lm_step(g, model_, *optimizer_, c);
  step_ = compile(g, options);
  evaluator_ =
      std::make_unique<LmEvaluator>(model_, corpus_.validation, c.batch_size, c.seq_len, options);
  if (!c.resume_path.empty()) {
    done_ = load_checkpoint(c.resume_path, model_.parameters(), optimizer_->state()).step;
    log().info("resumed from {} at step {}", c.resume_path, done_);
  }
}

void LmRun::save(std::int64_t done) {
  const TrainingPosition p{done, done / per_epoch_ + 1, done % per_epoch_};
  if (!c_.checkpoint_path.empty())
    save_checkpoint(c_.checkpoint_path, model_.parameters(), optimizer_->state(), p,
                    lm_settings(c_));
}

// Runs step done_ (the in_epoch-th of its epoch); returns its bits per character.
double LmRun::train_step(std::int64_t epoch, std::int64_t in_epoch, double seconds,
                         Progress& progress, MetricsWriter& metrics) {
  optimizer_->set_lr(schedule_.at(done_, planned_));
  if (!c_.trace_path.empty() && done_ == std::min<std::int64_t>(9, last_ - 1))
    step_->trace_next_run(c_.trace_path);
  batcher_.fill(done_, x_, y_);
  const double loss = step_->run({{"x", x_}, {"y", y_}}).at("loss").item();
  KILN_CHECK(std::isfinite(loss),
             "training diverged: loss is {} at step {} (lower the learning rate or clip gradients)",
             loss, done_ + 1);
  const double chars_per_second =
      static_cast<double>(in_epoch * c_.batch_size * c_.seq_len) / seconds;
  if (c_.progress) progress.update(in_epoch, loss / kLn2, chars_per_second);
  metrics.write("train", {{"step", done_ + 1},
                          {"epoch", epoch},
                          {"loss", loss},
                          {"bits_per_char", loss / kLn2},
                          {"lr", optimizer_->lr()},
                          {"chars_per_second", chars_per_second}});
  ++done_;
  if (c_.save_every > 0 && done_ % c_.save_every == 0) save(done_);
  return loss / kLn2;
}

LmEpochResult LmRun::run_epoch(MetricsWriter& metrics) {
  const std::int64_t epoch = done_ / per_epoch_ + 1,
                     epoch_end = std::min(last_, epoch * per_epoch_);
  LmEpochResult r{.epoch = epoch, .steps = epoch_end - done_};
  Progress progress(fmt::format("epoch {}/{}", epoch, c_.epochs), r.steps,
                    c_.progress && stderr_is_terminal());
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  double bits_sum = 0;
  for (std::int64_t s = 1; done_ < epoch_end; ++s)
    bits_sum += train_step(epoch, s, elapsed(), progress, metrics);
  if (c_.progress) progress.finish();
  r.seconds = elapsed();
  r.chars_per_second = static_cast<double>(r.steps * c_.batch_size * c_.seq_len) / r.seconds;
  r.train_bits_per_char = bits_sum / static_cast<double>(r.steps);
  save(done_);
  r.validation_bits_per_char = evaluator_->bits_per_char();
  metrics.write("eval", {{"step", done_},
                         {"epoch", epoch},
                         {"train_bits_per_char", r.train_bits_per_char},
                         {"validation_bits_per_char", r.validation_bits_per_char},
                         {"seconds", r.seconds},
                         {"chars_per_second", r.chars_per_second}});
  return r;
}

}  // namespace

std::unique_ptr<Graph> char_lstm_graph(const TrainConfig& c, bool train) {
  check_lm_config(c);
  Philox rng(c.seed);
  CharLstm model(lm_options(c), rng);  // the graph's variable nodes keep the parameters alive
  auto g = std::make_unique<Graph>();
  if (!train) {
    g->output("loss", lm_loss(model, *g, c.batch_size, c.seq_len));
    return g;
  }
  const auto optimizer = make_optimizer(
      {.name = c.optimizer, .lr = c.lr, .momentum = c.momentum, .weight_decay = c.weight_decay});
  append_lm_step(*g, model, *optimizer, c);
  return g;
}

std::vector<Feed> random_text_feeds(const TrainConfig& c, std::uint64_t seed) {
  std::vector<Feed> feeds;
  Philox rng(seed);
  for (const char* name : {"x", "y"}) {
    Tensor t = Tensor::empty({c.seq_len, c.batch_size}, DType::i64);
    for (std::int64_t i = 0; i < t.numel(); ++i)
      t.data<std::int64_t>()[i] = static_cast<std::int64_t>(rng.next_below(kVocabulary));
    feeds.emplace_back(name, t);
  }
  return feeds;
}

std::int64_t lm_steps_per_epoch(std::int64_t train_tokens, std::int64_t batch,
                                std::int64_t seq_len) {
  return std::max<std::int64_t>(1, train_tokens / std::max<std::int64_t>(1, batch * seq_len));
}

std::vector<LmEpochResult> train_language_model(
    const TrainConfig& c, const std::function<void(const LmEpochResult&)>& on_epoch,
    const std::function<void(const std::vector<VariablePtr>&)>& on_finish) {
  check_lm_config(c);
  lr_schedule_of(c).validate();
  if (!c.checkpoint_path.empty()) check_checkpoint_directory(c.checkpoint_path);
  MetricsWriter metrics = c.metrics_path.empty() ? MetricsWriter() : MetricsWriter(c.metrics_path);
  LmRun run(c);
  std::vector<LmEpochResult> results;
  while (run.done() < run.last()) {
    results.push_back(run.run_epoch(metrics));
    if (on_epoch) on_epoch(results.back());
  }
  if (on_finish) on_finish(run.parameters());
  return results;
}

}  // namespace kiln
