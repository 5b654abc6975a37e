#include "tokenizer/text.h"

#include <algorithm>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "core/error.h"

namespace deepinfer::text {

namespace {

// Length of the valid UTF-8 sequence at value[i], or 0 when it is not one.
size_t valid_sequence(std::string_view value, size_t i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(value[k]); };
  unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  size_t length = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc2 ? 2 : 0;
  if (length == 0 || lead > 0xf4 || i + length > value.size()) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
  }
  unsigned char second = byte(i + 1);
  if (lead == 0xe0 && second < 0xa0) return 0;  // overlong
  if (lead == 0xed && second > 0x9f) return 0;  // surrogates
  if (lead == 0xf0 && second < 0x90) return 0;  // overlong
  if (lead == 0xf4 && second > 0x8f) return 0;  // above U+10FFFF
  return length;
}

}  // namespace

bool is_valid_utf8(std::string_view value) {
  for (size_t i = 0; i < value.size();) {
    size_t length = valid_sequence(value, i);
    if (length == 0) return false;
    i += length;
  }
  return true;
}

void check_utf8(std::string_view value, const char* what) {
  for (size_t i = 0; i < value.size();) {
    size_t length = valid_sequence(value, i);
    if (length == 0) fail("{} is not valid UTF-8 (byte {})", what, i);
    i += length;
  }
}

int utf8_length(unsigned char lead) {
  if (lead < 0xc0) return 1;
  if (lead < 0xe0) return 2;
  if (lead < 0xf0) return 3;
  return 4;
}

char32_t code_point_at(std::string_view value, size_t offset) {
  auto byte = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(value[k])); };
  char32_t lead = byte(offset);
  switch (utf8_length(static_cast<unsigned char>(lead))) {
    case 1:
      return lead;
    case 2:
      return (lead & 0x1f) << 6 | (byte(offset + 1) & 0x3f);
    case 3:
      return (lead & 0x0f) << 12 | (byte(offset + 1) & 0x3f) << 6 | (byte(offset + 2) & 0x3f);
    default:
      return (lead & 0x07) << 18 | (byte(offset + 1) & 0x3f) << 12 |
             (byte(offset + 2) & 0x3f) << 6 | (byte(offset + 3) & 0x3f);
  }
}

std::string utf8_encode(char32_t c) {
  std::string out;
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xc0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xe0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  }
  return out;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    size_t length = valid_sequence(bytes, i);
    if (length > 0) {
      out.append(bytes.substr(i, length));
      i += length;
      continue;
    }
    // One U+FFFD per maximal prefix of a valid sequence, as Rust's from_utf8_lossy does.
    auto lead = static_cast<unsigned char>(bytes[i]);
    size_t expected = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc2 ? 2 : 1;
    if (lead > 0xf4) expected = 1;
    size_t k = 1;
    for (; k < expected && i + k < bytes.size(); ++k) {
      auto next = static_cast<unsigned char>(bytes[i + k]);
      unsigned char low = 0x80, high = 0xbf;
      if (k == 1 && lead == 0xe0) low = 0xa0;
      if (k == 1 && lead == 0xed) high = 0x9f;
      if (k == 1 && lead == 0xf0) low = 0x90;
      if (k == 1 && lead == 0xf4) high = 0x8f;
      if (next < low || next > high) break;
    }
    out += "\xef\xbf\xbd";
    i += k;
  }
  return out;
}

bool is_whitespace(char32_t c) {
  return u_isUWhiteSpace(static_cast<UChar32>(c));
}

bool is_alphanumeric(char32_t c) {
  auto code = static_cast<UChar32>(c);
  return u_hasBinaryProperty(code, UCHAR_ALPHABETIC) || (U_GET_GC_MASK(code) & U_GC_N_MASK) != 0;
}

bool is_punctuation(char32_t c) {
  if (c < 0x80)
    return (c >= 0x21 && c <= 0x2f) || (c >= 0x3a && c <= 0x40) || (c >= 0x5b && c <= 0x60) ||
           (c >= 0x7b && c <= 0x7e);
  return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_P_MASK) != 0;
}

bool is_digit(char32_t c) {
  return u_charType(static_cast<UChar32>(c)) == U_DECIMAL_DIGIT_NUMBER;
}

std::string normalize(std::string_view value, NormalForm form) {
  // ASCII text is in every normal form.
  if (std::all_of(value.begin(), value.end(), [](char ch) { return (ch & 0x80) == 0; }))
    return std::string(value);
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = nullptr;
  switch (form) {
    case NormalForm::kNfc:
      normalizer = icu::Normalizer2::getNFCInstance(status);
      break;
    case NormalForm::kNfd:
      normalizer = icu::Normalizer2::getNFDInstance(status);
      break;
    case NormalForm::kNfkc:
      normalizer = icu::Normalizer2::getNFKCInstance(status);
      break;
    case NormalForm::kNfkd:
      normalizer = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  if (U_FAILURE(status)) fail("Unicode normalizer unavailable: {}", u_errorName(status));
  icu::UnicodeString input = icu::UnicodeString::fromUTF8(
      icu::StringPiece(value.data(), static_cast<int32_t>(value.size())));
  if (normalizer->isNormalized(input, status) && U_SUCCESS(status)) return std::string(value);
  icu::UnicodeString output = normalizer->normalize(input, status);
  if (U_FAILURE(status)) fail("Unicode normalization failed: {}", u_errorName(status));
  std::string result;
  output.toUTF8String(result);
  return result;
}

std::string lowercase(std::string_view value) {
  icu::UnicodeString text = icu::UnicodeString::fromUTF8(
      icu::StringPiece(value.data(), static_cast<int32_t>(value.size())));
  text.toLower(icu::Locale::getRoot());
  std::string result;
  text.toUTF8String(result);
  return result;
}

struct Regex::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern) : compiled_(std::make_unique<Compiled>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (compiled_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    fail("regex \"{}\" does not compile at offset {}: {}", pattern, offset,
         reinterpret_cast<const char*>(message));
  }
  pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter
}

Regex::~Regex() = default;

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view subject) const {
  std::vector<std::pair<size_t, size_t>> matches;
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
  size_t start = 0;
  while (start <= subject.size()) {
    int rc = pcre2_match(compiled_->code, reinterpret_cast<PCRE2_SPTR>(subject.data()),
                         subject.size(), start, PCRE2_NO_UTF_CHECK, data, nullptr);
    if (rc < 0) break;
    PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      matches.emplace_back(begin, end);
      start = end;
    } else {
      // Empty match: step over one character.
      start = begin +
              (begin < subject.size()
                   ? static_cast<size_t>(utf8_length(static_cast<unsigned char>(subject[begin])))
                   : 1);
    }
  }
  pcre2_match_data_free(data);
  return matches;
}

}  // namespace deepinfer::text
