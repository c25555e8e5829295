// The registry of training tasks: for each kind of model (models/registry.h's ModelTask),
// how to make its Task for the loop, its defaults, its epoch summary, the step graphs dump
// shows and the step bench times. trainer, dump and bench dispatch on the task here, once.
// A new task is one file (its Task and entry function) and one line in tasks.cpp.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "models/registry.h"
#include "train/loop.h"
#include "train/step_timing.h"
#include "train/task.h"

namespace kiln {

// A recorded (not compiled) step graph and what keeps its variables alive.
struct RecordedStep {
  std::shared_ptr<void> owner;  // the model and optimizer the graph reads
  std::unique_ptr<Graph> graph;
};

// What bench times for a task: one training step on random data.
struct BenchStep {
  std::string label;   // the row's name: "lenet training step, batch 64, SGD momentum"
  std::int64_t items;  // examples (a language model: characters) per step
  // A step that is one program: its recorded graph and feeds. bench compiles and times it
  // (also unfused, with --check-numerics, on one stream, or on N ranks).
  RecordedStep recorded;
  std::vector<Feed> feeds;
  // A step of several programs (a GAN's two) is timed by the task itself, compiled with the
  // options given; bench reports that row alone. Empty for a step of one program.
  std::function<TimedSteps(const CompileOptions&, int warmup, int steps)> time;
};

struct TaskEntry {
  ModelTask kind;
  std::string name;  // "classifier", "gan", "language model"
  std::unique_ptr<Task> (*make)(const TrainConfig&, const TaskContext&);
  // Settings of this task that differ from the table's where the user gave none (GANs:
  // Adam at 2e-4 with a constant rate); `given` holds the flags that were given.
  void (*apply_defaults)(TrainConfig&, const std::set<std::string>& given);
  std::string (*summary)(const TrainConfig&, const EpochReport&);  // the line after an epoch
  std::vector<std::string> stages;  // dump --stage: the first is the default
  // The graph of `stage` at the config's batch size and optimizer (dump, bench).
  RecordedStep (*record)(const TrainConfig&, const std::string& stage);
  // The step bench times for the config's model at its batch size, with bench's settings
  // (classifiers: SGD with momentum; the others: Adam at their defaults). The context gives
  // a data-parallel rank's collective group (bench --gpus) and the seed of its random data
  // is 1 + its rank.
  BenchStep (*bench)(const TrainConfig&, const TaskContext&);
};

const std::vector<TaskEntry>& task_entries();
const TaskEntry& task_entry(const std::string& model);  // kiln::Error for an unknown model

// The entries, one per task file.
TaskEntry classifier_task();
TaskEntry gan_task();
TaskEntry language_model_task();

}  // namespace kiln
