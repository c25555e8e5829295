// What a task (classifier, GAN, language model) gives the one training loop
// (train/loop.h): its compiled step programs, one step's feeds, what a step's outputs
// mean, its evaluation and its state. Everything else (schedule, progress, metrics,
// checkpoints, tracing, prefetch, data parallelism) is the loop's, so every task has it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backends/program.h"
#include "train/config.h"

namespace kiln {

// Named numbers of a step or an evaluation ("d_loss", "test_accuracy", ...), in order.
using Values = std::vector<std::pair<std::string, double>>;

// What one step gave: the loss the loop reports and checks, and the task's other values
// (the metrics lines carry their means).
struct StepValues {
  double loss = 0;
  Values extras;
};

// One of a step's compiled programs and what to call it (in traces).
struct StepProgram {
  std::string name;  // "step", "discriminator step", ...
  Program* program = nullptr;
};

// A checkpoint's tensors: the task's variables by role.
struct TaskState {
  std::vector<VariablePtr> parameters, optimizer_state, buffers;
};

// What the loop gives a task when it is made.
struct TaskContext {
  CompileOptions options;  // the run's one set of compile options
  int rank = 0;            // this process's share of the global batch
  int world_size = 1;
  int collective_group = -1;  // >= 0: TrainStepOptions::data_parallel_group of the steps
  // Averages host numbers over the ranks (the same bits on each); identity for one process.
  std::function<void(std::span<double>)> average = [](std::span<double>) {};
};

class Task {
 public:
  virtual ~Task() = default;

  // Steps in one epoch (at the global batch), and the examples a step trains on (all ranks).
  virtual std::int64_t steps_per_epoch() const = 0;
  virtual std::int64_t examples_per_step() const = 0;
  // Whether --max-steps shortens the schedule's horizon (classifiers, GANs) or only stops
  // early (the LM: a run stopped and resumed then follows the uninterrupted schedule).
  virtual bool max_steps_sets_horizon() const { return true; }

  // The compiled programs of one step, in the order they run.
  virtual std::vector<StepProgram> programs() = 0;
  virtual void start_epoch(std::int64_t epoch) { (void)epoch; }
  // The feeds of each program for batch `batch` of the current epoch, which is step `step`
  // (0-based) of the whole run. Fresh tensors: the loop may prefetch them a step ahead.
  virtual std::vector<std::vector<Feed>> feeds(std::int64_t batch, std::int64_t step) = 0;
  // The step's values from each program's outputs.
  virtual StepValues step_values(const std::vector<Outputs>& outputs) = 0;
  virtual void set_lr(double lr) = 0;

  // After an epoch, on rank 0: the evaluation's values (and sample files, named by path).
  virtual Values evaluate(std::int64_t epoch,
                          std::vector<std::pair<std::string, std::string>>& files) = 0;
  // Everything a checkpoint holds and the replicas must agree on.
  virtual TaskState state() const = 0;
  // Metadata the task adds to its checkpoints (a classifier: its class names and input).
  virtual std::map<std::string, std::string> metadata() const { return {}; }
};

}  // namespace kiln
