// Text reading, the character vocabulary, and windows of tokens.
#include "data/text_dataset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/input_file.h"
#include "core/philox.h"

namespace kiln {

bool in_vocabulary(char c) { return c == '\n' || (c >= 32 && c <= 126); }

std::uint8_t token_of(char c) {
  KILN_ASSERT(in_vocabulary(c), "character {} is outside the vocabulary", static_cast<int>(c));
  return c == '\n' ? std::uint8_t{95} : static_cast<std::uint8_t>(c - 32);
}

char char_of(std::int64_t token) {
  KILN_CHECK(token >= 0 && token < kVocabulary, "token {} is outside the vocabulary [0, {})", token,
             kVocabulary);
  return token == 95 ? '\n' : static_cast<char>(token + 32);
}

std::string normalize_text(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\t') c = ' ';
    if (in_vocabulary(c)) out += c;
  }
  return out;
}

namespace {

// A text is a regular file (a FIFO or a device such as /dev/urandom is refused before it is read)
// of at most 1 GiB.
constexpr std::uint64_t kMaxTextBytes = std::uint64_t{1} << 30;

std::string read_bytes(const std::filesystem::path& path) {
  return read_regular_file(path, kMaxTextBytes, "a text (at most 1 GiB)");
}

// Entries of one fortune file, appended to `out` each after a blank line.
void append_fortunes(const std::string& text, std::string& out, std::int64_t& entries) {
  std::istringstream lines(text);
  std::string line, entry;
  auto flush = [&] {
    if (entry.find_first_not_of(" \n") == std::string::npos) return entry.clear();
    if (!out.empty()) out += '\n';
    out += entry;
    ++entries;
    entry.clear();
  };
  while (std::getline(lines, line)) {
    if (line == "%")
      flush();
    else
      entry += line + '\n';
  }
  flush();
}

}  // namespace

std::string read_text_file(const std::string& path) {
  KILN_CHECK(std::filesystem::exists(path), "text file {} does not exist", path);
  KILN_CHECK(!std::filesystem::is_directory(path), "text file {} is a directory", path);
  const std::string text = normalize_text(read_bytes(path));
  KILN_CHECK(
      !text.empty(),
      "text file {} is empty (no characters of the vocabulary: printable ASCII and newlines)",
      path);
  return text;
}

std::string read_fortunes(const std::string& dir) {
  KILN_CHECK(std::filesystem::is_directory(dir),
             "fortunes directory {} does not exist (install Debian's 'fortunes' package, or pass "
             "--text FILE)",
             dir);
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.is_regular_file() && !entry.path().has_extension()) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  std::string out;
  std::int64_t entries = 0;
  for (const auto& file : files) append_fortunes(normalize_text(read_bytes(file)), out, entries);
  KILN_CHECK(entries > 0, "fortunes directory {} holds no fortunes ({} files without an extension)",
             dir, files.size());
  return out;
}

TextCorpus load_text_corpus(const std::string& path, std::int64_t min_part) {
  TextCorpus corpus{path.empty() ? kFortunesDir : path, {}, {}};
  // A directory is read as a fortunes-style collection (entries between "%" lines).
  const std::string text = path.empty()                          ? read_fortunes()
                           : std::filesystem::is_directory(path) ? read_fortunes(path)
                                                                 : read_text_file(path);
  const auto size = static_cast<std::int64_t>(text.size());
  const std::int64_t validation = size / 20;
  KILN_CHECK(validation >= min_part && size - validation >= min_part,
             "{} has {} characters: too few for a validation part of 5% ({}) and a training part "
             "({}) of at least {} each "
             "(one window of seq_len + 1)",
             corpus.source, size, validation, size - validation, min_part);
  for (std::int64_t i = 0; i < size; ++i)
    (i < size - validation ? corpus.train : corpus.validation)
        .push_back(token_of(text[static_cast<std::size_t>(i)]));
  return corpus;
}

TextBatcher::TextBatcher(const std::vector<std::uint8_t>& tokens, std::int64_t batch,
                         std::int64_t seq_len, std::uint64_t seed, int rank, int ranks)
    : tokens_(tokens), batch_(batch), seq_len_(seq_len), seed_(seed), rank_(rank), ranks_(ranks) {
  KILN_CHECK(static_cast<std::int64_t>(tokens.size()) >= seq_len + 1,
             "text of {} tokens is shorter than one window of {}", tokens.size(), seq_len + 1);
}

void TextBatcher::fill(std::int64_t step, Tensor& inputs, Tensor& targets) const {
  KILN_ASSERT(inputs.shape() == Shape({seq_len_, batch_}) && targets.shape() == inputs.shape(),
              "text batch of {}", inputs.shape().str());
  // One Philox block per window, at a stream offset that depends only on the step.
  Philox rng(seed_, static_cast<std::uint64_t>((step * ranks_ + rank_) * batch_));
  const auto starts =
      static_cast<std::uint64_t>(tokens_.size()) - static_cast<std::uint64_t>(seq_len_);
  std::int64_t* x = inputs.data<std::int64_t>();
  std::int64_t* y = targets.data<std::int64_t>();
  for (std::int64_t b = 0; b < batch_; ++b) {
    const auto start = static_cast<std::int64_t>(rng.next_below(starts));
    for (std::int64_t t = 0; t < seq_len_; ++t) {
      x[t * batch_ + b] = tokens_[static_cast<std::size_t>(start + t)];
      y[t * batch_ + b] = tokens_[static_cast<std::size_t>(start + t + 1)];
    }
  }
}

TextWindows::TextWindows(const std::vector<std::uint8_t>& tokens, std::int64_t seq_len)
    : tokens_(tokens), seq_len_(seq_len) {}

std::int64_t TextWindows::windows() const {
  return (static_cast<std::int64_t>(tokens_.size()) - 1) / seq_len_;
}

void TextWindows::fill(std::int64_t index, Tensor& inputs, Tensor& targets) const {
  const std::int64_t batch = inputs.shape()[1];
  KILN_ASSERT((index + 1) * batch <= windows(), "text windows: batch {} of {} windows", index,
              windows());
  std::int64_t* x = inputs.data<std::int64_t>();
  std::int64_t* y = targets.data<std::int64_t>();
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t start = (index * batch + b) * seq_len_;
    for (std::int64_t t = 0; t < seq_len_; ++t) {
      x[t * batch + b] = tokens_[static_cast<std::size_t>(start + t)];
      y[t * batch + b] = tokens_[static_cast<std::size_t>(start + t + 1)];
    }
  }
}

}  // namespace kiln
