// kiln's command-line tools as functions, for programs of your own: register your models
// (models/registry.h, register_classifier), then hand main's arguments to one of these, and the
// program is that tool with your models among the zoo's: trainer (every flag, eval and
// predict; --ranks N starts this same program N times), dump (the graphs, fused kernels and
// generated source) or bench (the step's times, also on N ranks).
//   int main(int argc, char** argv) {
//     kiln::register_classifier({.name = "my-cnn", ...}, build_my_cnn);
//     return kiln::trainer_main(argc, argv);
//   }
// Exit codes: 0 done, 1 a runtime error (bad data, divergence), 2 a bad flag or value.
#pragma once

namespace kiln {

int trainer_main(int argc, char** argv);
int dump_main(int argc, char** argv);
int bench_main(int argc, char** argv);

}  // namespace kiln
