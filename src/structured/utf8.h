// Well-formed UTF-8 (RFC 3629), read a byte at a time: JSON text is UTF-8, so a string may
// not hold a stray continuation byte, an overlong form, a surrogate or a character cut off by
// its closing quote. A byte-level vocabulary has tokens that are such fragments.
#pragma once

#include <cstdint>
#include <string_view>

namespace deepinfer::structured {

// The state after `c` from `state` (0: between characters; 1-3: that many continuation bytes
// still to come; 4-7: after E0, ED, F0 or F4, whose next byte has a narrower range), or -1
// when `c` cannot come there.
inline int utf8_next(int state, uint8_t c) {
  switch (state) {
    case 0:
      if (c < 0x80) return 0;
      if (c >= 0xC2 && c <= 0xDF) return 1;
      if (c == 0xE0) return 4;
      if (c == 0xED) return 5;
      if (c >= 0xE1 && c <= 0xEF) return 2;
      if (c == 0xF0) return 6;
      if (c >= 0xF1 && c <= 0xF3) return 3;
      if (c == 0xF4) return 7;
      return -1;
    case 1:
    case 2:
    case 3:
      return (c & 0xC0) == 0x80 ? state - 1 : -1;
    case 4:
      return c >= 0xA0 && c <= 0xBF ? 1 : -1;
    case 5:
      return c >= 0x80 && c <= 0x9F ? 1 : -1;
    case 6:
      return c >= 0x90 && c <= 0xBF ? 2 : -1;
    case 7:
      return c >= 0x80 && c <= 0x8F ? 2 : -1;
    default:
      return -1;
  }
}

// Well formed from a character boundary on, the last character possibly cut off: a token that
// can follow whole characters inside a JSON string.
inline bool utf8_from_boundary(std::string_view text) {
  int state = 0;
  for (char c : text)
    if ((state = utf8_next(state, static_cast<uint8_t>(c))) < 0) return false;
  return true;
}

}  // namespace deepinfer::structured
