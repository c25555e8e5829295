// Character-level text for language models: a vocabulary of 96 characters, the default
// corpus (Debian's fortunes), a train/validation split and seeded random windows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln {

// Default corpus: the plain-text files of Debian's `fortunes` package.
inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// The vocabulary: printable ASCII 32..126 (tokens 0..94) and '\n' (token 95). Reading text,
// a tab becomes a space and every other character (carriage returns, other control
// characters, bytes of non-ASCII UTF-8 sequences) is dropped.
inline constexpr std::int64_t kVocabulary = 96;
std::uint8_t token_of(char c);     // a character of the vocabulary; KILN_ASSERT otherwise
char char_of(std::int64_t token);  // kiln::Error outside [0, 96)
bool in_vocabulary(char c);
// `text` with tabs as spaces and characters outside the vocabulary dropped.
std::string normalize_text(const std::string& text);

// Reads a text file (normalised); kiln::Error for a missing, unreadable or (after
// normalisation) empty file.
std::string read_text_file(const std::string& path);
// The fortunes corpus in `dir`: every regular file without an extension (not *.dat index
// files nor *.u8 copies), in name order; entries (separated by lines "%") are joined by one
// blank line. kiln::Error when the directory is missing or holds no entries.
std::string read_fortunes(const std::string& dir = kFortunesDir);

struct TextCorpus {
  std::string source;               // the file or directory read
  std::vector<std::uint8_t> train;  // tokens
  std::vector<std::uint8_t> validation;
};

// `path` (a file, a directory of fortunes-style files, or empty for the fortunes corpus) split into
// the first 95% for training and the last 5% for validation. Each part must hold at least
// `min_part` tokens (a window of seq_len + 1): kiln::Error otherwise, naming the sizes.
TextCorpus load_text_corpus(const std::string& path, std::int64_t min_part);

// Batches of random windows of seq_len + 1 tokens: inputs are tokens 0..seq_len-1 and
// targets tokens 1..seq_len of each window. Batch `step` depends only on (seed, step), so a
// resumed run sees the same data. Tensors are i64 and time-major: [seq_len, batch].
// Data parallelism: with `ranks` > 1 a step's global batch is batch * ranks windows and rank
// `rank` gets windows [rank * batch, (rank + 1) * batch) of it, so the ranks together see
// the windows one process with the global batch would.
class TextBatcher {
 public:
  TextBatcher(const std::vector<std::uint8_t>& tokens, std::int64_t batch, std::int64_t seq_len,
              std::uint64_t seed, int rank = 0, int ranks = 1);
  void fill(std::int64_t step, Tensor& inputs, Tensor& targets) const;

 private:
  const std::vector<std::uint8_t>& tokens_;
  std::int64_t batch_, seq_len_;
  std::uint64_t seed_;
  int rank_, ranks_;
};

// Consecutive non-overlapping windows of `tokens` for evaluation: window w covers tokens
// [w * seq_len, (w + 1) * seq_len + 1). Batch `index` holds windows index * batch onwards.
class TextWindows {
 public:
  TextWindows(const std::vector<std::uint8_t>& tokens, std::int64_t seq_len);
  std::int64_t windows() const;
  void fill(std::int64_t index, Tensor& inputs, Tensor& targets) const;  // batch from inputs' shape

 private:
  const std::vector<std::uint8_t>& tokens_;
  std::int64_t seq_len_;
};

}  // namespace kiln
