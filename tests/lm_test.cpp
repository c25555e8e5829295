// Text data, char-lstm and row-lstm end to end: the vocabulary, the fortunes reader, seeded
// windows, bits per character falling, deterministic sampling, exact resumption, and the
// row-lstm classifier learning Fashion-MNIST.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <cstring>
#include <fstream>

#include "data/dataset.h"
#include "data/text_dataset.h"
#include "train/loop.h"
#include "train/lm_task.h"
#include "train/loop.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// Per process: suites (and other checkouts' suites) may run at the same time.
fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("kiln-lm-test-" + std::to_string(getpid()) + "-" + name);
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// A small text with plenty of structure: ~9000 characters of simple sentences.
fs::path small_text() {
  const fs::path path = temp_path("small.txt");
  const char* subjects[] = {"the cat", "a dog", "my friend", "the old man", "our teacher"};
  const char* verbs[] = {"sees", "likes", "finds", "wants", "takes"};
  const char* objects[] = {"the ball.", "a red hat.", "the big house.", "some bread.",
                           "the green tree."};
  std::string text;
  Philox rng(1);
  while (text.size() < 9000)
    text += std::string(subjects[rng.next_below(5)]) + " " + verbs[rng.next_below(5)] + " " +
            objects[rng.next_below(5)] + "\n";
  write_file(path, text);
  return path;
}

TrainConfig small_lm(const fs::path& text) {
  TrainConfig c;
  c.model = "char-lstm";
  c.lm.text = text.string();
  c.lm.embedding = 16;
  c.lm.hidden = 48;
  c.lm.seq_len = 24;
  c.loop.batch_size = 16;
  c.loop.lr = 1e-2;
  c.loop.progress = false;
  return c;
}

std::vector<Tensor> snapshot(const std::vector<VariablePtr>& params) {
  std::vector<Tensor> out;
  for (const VariablePtr& p : params) out.push_back(p->value.clone());
  return out;
}

}  // namespace

TEST_CASE(
    "the vocabulary: 95 printable characters and newline, tabs become spaces, the rest is "
    "dropped") {
  CHECK(kVocabulary == 96);
  for (int c = 32; c <= 126; ++c)
    CHECK(char_of(token_of(static_cast<char>(c))) == static_cast<char>(c));
  CHECK(token_of('\n') == 95);
  CHECK(char_of(95) == '\n');
  CHECK(normalize_text("a\tb\r\nc\x01 caf\xc3\xa9~") == "a b\nc caf~");
  CHECK_THROWS_WITH_AS(char_of(96), doctest::Contains("token 96 is outside the vocabulary [0, 96)"),
                       Error);
}

TEST_CASE(
    "the fortunes reader: files without an extension, entries between % lines joined by a blank "
    "line") {
  const fs::path dir = temp_path("fortunes");
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_file(dir / "b", "second one\n%\nthird\tline\n");
  write_file(dir / "a", "first\nentry\n%\n%\n");
  write_file(dir / "a.dat", "binary index, skipped");
  write_file(dir / "a.u8", "a copy, skipped");
  CHECK(read_fortunes(dir.string()) == "first\nentry\n\nsecond one\n\nthird line\n");
  fs::remove_all(dir);
  CHECK_THROWS_WITH_AS(read_fortunes(dir.string()), doctest::Contains("does not exist"), Error);
  if (fs::is_directory(kFortunesDir)) {
    const TextCorpus corpus = load_text_corpus("", 65);
    MESSAGE("fortunes: " << corpus.train.size() << " training and " << corpus.validation.size()
                         << " validation characters");
    CHECK(corpus.train.size() > 1000000);
    CHECK(corpus.validation.size() * 19 <= corpus.train.size() + 19);
  }
}

TEST_CASE("text files: missing, empty or too short is a clear error") {
  CHECK_THROWS_WITH_AS(read_text_file("/nonexistent/kiln.txt"),
                       doctest::Contains("text file /nonexistent/kiln.txt does not exist"), Error);
  const fs::path empty = temp_path("empty.txt");
  write_file(empty, "\x01\x02\r");
  CHECK_THROWS_WITH_AS(read_text_file(empty.string()), doctest::Contains("is empty"), Error);
  const fs::path tiny = temp_path("tiny.txt");
  write_file(tiny, std::string(300, 'x'));
  CHECK_THROWS_WITH_AS(load_text_corpus(tiny.string(), 65),
                       doctest::Contains("has 300 characters: too few"), Error);
}

TEST_CASE("random windows depend only on (seed, step), targets are the inputs shifted by one") {
  std::vector<std::uint8_t> tokens;
  for (int i = 0; i < 500; ++i) tokens.push_back(static_cast<std::uint8_t>(i % 90));
  const TextBatcher a(tokens, 4, 8, 7), b(tokens, 4, 8, 7), other(tokens, 4, 8, 8);
  Tensor x1 = Tensor::empty({8, 4}, DType::i64), y1 = x1.clone(), x2 = x1.clone(), y2 = x1.clone();
  a.fill(3, x1, y1);
  b.fill(3, x2, y2);
  CHECK(x1.to_doubles() == x2.to_doubles());
  other.fill(3, x2, y2);
  CHECK(x1.to_doubles() != x2.to_doubles());
  for (std::int64_t t = 0; t < 8; ++t)
    for (std::int64_t n = 0; n < 4; ++n) {
      CHECK(static_cast<int>(y1.at(t * 4 + n)) == (static_cast<int>(x1.at(t * 4 + n)) + 1) % 90);
      if (t > 0) CHECK(x1.at(t * 4 + n) == y1.at((t - 1) * 4 + n));
    }
  const TextWindows windows(tokens, 8);
  CHECK(windows.windows() == 62);
  windows.fill(1, x1, y1);  // windows 4..7
  CHECK(x1.at(0 * 4 + 0) == 32);
  CHECK(y1.at(7 * 4 + 3) == 7 * 8 + 8);
}

TEST_CASE("char-lstm learns: validation bits per character fall clearly over ~100 steps") {
  TrainConfig c = small_lm(small_text());
  c.loop.epochs = 6;  // 8550 training characters / (16 x 24) = 22 steps per epoch
  const std::vector<EpochReport> r = train(c);
  REQUIRE(r.size() == 6);
  for (const EpochReport& e : r)
    MESSAGE("epoch " << e.epoch << ": train " << e.value("bits_per_char") << ", validation "
                     << e.value("validation_bits_per_char"));
  CHECK(r.front().steps == 22);
  CHECK(r.front().value("validation_bits_per_char") < 4.5);  // uniform guessing: log2(96) = 6.58
  CHECK(r.back().value("validation_bits_per_char") <
        r.front().value("validation_bits_per_char") - 1.0);
  CHECK(r.back().value("validation_bits_per_char") < 2.2);
}

TEST_CASE("a resumed char-lstm run equals an uninterrupted one, bit for bit") {
  TrainConfig c = small_lm(small_text());
  c.loop.epochs = 2;  // 44 planned steps, cosine schedule over all of them
  c.loop.max_steps = 30;
  std::vector<Tensor> straight, resumed;
  train(c, {}, [&](const TaskState& state) {
    const std::vector<VariablePtr>& p = state.parameters;
    straight = snapshot(p);
  });
  const fs::path checkpoint = temp_path("resume.safetensors");
  c.loop.max_steps = 13;
  c.loop.checkpoint = checkpoint.string();
  train(c);
  c.loop.max_steps = 30;
  c.loop.checkpoint.clear();
  c.loop.resume = checkpoint.string();
  train(c, {}, [&](const TaskState& state) {
    const std::vector<VariablePtr>& p = state.parameters;
    resumed = snapshot(p);
  });
  REQUIRE(straight.size() == resumed.size());
  for (std::size_t i = 0; i < straight.size(); ++i) {
    CAPTURE(i);
    CHECK(std::memcmp(straight[i].raw(), resumed[i].raw(), straight[i].nbytes()) == 0);
  }
}

TEST_CASE("sampling: deterministic for a seed, only vocabulary characters, the prime first") {
  TrainConfig c = small_lm(small_text());
  c.loop.epochs = 1;
  c.loop.max_steps = 40;
  const fs::path checkpoint = temp_path("sample.safetensors");
  c.loop.checkpoint = checkpoint.string();
  train(c);
  TrainConfig s;
  s.loop.resume =
      checkpoint.string();  // the architecture comes from the checkpoint, not these defaults
  s.lm.sample = 200;
  s.lm.temperature = 0.8;
  s.lm.prime = "the c";
  s.loop.seed = 5;
  const std::string a = sample_language_model(s), b = sample_language_model(s);
  MESSAGE("sample: " << a);
  CHECK(a == b);
  CHECK(a.size() == 205);
  CHECK(a.rfind("the c", 0) == 0);
  for (char ch : a) CHECK(in_vocabulary(ch));
  s.loop.seed = 6;
  CHECK(sample_language_model(s) != a);
  s.loop.resume.clear();
  CHECK_THROWS_WITH_AS(sample_language_model(s), doctest::Contains("--sample needs --resume"),
                       Error);
}

TEST_CASE("char-lstm settings are checked") {
  TrainConfig c = small_lm(small_text());
  c.lm.cell = "gru";
  CHECK_THROWS_WITH_AS(train(c), doctest::Contains("--cell is 'gru' (one of: lstm, rnn)"), Error);
  c.lm.cell = "rnn";
  c.lm.text = "/nonexistent/corpus.txt";
  CHECK_THROWS_WITH_AS(train(c), doctest::Contains("does not exist"), Error);
}

TEST_CASE("a tanh-RNN char model learns too") {
  TrainConfig c = small_lm(small_text());
  c.lm.cell = "rnn";
  c.loop.epochs = 3;
  const std::vector<EpochReport> r = train(c);
  MESSAGE("rnn validation bits per char: " << r.front().value("validation_bits_per_char") << " -> "
                                           << r.back().value("validation_bits_per_char"));
  CHECK(r.back().value("validation_bits_per_char") < 3.0);
}

TEST_CASE("row-lstm learns Fashion-MNIST: 200 Adam steps reach 75% test accuracy") {
  if (!fs::exists(kFashionMnistDir)) {
    MESSAGE("skipped: Fashion-MNIST is not installed at " << kFashionMnistDir);
    return;
  }
  TrainConfig c;
  c.model = "row-lstm";
  c.loop.epochs = 1;
  c.loop.max_steps = 200;
  c.loop.lr = 2e-3;
  c.loop.progress = false;
  const std::vector<EpochReport> r = train(c);
  REQUIRE(r.size() == 1);
  MESSAGE("row-lstm after 200 steps: accuracy " << r[0].value("test_accuracy") << ", loss "
                                                << r[0].loss << ", " << r[0].examples_per_second
                                                << " images/s");
  CHECK(r[0].value("test_accuracy") >= 0.75);
}

}  // namespace kiln
