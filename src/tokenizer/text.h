// Text primitives the tokenizer is built on: UTF-8, Unicode properties and normalization
// (ICU), and regular expressions with look-ahead and Unicode classes (PCRE2 with JIT).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deepinfer::text {

// Throws Error ("<what> is not valid UTF-8 (byte N)") unless `value` is valid UTF-8.
void check_utf8(std::string_view value, const char* what);
bool is_valid_utf8(std::string_view value);
// Byte length of the UTF-8 character starting with `lead` (1 for stray continuation bytes).
int utf8_length(unsigned char lead);
// The code point starting at value[offset] (value must be valid UTF-8).
char32_t code_point_at(std::string_view value, size_t offset);
std::string utf8_encode(char32_t code_point);
// Invalid sequences replaced by U+FFFD, as Rust's from_utf8_lossy does.
std::string utf8_lossy(std::string_view bytes);

bool is_whitespace(char32_t c);    // Unicode White_Space
bool is_alphanumeric(char32_t c);  // letters and numbers (any script)
bool is_punctuation(char32_t c);   // ASCII punctuation or general category P*
bool is_digit(char32_t c);         // general category Nd

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
std::string normalize(std::string_view value, NormalForm form);
std::string lowercase(std::string_view value);

// A compiled pattern. Matching is thread-safe.
class Regex {
 public:
  // Throws Error naming the pattern when PCRE2 rejects it.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Every non-empty, non-overlapping match, left to right, as [begin, end) byte offsets.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view subject) const;

 private:
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace deepinfer::text
