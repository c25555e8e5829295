// The trainer's command line as a function, for programs of your own: register your models
// (models/registry.h, register_classifier), then hand main's arguments to trainer_main, and the
// program is `trainer` with your models among the zoo's (every flag, eval and predict;
// --ranks N starts this same program N times).
//   int main(int argc, char** argv) {
//     kiln::register_classifier({.name = "my-cnn", ...}, build_my_cnn);
//     return kiln::trainer_main(argc, argv);
//   }
// Exit codes: 0 done, 1 a runtime error (bad data, divergence), 2 a bad flag or value.
#pragma once

namespace kiln {

int trainer_main(int argc, char** argv);

}  // namespace kiln
