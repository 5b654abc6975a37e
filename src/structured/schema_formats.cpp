// String formats as regular languages, and any regular language as it is written inside a
// JSON string. A format's language is a subset of what its RFC allows (one spelling where
// several mean the same, e.g. no IPv4 tail inside IPv6): whatever the model writes is valid.
#include <map>

#include "structured/json_schema.h"

namespace deepinfer::structured {
namespace {

// Days as each month has them; 29 February in leap years only.
constexpr const char* kDate =
    R"((?:\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|)"
    R"(02-(?:0[1-9]|1\d|2[0-8]))|(?:\d\d(?:0[48]|[2468][048]|[13579][26])|)"
    R"((?:[02468][048]|[13579][26])00)-02-29))";
// A leap second only as 23:59:60 UTC (written with a zero offset).
constexpr const char* kTime =
    R"((?:(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,9})?(?:[Zz]|[+-](?:[01]\d|2[0-3]):[0-5]\d)|)"
    R"(23:59:60(?:\.\d{1,9})?(?:[Zz]|[+-]00:00)))";
// A label of up to 63 letters, digits and inner hyphens, never with hyphens third and fourth
// (reserved for A-labels such as "xn--", whose punycode we do not check).
constexpr const char* kHostLabel =
    R"((?:[A-Za-z0-9]{1,2}|[A-Za-z0-9][A-Za-z0-9-][A-Za-z0-9]|)"
    R"([A-Za-z0-9][A-Za-z0-9-](?:[A-Za-z0-9]{2}|-[A-Za-z0-9])(?:[A-Za-z0-9-]{0,58}[A-Za-z0-9])?|)"
    R"([A-Za-z0-9][A-Za-z0-9-][A-Za-z0-9]-[A-Za-z0-9-]{0,58}[A-Za-z0-9]))";
constexpr const char* kHex4 = "[0-9a-fA-F]{1,4}";
constexpr const char* kOctet = R"((?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))";
// RFC 3986's pieces: path characters, query and fragment characters, the authority.
constexpr const char* kPathChar = R"((?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2}))";
constexpr const char* kRegNameChar = R"((?:[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2}))";
std::string hostname() {
  return fmt::format(R"({0}(?:\.{0})*)", kHostLabel);
}

std::string ipv6() {
  const std::string h = kHex4;
  std::vector<std::string> forms = {
      fmt::format("(?:{0}:){{7}}{0}", h),
      fmt::format("(?:{0}:){{1,7}}:", h),
      fmt::format("(?:{0}:){{1,6}}:{0}", h),
      fmt::format("(?:{0}:){{1,5}}(?::{0}){{1,2}}", h),
      fmt::format("(?:{0}:){{1,4}}(?::{0}){{1,3}}", h),
      fmt::format("(?:{0}:){{1,3}}(?::{0}){{1,4}}", h),
      fmt::format("(?:{0}:){{1,2}}(?::{0}){{1,5}}", h),
      fmt::format("{0}:(?::{0}){{1,6}}", h),
      fmt::format(":(?:(?::{0}){{1,7}}|:)", h),
  };
  return fmt::format("(?:{})", fmt::join(forms, "|"));
}

// [userinfo@]host[:port]: the host a registered name, an IPv4 address or a bracketed IPv6 one.
std::string authority() {
  return fmt::format(R"((?:(?:{0}|:)*@)?(?:\[{1}\]|{0}*)(?::\d*)?)", kRegNameChar, ipv6());
}

// The path, query and fragment after a scheme or in a relative reference; `first` is what the
// first segment of a rootless path may hold.
std::string path_query_fragment(const std::string& first) {
  const std::string p = kPathChar;
  return fmt::format(R"((?://{0}(?:/{1}*)*|/(?:{1}+(?:/{1}*)*)?|{2}+(?:/{1}*)*)?)"
                     R"((?:\?(?:{1}|[/?])*)?(?:#(?:{1}|[/?])*)?)",
                     authority(), p, first);
}

std::string uri() {
  return fmt::format(R"([A-Za-z][A-Za-z0-9+.\-]*:{})", path_query_fragment(kPathChar));
}

// A relative reference's first segment holds no ':' (it would read as a scheme).
std::string relative_reference() {
  return path_query_fragment(R"((?:[A-Za-z0-9\-._~!$&'()*+,;=@]|%[0-9A-Fa-f]{2}))");
}

const std::map<std::string, std::string, std::less<>>& formats() {
  static const std::map<std::string, std::string, std::less<>> patterns = {
      {"date", kDate},
      {"time", kTime},
      {"date-time", fmt::format("{}[Tt]{}", kDate, kTime)},
      // RFC 3339's ABNF: each unit only after the next larger one, whole numbers.
      {"duration",
       R"(P(?:(?:\d+D|\d+M(?:\d+D)?|\d+Y(?:\d+M(?:\d+D)?)?)(?:T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S))?|)"
       R"(T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S)|\d+W))"},
      {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
      {"email",
       fmt::format(
           R"([A-Za-z0-9!#$%&'*+/=?^_`{{|}}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{{|}}~-]+)*@{})",
           hostname())},
      {"hostname", hostname()},
      {"ipv4", fmt::format(R"({0}(?:\.{0}){{3}})", kOctet)},
      {"ipv6", ipv6()},
      {"uri", uri()},
      {"uri-reference", fmt::format("(?:{}|{})", uri(), relative_reference())},
      {"byte", "(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"},
      {"json-pointer", "(?:/(?:[^~/]|~[01])*)*"},
      {"relative-json-pointer", "(?:0|[1-9][0-9]*)(?:#|(?:/(?:[^~/]|~[01])*)*)"},
  };
  return patterns;
}

// Control characters with a short escape; the others are written \u00XX.
char short_escape(uint32_t code) {
  switch (code) {
    case '"':
      return '"';
    case '\\':
      return '\\';
    case '\b':
      return 'b';
    case '\f':
      return 'f';
    case '\n':
      return 'n';
    case '\r':
      return 'r';
    case '\t':
      return 't';
    default:
      return 0;
  }
}

bool needs_escape(uint32_t code) {
  return code < 0x20 || code == '"' || code == '\\';
}

class Escaper {
 public:
  explicit Escaper(const RegexTree& from) : from_(from), mapped_(from.nodes.size(), -1) {}

  RegexTree run() {
    out_.root = map(from_.root);
    return std::move(out_);
  }

 private:
  int map(int index) {
    if (mapped_[static_cast<size_t>(index)] >= 0) return mapped_[static_cast<size_t>(index)];
    const RegexNode& node = from_.nodes[static_cast<size_t>(index)];
    int result;
    if (node.kind == RegexNode::Kind::kChars) {
      result = escaped_chars(node.chars);
    } else {
      RegexNode copy = node;
      for (int& child : copy.children) child = map(child);
      result = out_.add(std::move(copy));
    }
    mapped_[static_cast<size_t>(index)] = result;
    return result;
  }

  // The characters that need no escape as they are, the others as their escapes.
  int escaped_chars(const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
    RegexNode plain;
    plain.kind = RegexNode::Kind::kChars;
    std::vector<int> escapes;
    for (auto [low, high] : ranges) {
      uint32_t at = low;
      while (at <= high) {
        if (needs_escape(at)) {
          const char letter = short_escape(at);
          escapes.push_back(
              out_.literal(letter ? std::string{'\\', letter} : fmt::format("\\u{:04x}", at)));
          ++at;
          continue;
        }
        uint32_t end = at;
        while (end < high && !needs_escape(end + 1)) ++end;
        plain.chars.emplace_back(at, end);
        if (end == high) break;
        at = end + 1;
      }
    }
    if (escapes.empty()) return out_.add(std::move(plain));
    RegexNode options;
    options.kind = RegexNode::Kind::kAlternation;
    if (!plain.chars.empty()) options.children.push_back(out_.add(std::move(plain)));
    options.children.insert(options.children.end(), escapes.begin(), escapes.end());
    return out_.add(std::move(options));
  }

  const RegexTree& from_;
  std::vector<int> mapped_;
  RegexTree out_;
};

int chars_node(RegexTree& tree, std::vector<std::pair<uint32_t, uint32_t>> ranges) {
  RegexNode node;
  node.kind = RegexNode::Kind::kChars;
  node.chars = std::move(ranges);
  return tree.add(std::move(node));
}

// "\u" and four hex digits, letters in either case.
int unicode_escape(RegexTree& tree, uint32_t unit) {
  RegexNode concat;
  concat.kind = RegexNode::Kind::kConcat;
  concat.children = {tree.literal("\\u")};
  for (int shift = 12; shift >= 0; shift -= 4) {
    const uint32_t digit = (unit >> shift) & 0xF;
    const uint32_t lower = digit < 10 ? '0' + digit : 'a' + digit - 10;
    std::vector<std::pair<uint32_t, uint32_t>> ranges{{lower, lower}};
    if (digit >= 10) ranges.insert(ranges.begin(), {lower - 32, lower - 32});
    concat.children.push_back(chars_node(tree, std::move(ranges)));
  }
  return tree.add(std::move(concat));
}

int spellings_of(RegexTree& tree, uint32_t code) {
  RegexNode options;
  options.kind = RegexNode::Kind::kAlternation;
  if (!needs_escape(code)) options.children.push_back(chars_node(tree, {{code, code}}));
  if (const char letter = short_escape(code))
    options.children.push_back(tree.literal(std::string{'\\', letter}));
  if (code == '/') options.children.push_back(tree.literal("\\/"));
  if (code <= 0xFFFF) {
    options.children.push_back(unicode_escape(tree, code));
  } else {
    RegexNode pair;
    pair.kind = RegexNode::Kind::kConcat;
    pair.children = {unicode_escape(tree, 0xD800 + ((code - 0x10000) >> 10)),
                     unicode_escape(tree, 0xDC00 + ((code - 0x10000) & 0x3FF))};
    options.children.push_back(tree.add(std::move(pair)));
  }
  return tree.add(std::move(options));
}

}  // namespace

RegexTree json_spellings(const std::vector<std::string>& strings) {
  RegexTree tree;
  RegexNode options;
  options.kind = RegexNode::Kind::kAlternation;
  for (const std::string& text : strings) {
    RegexNode concat;
    concat.kind = RegexNode::Kind::kConcat;
    concat.children.push_back(tree.literal("\""));
    std::vector<uint32_t> codes;
    if (!decode_utf8(text, codes))
      throw GrammarError("json_schema: a string value is not valid UTF-8");
    for (uint32_t code : codes) concat.children.push_back(spellings_of(tree, code));
    concat.children.push_back(tree.literal("\""));
    options.children.push_back(tree.add(std::move(concat)));
  }
  tree.root = tree.add(std::move(options));
  return tree;
}

std::optional<RegexTree> format_language(std::string_view format) {
  // The internationalised forms hold their ASCII ones: what the model writes is valid.
  static const std::map<std::string, std::string, std::less<>> same_as = {
      {"idn-email", "email"},
      {"idn-hostname", "hostname"},
      {"iri", "uri"},
      {"iri-reference", "uri-reference"}};
  if (auto alias = same_as.find(format); alias != same_as.end()) format = alias->second;
  auto found = formats().find(format);
  if (found == formats().end()) return std::nullopt;
  return RegexTree::parse(found->second);
}

std::optional<int64_t> format_max_length(std::string_view format) {
  // A host name's length, which its automaton (labels of at most 63) does not count.
  if (format == "hostname" || format == "idn-hostname") return 253;
  return std::nullopt;
}

RegexTree json_escaped(const RegexTree& tree) {
  return Escaper(tree).run();
}

}  // namespace deepinfer::structured
