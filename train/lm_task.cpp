// LmTask: text, char-lstm, its compiled training step and the validation evaluator.
#include "train/lm_task.h"

#include <cmath>

#include "core/log.h"
#include "data/text_dataset.h"
#include "graph/nn/functional.h"
#include "models/char_lstm.h"
#include "train/tasks.h"

namespace kiln {
namespace {

const double kLn2 = std::log(2.0);
static_assert(kVocabulary == kCharLstmVocabulary, "the text's vocabulary is the model's");

CharLstmOptions lm_options(const LmSettings& lm) {
  return {.embedding = lm.embedding,
          .hidden = lm.hidden,
          .layers = lm.layers,
          .cell = nn::cell_kind_from_name(lm.cell)};
}

// Mean cross-entropy (nats) of next-character predictions: inputs "x", "y" i64 [T, B].
Value lm_loss(CharLstm& model, Graph& g, std::int64_t batch, std::int64_t seq_len) {
  const Value x = g.input("x", {seq_len, batch}, DType::i64);
  const Value y = g.input("y", {seq_len, batch}, DType::i64);
  return cross_entropy(model.forward(x).logits, reshape(y, {seq_len * batch}));
}

// Appends the training step of `model` to `g`: gradients, clipping, the optimizer's update.
void append_lm_step(Graph& g, CharLstm& model, Optimizer& optimizer, const TrainConfig& c,
                    int collective_group) {
  append_training_step(lm_loss(model, g, c.loop.batch_size, c.lm.seq_len), model.parameters(),
                       optimizer,
                       {.clip_grad_norm = c.loop.clip_grad_norm,
                        .data_parallel_group = collective_group,
                        .bucket_bytes = static_cast<std::size_t>(c.parallel.bucket_kib) * 1024,
                        .loss_scale = loss_scale_of(c.device),
                        .accumulate = static_cast<int>(c.loop.accumulate)});
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

class LmTask : public Task {
 public:
  LmTask(const TrainConfig& c, const TaskContext& context)
      : batch_(c.loop.batch_size),
        seq_len_(c.lm.seq_len),
        world_size_(context.world_size),
        corpus_(load_text_corpus(c.lm.text, c.lm.seq_len + 1)),
        rng_(c.loop.seed),
        model_(lm_options(c.lm), rng_),
        optimizer_(make_optimizer(optimizer_config(c.loop))),
        batcher_(corpus_.train, batch_, seq_len_, c.loop.seed, context.rank, context.world_size),
        per_epoch_(lm_steps_per_epoch(static_cast<std::int64_t>(corpus_.train.size()),
                                      batch_ * world_size_, seq_len_)) {
    log().info("char-lstm: {} ({} training and {} validation characters, {} steps per epoch)",
               corpus_.source, corpus_.train.size(), corpus_.validation.size(), per_epoch_);
    Graph g;
    append_lm_step(g, model_, *optimizer_, c, context.collective_group);
    step_ = compile(g, context.options);
    evaluator_ = std::make_unique<LmEvaluator>(model_, corpus_.validation, batch_, seq_len_,
                                               context.options);
  }

  std::int64_t steps_per_epoch() const override { return per_epoch_; }
  std::int64_t examples_per_step() const override { return batch_ * world_size_; }
  bool max_steps_sets_horizon() const override { return false; }
  std::vector<StepProgram> programs() override { return {{"step", step_.get()}}; }

  std::vector<std::vector<Feed>> feeds(std::int64_t, std::int64_t step) override {
    Tensor x = Tensor::empty({seq_len_, batch_}, DType::i64);
    Tensor y = Tensor::empty({seq_len_, batch_}, DType::i64);
    batcher_.fill(step, x, y);
    return {{{"x", x}, {"y", y}}};
  }

  StepValues step_values(const std::vector<Outputs>& outputs) override {
    const double loss = outputs[0].at("loss").item();
    return {.loss = loss, .extras = {{"bits_per_char", loss / kLn2}}};
  }
  void set_lr(double lr) override { optimizer_->set_lr(lr); }

  Values evaluate(std::int64_t, std::vector<std::pair<std::string, std::string>>&) override {
    return {{"validation_bits_per_char", evaluator_->bits_per_char()}};
  }
  TaskState state() const override { return {model_.parameters(), optimizer_->state(), {}}; }

 private:
  std::int64_t batch_, seq_len_;
  int world_size_;
  TextCorpus corpus_;
  Philox rng_;
  CharLstm model_;
  std::unique_ptr<Optimizer> optimizer_;
  TextBatcher batcher_;
  std::int64_t per_epoch_;
  std::unique_ptr<Program> step_;
  std::unique_ptr<LmEvaluator> evaluator_;
};

std::string summary(const TrainConfig& c, const EpochReport& r) {
  return fmt::format(
      "epoch {}: train {:.3f} bits/char, validation {:.3f} bits/char, {:.0f} chars/s, {:.1f} s "
      "({} steps)",
      r.epoch, r.value("bits_per_char"), r.value("validation_bits_per_char"),
      r.examples_per_second * static_cast<double>(c.lm.seq_len), r.seconds, r.steps);
}

RecordedStep record(const TrainConfig& c, const std::string& stage) {
  return {nullptr, char_lstm_graph(c, stage == "train")};
}

// bench: Adam at its defaults on random tokens.
BenchStep bench_step(const TrainConfig& c, const TaskContext& context) {
  const std::int64_t batch = c.loop.batch_size;
  return {.label = fmt::format("{} training step, batch {}, sequence {}, Adam", c.model, batch,
                               c.lm.seq_len),
          .items = batch * c.lm.seq_len,
          .recorded = {nullptr, char_lstm_graph(c, true, context.collective_group)},
          .feeds = random_text_feeds(c, 1 + static_cast<std::uint64_t>(context.rank))};
}

}  // namespace

std::unique_ptr<Graph> char_lstm_graph(const TrainConfig& c, bool train, int collective_group) {
  Philox rng(c.loop.seed);
  CharLstm model(lm_options(c.lm), rng);  // the graph's variable nodes keep the parameters alive
  auto g = std::make_unique<Graph>();
  if (!train) {
    g->output("loss", lm_loss(model, *g, c.loop.batch_size, c.lm.seq_len));
    return g;
  }
  const auto optimizer = make_optimizer(optimizer_config(c.loop));
  append_lm_step(*g, model, *optimizer, c, collective_group);
  return g;
}

std::vector<Feed> random_text_feeds(const TrainConfig& c, std::uint64_t seed) {
  std::vector<Feed> feeds;
  Philox rng(seed);
  for (const char* name : {"x", "y"}) {
    Tensor t = Tensor::empty({c.lm.seq_len, c.loop.batch_size}, DType::i64);
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

TaskEntry language_model_task() {
  return {.kind = ModelTask::language_model,
          .name = "language model",
          .make = [](const TrainConfig& c, const TaskContext& context) -> std::unique_ptr<Task> {
            return std::make_unique<LmTask>(c, context);
          },
          .apply_defaults = nullptr,
          .summary = summary,
          .stages = {"train", "forward"},
          .record = record,
          .bench = bench_step};
}

}  // namespace kiln
